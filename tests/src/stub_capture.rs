//! Stream capture on the stub drivers, written once for CUDA and HIP (in
//! the child process, see [`crate::stub`]):
//!
//! - [`capture_rules`]: the stub refuses what the driver refuses while a
//!   stream captures, and the capture is then invalidated (so the stub cannot
//!   silently accept everything): a device malloc in global mode, a free
//!   even in the backend's relaxed mode, an event query, a synchronization
//!   of the capturing stream or of the device, a query of an event
//!   recorded inside the capture, a stream that joined the capture and was
//!   not joined back; the backend's relaxed mode lets a malloc, a page map
//!   and a memory-info call through;
//! - [`graph_like_torch`]: what `torch.cuda.graph` does, through the
//!   thread-safe allocator (the C library's front end), with and without
//!   expandable segments: warm-up on a side stream, `empty_cache`,
//!   `capture_begin` before the runtime begins capturing, allocations
//!   (new segments included), frees, `record_stream` and a deferred free
//!   inside the capture, the runtime ending it, `capture_end`, replays,
//!   `release_pool`, `empty_cache`; the capture is never invalidated and
//!   the stub ends clean;
//! - [`capture_graph_markers`]: the backend's reading of the graph a capture
//!   builds (`graph_capture_record_stream_reuse`), through its trait methods
//!   on the stub's graph nodes: a free marker over two streams of a capture
//!   is reached from one of them only once its work follows the other's
//!   (joined back), a stream outside the capture gives no marker, the
//!   walks' record goes when the last capture ends, and an invalidated
//!   capture is an error value.

use crate::gpu::{GpuApi, StreamOf};
use crate::stub::Stub;
use crate::stub_suite::assert_clean;
use cachealloc_core::SharedAllocator;
use cachealloc_core::{
    BlockSlot, CachingAllocator, Config, DeviceAllocator, DeviceBackend, EventStatus, MallocError,
    MempoolId, StreamFilter, NO_MARKER,
};

/// `r` failed with the driver's "capture unsupported" (900).
fn refused<T, E: std::fmt::Debug + std::fmt::Display>(r: Result<T, E>, what: &str) {
    match r {
        Ok(_) => panic!("{what}: accepted during a capture"),
        Err(e) => assert!(e.to_string().contains("(900)"), "{what}: {e}"),
    }
}

/// Ending the capture of `s` reports it invalidated.
fn ends_invalidated<G: GpuApi>(b: &G::B, s: StreamOf<G>, what: &str) {
    let e = G::end_capture(b, s).expect_err(what);
    assert!(e.to_lowercase().contains("invalidated"), "{what}: {e}");
}

