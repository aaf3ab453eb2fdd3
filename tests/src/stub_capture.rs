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
//!   the stub ends clean.

use crate::gpu::{GpuApi, StreamOf};
use crate::stub::Stub;
use crate::stub_suite::assert_clean;
use cachealloc_core::SharedAllocator;
use cachealloc_core::{
    BlockSlot, CachingAllocator, Config, DeviceAllocator, DeviceBackend, EventStatus, MallocError,
    MempoolId, StreamFilter,
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