/// The stub's capture rules, each shown refusing a call and invalidating the
/// capture, and the relaxed mode letting the allocator's calls through.
pub fn capture_rules<G: GpuApi>(stub: &Stub) {
    let mut b = G::open(0).expect("device 0");
    G::make_current(&b).expect("current");
    let s = G::create_stream(&b).expect("stream");
    let two = 2u64 << 20;

    // A device malloc in the default (global) mode: refused, invalidated.
    G::begin_capture(&b, s).expect("begin");
    match b.malloc(two) {
        Err(MallocError::Other(e)) => assert!(e.to_string().contains("(900)"), "{e}"),
        r => panic!("a malloc during a global capture: {r:?}"),
    }
    assert_eq!(stub.counters().capture_violations, 1);
    ends_invalidated::<G>(&b, s, "after a malloc in global mode");

    // The backend told a capture is under way: malloc and memory info run
    // in relaxed mode, and the capture survives.
    G::begin_capture(&b, s).expect("begin");
    b.set_capture_underway(true);
    let p = b.malloc(two).expect("a relaxed malloc");
    b.mem_info().expect("relaxed memory info");
    G::end_capture(&b, s).expect("a relaxed malloc leaves the capture valid");

    // A free is never relaxed: the allocator must not make one.
    G::begin_capture(&b, s).expect("begin");
    refused(b.free(p, two), "a free");
    ends_invalidated::<G>(&b, s, "after a free");

    // An event recorded before the capture: querying it is refused.
    let e = b.event_create().expect("event");
    b.event_record(&e, s).expect("record");
    G::begin_capture(&b, s).expect("begin");
    refused(b.event_query(&e), "an event query");
    ends_invalidated::<G>(&b, s, "after an event query");

    // Synchronizing the capturing stream, or the device, conflicts in any
    // mode.
    G::begin_capture(&b, s).expect("begin");
    refused(
        b.synchronize_stream(s),
        "a synchronization of the capturing stream",
    );
    ends_invalidated::<G>(&b, s, "after a stream synchronization");
    G::begin_capture(&b, s).expect("begin");
    refused(G::synchronize(&b, None), "a device synchronization");
    ends_invalidated::<G>(&b, s, "after a device synchronization");

    // A stream that joined the capture (it waited for an event recorded in
    // it) and was not joined back: the capture ends unjoined, with no graph.
    let s2 = G::create_stream(&b).expect("stream");
    let fork = b.event_create().expect("event");
    G::begin_capture(&b, s).expect("begin");
    b.event_record(&fork, s).expect("record the fork");
    b.stream_wait_event(s2, &fork)
        .expect("the other stream joins");
    let e2 = G::end_capture(&b, s).expect_err("a fork not joined back");
    assert!(
        e2.contains("904") || e2.to_lowercase().contains("unjoined"),
        "{e2}"
    );
    // Joined back: the capture ends with its graph.
    G::begin_capture(&b, s).expect("begin");
    b.event_record(&fork, s).expect("record the fork");
    b.stream_wait_event(s2, &fork)
        .expect("the other stream joins");
    let join = b.event_create().expect("event");
    b.event_record(&join, s2).expect("record the join");
    b.stream_wait_event(s, &join)
        .expect("the origin waits for it");
    G::end_capture(&b, s).expect("joined back");
    for ev in [&fork, &join] {
        b.event_destroy(ev).expect("destroy an event");
    }
    G::destroy_stream(&b, s2).expect("destroy the stream");

    // An event recorded inside a capture is a graph node: querying it is
    // an error (captured event), which does not invalidate the capture.
    G::begin_capture(&b, s).expect("begin");
    b.event_record(&e, s).expect("record into the capture");
    let q = b.event_query(&e).expect_err("a captured event");
    assert!(q.to_string().contains("(907)"), "{q}");
    G::end_capture(&b, s).expect("the capture survives");
    b.set_capture_underway(false);

    // Outside a capture everything works again.
    b.event_record(&e, s).expect("record");
    G::synchronize(&b, Some(s)).expect("synchronize");
    assert_eq!(b.event_query(&e).expect("query"), EventStatus::Ready);
    b.free(p, two).expect("free");
    b.event_destroy(&e).expect("destroy the event");
    G::destroy_stream(&b, s).expect("destroy the stream");
    drop(b);
    let c = stub.counters();
    assert_eq!(c.capture_violations, 5, "{c:?}");
    assert_eq!(
        (c.live_allocations, c.live_captures, c.live_graphs),
        (0, 0, 0)
    );
    // The violations were this test's: start the next one clean.
    stub.reset(2, u64::MAX);
    println!("capture rules: 5 refused calls invalidated their captures; relaxed mallocs did not");
}

type Shared<G> = CachingAllocator<<G as GpuApi>::B, Vec<BlockSlot>, 64>;

/// What `torch.cuda.graph` does, through the thread-safe allocator, under
/// the configuration `conf`; the capture is never invalidated.
pub fn graph_like_torch<G: GpuApi>(stub: &Stub, conf: &str) {
    let b = G::open(0).expect("device 0");
    G::make_current(&b).expect("current");
    let main = G::create_stream(&b).expect("stream");
    let side = G::create_stream(&b).expect("stream");
    let other = G::create_stream(&b).expect("stream");
    let keeper = G::open(0).expect("device 0");
    let a: Shared<G> = CachingAllocator::new(DeviceAllocator::with_events(
        b,
        vec![BlockSlot::VACANT; 4096],
        Config::parse(conf).expect("config"),
    ));
    let (kib, mib) = (1u64 << 10, 1u64 << 20);
    // Warm-up on the side stream (as PyTorch's docs do before capturing),
    // with a block used on another stream and freed: an event pending.
    let w: Vec<_> = [64 * kib, 3 * mib, 30 * mib]
        .iter()
        .map(|&n| a.malloc(n, side).expect("warm-up malloc"))
        .collect();
    let early = a.malloc(5 * mib, main).expect("malloc");
    a.record_stream(early.handle.expect("id"), other)
        .expect("record_stream");
    for x in &w {
        a.free(x.handle.expect("id")).expect("free");
    }
    // torch.cuda.graph.__enter__: synchronize, empty_cache.
    G::synchronize(&keeper, None).expect("synchronize");
    a.empty_cache().expect("empty_cache");
    // A block used on another stream, freed inside the capture: deferred.
    let pre = a.malloc(mib, main).expect("malloc");
    a.record_stream(pre.handle.expect("id"), other)
        .expect("record_stream");
    a.free(early.handle.expect("id"))
        .expect("free with an event pending");

    let graph = MempoolId(1, 0);
    a.capture_begin(graph, StreamFilter::stream(side))
        .expect("capture_begin (beginAllocateToPool)");
    G::begin_capture(&keeper, side).expect("cuStreamBeginCapture");
    // The forward: new segments of the graph's pool (small, large, over
    // 10 MiB), frees and reuse inside it, record_stream on a stream of the
    // capture, a deferred free of the pre-capture block, and a request on
    // another stream (the default pool) while the capture is under way.
    let x1 = a.malloc(4 * kib, side).expect("small, new segment");
    let x2 = a.malloc(3 * mib, side).expect("large, new segment");
    let x3 = a.malloc(12 * mib, side).expect("over 10 MiB, new segment");
    a.record_stream(x2.handle.expect("id"), other)
        .expect("record_stream");
    a.free(x1.handle.expect("id")).expect("free");
    a.free(x2.handle.expect("id"))
        .expect("free of a block another stream used");
    let x4 = a.malloc(2 * kib, side).expect("reuse inside the capture");
    a.free(pre.handle.expect("id"))
        .expect("free of a pre-capture block");
    let elsewhere = a
        .malloc(700 * kib, main)
        .expect("another stream, during the capture");
    a.empty_cache()
        .expect("empty_cache during a capture does nothing");
    assert!(a.with(|a| a.deferred_frees()).expect("deferred") >= 2);
    G::end_capture(&keeper, side).expect("the capture was never invalidated");
    a.capture_end(graph)
        .expect("capture_end (endAllocateToPool)");

    // Replays happen on the device; the allocator only sees the next
    // requests, which settle what the capture deferred.
    for _ in 0..3 {
        let y = a.malloc(4 * kib, main).expect("after the capture");
        a.free(y.handle.expect("id")).expect("free");
    }
    assert_eq!(a.with(|a| a.deferred_frees()).expect("deferred"), 0);
    // CUDAGraph::reset: the graph's tensors die, then releasePool.
    for x in [x3, x4, elsewhere] {
        a.free(x.handle.expect("id")).expect("free");
    }
    a.release_pool(graph).expect("release_pool");
    G::synchronize(&keeper, None).expect("synchronize");
    a.empty_cache().expect("empty_cache");
    a.check_invariants().expect("consistent");
    let mut a = a.into_inner();
    assert!(a.pool_info(graph).is_none(), "the pool is gone");
    assert_eq!(a.release_all().expect("release_all"), 0);
    drop(a);
    for s in [main, side, other] {
        G::destroy_stream(&keeper, s).expect("destroy a stream");
    }
    drop(keeper);
    assert_clean(stub, &format!("graph capture under {conf:?}"));
    println!("graph capture under {conf:?}: captured, never invalidated, clean");
}

/// The backend's free markers and graph walks on the stub's graph nodes:
/// work on `s`, a fork to `s2` and work there, a marker over both; `s`'s
/// walk reaches it only after `s` joined `s2` back and queued more work.
pub fn capture_graph_markers<G: GpuApi>(stub: &Stub) {
    assert!(<G::B as DeviceBackend>::CAPTURE_GRAPH);
    let mut b = G::open(0).expect("device 0");
    G::make_current(&b).expect("current");
    let s = G::create_stream(&b).expect("stream");
    let s2 = G::create_stream(&b).expect("stream");
    let outside = G::create_stream(&b).expect("stream");
    let two = 2u64 << 20;
    let p = b.malloc(two).expect("malloc");
    let fork = b.event_create().expect("event");
    let join = b.event_create().expect("event");

    // No capture: no marker, nothing to walk.
    assert_eq!(
        b.capture_free_marker(&mut [s].into_iter()).expect("marker"),
        None
    );
    assert!(!b.capture_walk(s).expect("walk"));

    G::begin_capture(&b, s).expect("begin");
    b.set_capture_underway(true);
    assert!(
        !b.capture_walk(s).expect("walk"),
        "a capture without work has no terminal node"
    );
    assert_eq!(
        b.capture_free_marker(&mut [s].into_iter()).expect("marker"),
        None,
        "no node: the block waits for the capture's end"
    );
    G::memset(&b, p, 4096, s).expect("work on s");
    b.event_record(&fork, s).expect("record the fork");
    b.stream_wait_event(s2, &fork)
        .expect("s2 joins the capture");
    G::memset(&b, p, 4096, s2).expect("work on s2");
    let m = b
        .capture_free_marker(&mut [s, s2].into_iter())
        .expect("marker")
        .expect("both streams capture");
    assert_ne!(m, NO_MARKER);
    assert!(b.capture_walk(s).expect("walk"));
    assert!(
        !b.capture_marker_reached(s, m),
        "s's next work does not follow s2's yet"
    );
    assert!(b.capture_walk(s2).expect("walk"));
    assert!(
        b.capture_marker_reached(s2, m),
        "s2's next work follows its own and (through the fork) s's"
    );
    let other = b
        .capture_free_marker(&mut [s2].into_iter())
        .expect("marker")
        .expect("s2 captures");
    assert_ne!(other, m, "a fresh number for each marker");
    assert!(!b.capture_marker_reached(s, NO_MARKER), "an unknown marker");

    // Joined back: s's next work follows both streams' work, which s's
    // next walk finds (the last walk's record stands until then).
    b.event_record(&join, s2).expect("record the join");
    b.stream_wait_event(s, &join).expect("s waits for s2");
    assert!(!b.capture_marker_reached(s, m));
    G::memset(&b, p, 4096, s).expect("work on s after the join");
    assert!(b.capture_walk(s).expect("walk"));
    assert!(b.capture_marker_reached(s, m));
    assert!(b.capture_marker_reached(s, other));

    // A stream outside the capture among the marker's: none (the block
    // waits for the capture's end).
    assert_eq!(
        b.capture_free_marker(&mut [s, outside].into_iter())
            .expect("marker"),
        None
    );
    assert!(!b.capture_walk(outside).expect("walk"));
    assert!(
        !b.capture_marker_reached(outside, m),
        "never walked in a capture"
    );

    G::end_capture(&b, s).expect("joined back: the capture ends valid");
    b.set_capture_underway(false);
    assert!(!b.capture_walk(s).expect("walk"), "s no longer captures");
    assert!(!b.capture_marker_reached(s, m));
    assert!(
        !b.capture_marker_reached(s2, m),
        "the walks' record went with the last capture"
    );
    b.capture_marker_drop(m);
    b.capture_marker_drop(other);
    b.capture_marker_drop(m); // gone already: nothing happens
    assert_clean_but_alive(stub);

    // An invalidated capture: the backend says so with an error value.
    G::begin_capture(&b, s).expect("begin");
    b.set_capture_underway(true);
    G::memset(&b, p, 4096, s).expect("work on s");
    refused(G::synchronize(&b, None), "a device synchronization");
    let e = b
        .capture_free_marker(&mut [s].into_iter())
        .expect_err("an invalidated capture");
    assert!(e.to_string().contains("(901)"), "{e}");
    let e = b.capture_walk(s).expect_err("an invalidated capture");
    assert!(e.to_string().contains("(901)"), "{e}");
    ends_invalidated::<G>(&b, s, "after a device synchronization");
    b.set_capture_underway(false);

    b.free(p, two).expect("free");
    for ev in [&fork, &join] {
        b.event_destroy(ev).expect("destroy an event");
    }
    for st in [s, s2, outside] {
        G::destroy_stream(&b, st).expect("destroy a stream");
    }
    drop(b);
    let mut c = stub.counters();
    assert_eq!(c.capture_violations, 1, "{c:?}");
    c.capture_violations = 0;
    assert!(c.clean(), "the stub reports leaks or bad handles: {c:?}");
    // The violation was this test's: start the next one clean.
    stub.reset(2, u64::MAX);
    println!("capture graph markers: reached once joined, none outside a capture, an error when invalidated");
}

/// No bad handle, no capture or graph left, no capture's rule broken (what
/// the test made is still alive).
fn assert_clean_but_alive(stub: &Stub) {
    let c = stub.counters();
    assert_eq!(
        (
            c.bad_handles,
            c.live_captures,
            c.live_graphs,
            c.capture_violations
        ),
        (0, 0, 0, 0),
        "{c:?}"
    );
}

/// `graph_capture_record_stream_reuse:True` through the thread-safe
/// allocator, in `torch.cuda.graph`'s order: a block of the graph's pool
/// used by a forked stream and freed during the capture waits while the
/// fork's work is not joined back, and the next request on the capture
/// stream after the join takes it; the capture is never invalidated and
/// the stub ends clean.
pub fn graph_reuse_like_torch<G: GpuApi>(stub: &Stub) {
    let b = G::open(0).expect("device 0");
    G::make_current(&b).expect("current");
    let side = G::create_stream(&b).expect("stream");
    let fork_stream = G::create_stream(&b).expect("stream");
    let mut keeper = G::open(0).expect("device 0");
    let a: Shared<G> = CachingAllocator::new(DeviceAllocator::with_events(
        b,
        vec![BlockSlot::VACANT; 256],
        Config::parse("graph_capture_record_stream_reuse:True").expect("config"),
    ));
    let mib = 1u64 << 20;
    let (fork, join) = (
        keeper.event_create().expect("event"),
        keeper.event_create().expect("event"),
    );
    let graph = MempoolId(1, 0);
    a.capture_begin(graph, StreamFilter::stream(side))
        .expect("capture_begin");
    G::begin_capture(&keeper, side).expect("cuStreamBeginCapture");
    let x = a.malloc(3 * mib, side).expect("malloc");
    G::memset(&keeper, x.ptr, 4096, side).expect("work on the capture stream");
    keeper.event_record(&fork, side).expect("record the fork");
    keeper
        .stream_wait_event(fork_stream, &fork)
        .expect("the other stream joins the capture");
    a.record_stream(x.handle.expect("id"), fork_stream)
        .expect("record_stream");
    G::memset(&keeper, x.ptr, 4096, fork_stream).expect("work on the forked stream");
    a.free(x.handle.expect("id")).expect("free");
    let y = a.malloc(3 * mib, side).expect("malloc");
    assert_ne!(y.ptr, x.ptr, "the forked stream's work may still run");
    keeper
        .event_record(&join, fork_stream)
        .expect("record the join");
    keeper
        .stream_wait_event(side, &join)
        .expect("the capture stream waits for it");
    let z = a.malloc(3 * mib, side).expect("malloc");
    assert_eq!(z.ptr, x.ptr, "every later use follows the block's last one");
    assert_eq!(a.with(|a| a.deferred_frees()).expect("deferred"), 0);
    for h in [y, z] {
        a.free(h.handle.expect("id")).expect("free");
    }
    G::end_capture(&keeper, side).expect("the capture was never invalidated");
    a.capture_end(graph).expect("capture_end");
    a.release_pool(graph).expect("release_pool");
    a.empty_cache().expect("empty_cache");
    a.with(|a| a.check_invariants())
        .expect("lock")
        .expect("invariants");
    for ev in [&fork, &join] {
        keeper.event_destroy(ev).expect("destroy an event");
    }
    drop(a);
    for st in [side, fork_stream] {
        G::destroy_stream(&keeper, st).expect("destroy a stream");
    }
    drop(keeper);
    assert_clean(stub, "graph reuse like torch");
    println!("graph reuse like torch: a block freed in the capture reused once joined");
}
