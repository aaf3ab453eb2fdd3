//! CUDA-graph capture on the simulated device, which refuses what the
//! drivers refuse while a stream captures (see `backend-mock/src/capture.rs`):
//! while a capture is under way the allocator makes no call that could
//! invalidate it, whatever the request needs (events pending from before,
//! the out-of-memory ladder with every rung that frees, `empty_cache`,
//! expandable segments, the compact policy); the model is shown catching an
//! allocator that is not told of the capture.

use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, Error, MempoolId, PoolOptions, StreamFilter,
};
use cachealloc_mock::{CallKind, CaptureMode, MockDevice, MockError};

const MIB: u64 = 1 << 20;
const GRAPH: MempoolId = MempoolId(1, 0);

type Alloc = DeviceAllocator<MockDevice, Vec<BlockSlot>, 64>;

fn alloc(capacity: Option<u64>, conf: &str) -> Alloc {
    DeviceAllocator::with_events(
        MockDevice::new(capacity),
        vec![BlockSlot::VACANT; 512],
        Config::parse(conf).unwrap(),
    )
}

/// `torch.cuda.graph`'s order: the allocator first, then the runtime.
fn begin(a: &mut Alloc, stream: u64) {
    a.capture_begin(GRAPH, StreamFilter::stream(stream))
        .unwrap();
    a.backend_mut()
        .begin_capture(stream, CaptureMode::Global)
        .unwrap();
}

/// The runtime ends the capture (it must be valid), then the allocator.
fn end(a: &mut Alloc, stream: u64) {
    a.backend_mut()
        .end_capture(stream)
        .expect("the capture was never invalidated");
    a.capture_end(GRAPH).unwrap();
}

/// The model catches an allocator that is not told: routing to a pool
/// without a capture lets `malloc` query a pending event, which the device
/// refuses, and the capture ends invalidated.
#[test]
fn the_device_model_catches_an_event_query_during_a_capture() {
    let mut a = alloc(None, "");
    let x = a.malloc(MIB, 0).unwrap();
    a.record_stream(x.handle.unwrap(), 2).unwrap();
    a.free(x.handle.unwrap()).unwrap(); // an event pending on stream 2
    a.begin_allocate_to_pool(GRAPH, StreamFilter::stream(1))
        .unwrap();
    a.backend_mut()
        .begin_capture(1, CaptureMode::Global)
        .unwrap();
    let e = a.malloc(4096, 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Backend(MockError::CaptureViolation {
                kind: CallKind::EventQuery
            })
        ),
        "{e}"
    );
    assert!(matches!(
        a.backend_mut().end_capture(1),
        Err(MockError::CaptureInvalidated {
            by: CallKind::EventQuery
        })
    ));
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.check_invariants().unwrap();
}

/// Events pending from before the capture, requests on other streams, a
/// request that needs every rung of the ladder (garbage collection, the
/// oversize rung, the flush) and fails, `empty_cache`, a freeable pool's
/// `empty_cache`, `release_all`: the capture stays valid, the device sees
/// no free, and afterwards everything is released as usual.
#[test]
fn no_call_of_the_allocator_invalidates_a_capture() {
    let mut a = alloc(
        Some(256 * MIB),
        "max_split_size_mb:64,garbage_collection_threshold:0.5",
    );
    // Cached oversize and ordinary segments, a pending free, a freeable pool.
    let big = a.malloc(80 * MIB, 0).unwrap();
    let mid = a.malloc(30 * MIB, 0).unwrap();
    let used = a.malloc(MIB, 0).unwrap();
    a.record_stream(used.handle.unwrap(), 2).unwrap();
    a.free(used.handle.unwrap()).unwrap();
    a.free(big.handle.unwrap()).unwrap();
    a.free(mid.handle.unwrap()).unwrap();
    let old = MempoolId(0, 9);
    a.create_pool(old, PoolOptions::NONE).unwrap();
    a.begin_allocate_to_pool(old, StreamFilter::All).unwrap();
    let p = a.malloc(3 * MIB, 0).unwrap();
    a.end_allocate_to_pool(old).unwrap();
    a.free(p.handle.unwrap()).unwrap();
    a.release_pool(old).unwrap(); // the routing's use
    a.release_pool(old).unwrap(); // the MemPool's: freeable, empty_cache would return it
                                  // 132 MiB reserved: a limit of 200 MiB with garbage collection at half.
    a.set_memory_limit(200 * MIB);
    let frees = a.backend().counters().free;

    begin(&mut a, 1);
    // A request on another stream, with the event still pending.
    let other = a.malloc(700 * 1024, 0).unwrap();
    // A request only the rungs that free could serve: out of memory.
    let e = a.malloc(100 * MIB, 1).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let x = a.malloc(2 * MIB, 1).unwrap();
    a.empty_cache().unwrap();
    a.empty_cache_pool(old).unwrap();
    assert!(matches!(
        a.release_all(),
        Err(Error::CaptureUnderway { .. })
    ));
    assert_eq!(a.backend().counters().free, frees, "no device free");
    assert_eq!(a.backend().capture_violations(), 0);
    end(&mut a, 1);

    // After the capture the rungs free again, and the request fits.
    let late = a.malloc(100 * MIB, 1).unwrap();
    assert!(a.backend().counters().free > frees);
    a.free(late.handle.unwrap()).unwrap();
    // The event completes, the caches go back.
    a.backend_mut().sync(None);
    a.free(other.handle.unwrap()).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert!(a.pool_info(old).is_none(), "{:?}", a.pool_info(old));
    assert!(a.pool_info(GRAPH).is_none(), "{:?}", a.pool_info(GRAPH));
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    assert_eq!(a.release_all().unwrap(), 0);
    assert_eq!(a.backend().held_bytes(), 0);
}

/// With expandable segments a capture's pool reserves address space and
/// maps pages (in the backend's relaxed mode); the compact policy neither
/// hands a block of another stream over (the capturing stream would wait on
/// work outside its capture) nor unmaps pages to stay under its mark.
#[test]
fn expandable_segments_and_the_compact_policy_during_a_capture() {
    for conf in [
        "expandable_segments:True",
        "expandable_segments:True,policy:compact",
    ] {
        let mut a = alloc(None, conf);
        // A cached block of stream 2, in the default pool.
        let y = a.malloc(6 * MIB, 2).unwrap();
        a.free(y.handle.unwrap()).unwrap();
        let handovers = a.stream_handovers();
        begin(&mut a, 1);
        let x = a.malloc(5 * MIB, 1).unwrap();
        let z = a.malloc(3 * MIB, 3).unwrap(); // not captured: default pool
        assert_eq!(a.stream_handovers(), handovers, "{conf}: no hand-over");
        end(&mut a, 1);
        assert_eq!(a.backend().capture_violations(), 0, "{conf}");
        a.free(x.handle.unwrap()).unwrap();
        a.free(z.handle.unwrap()).unwrap();
        a.release_pool(GRAPH).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.release_all().unwrap(), 0, "{conf}");
        assert_eq!(a.backend().mapped_pages(), 0, "{conf}");
        assert_eq!(a.backend().live_reservations(), 0, "{conf}");
    }
}

/// The backend is told when the first capture begins and the last ends,
/// not at every one (nested captures into two pools).
#[test]
fn the_backend_is_told_once_per_span_of_captures() {
    let mut a = alloc(None, "");
    let second = MempoolId(2, 0);
    a.capture_begin(GRAPH, StreamFilter::stream(1)).unwrap();
    a.backend_mut()
        .begin_capture(1, CaptureMode::Global)
        .unwrap();
    a.capture_begin(second, StreamFilter::stream(2)).unwrap();
    a.backend_mut()
        .begin_capture(2, CaptureMode::Global)
        .unwrap();
    let x = a.malloc(MIB, 2).unwrap();
    a.backend_mut().end_capture(2).unwrap();
    a.capture_end(second).unwrap();
    // Still relaxed: a capture is under way.
    let y = a.malloc(25 * MIB, 1).unwrap();
    a.backend_mut().end_capture(1).unwrap();
    a.capture_end(GRAPH).unwrap();
    // Not relaxed any more: a runtime capture the allocator does not know
    // of is refused a new segment.
    a.backend_mut()
        .begin_capture(5, CaptureMode::Global)
        .unwrap();
    assert!(a.malloc(40 * MIB, 0).is_err());
    assert!(a.backend_mut().end_capture(5).is_err());
    for z in [x, y] {
        a.free(z.handle.unwrap()).unwrap();
    }
}

/// A segment the allocator cannot keep during a capture (its segment table
/// is full) is not freed then (a device free would invalidate the
/// capture): it goes back to the device when the capture ends. One that
/// overlaps another device's segment in the table is never freed (it is
/// not this device's to free).
#[test]
fn a_refused_segment_goes_back_after_the_capture() {
    use cachealloc_core::{SegmentRegistry, SegmentTable};
    let table: &'static SegmentTable<1> = Box::leak(Box::default());
    let mut a = alloc(None, "");
    a.attach_segment_registry(table, 0).unwrap();
    let x = a.malloc(MIB, 0).unwrap(); // the table's one entry
    begin(&mut a, 1);
    let e = a.malloc(3 * MIB, 1).unwrap_err();
    assert!(matches!(e, Error::SegmentTableFull { capacity: 1 }), "{e}");
    assert_eq!(
        a.backend().counters().free,
        0,
        "no device free during the capture"
    );
    assert_eq!(a.backend().live_segments(), 2, "the refused segment waits");
    end(&mut a, 1);
    assert_eq!(
        a.backend().live_segments(),
        1,
        "given back once the capture ended"
    );
    a.free(x.handle.unwrap()).unwrap();
    a.release_pool(GRAPH).unwrap();
    assert_eq!(a.release_all().unwrap(), 0);
    assert_eq!(a.backend().held_bytes(), 0);

    // Another device's segment where the device puts this one's.
    let table: &'static SegmentTable<8> = Box::leak(Box::default());
    let mut b = alloc(None, "");
    b.attach_segment_registry(table, 0).unwrap();
    table
        .insert(7, cachealloc_mock::DEVICE_BASE, 64 * MIB)
        .unwrap();
    let e = b.malloc(MIB, 0).unwrap_err();
    assert!(matches!(e, Error::BackendContract { .. }), "{e}");
    assert_eq!(
        b.backend().counters().free,
        0,
        "device 7's memory is not freed"
    );
    assert_eq!(table.owner(cachealloc_mock::DEVICE_BASE), Some(7));
    b.check_invariants().unwrap();
}

/// `graph_capture_record_stream_reuse`: a block allocated on the capture
/// stream, used by a forked stream and freed during the capture. Returns
/// the allocator, the freed block's address and the forked stream.
fn freed_after_a_fork(conf: &str) -> (Alloc, u64) {
    let mut a = alloc(None, conf);
    begin(&mut a, 1);
    a.backend_mut().launch(1);
    let x = a.malloc(4 * MIB, 1).unwrap();
    // Stream 2 joins the capture (an event recorded on 1, waited for on 2)
    // and works on the block.
    a.backend_mut().capture_join(2, 1).unwrap();
    a.record_stream(x.handle.unwrap(), 2).unwrap();
    a.backend_mut().launch(2);
    a.backend_mut().launch(1);
    a.free(x.handle.unwrap()).unwrap();
    assert_eq!(a.deferred_frees(), 1);
    a.check_invariants().unwrap();
    (a, x.ptr.0)
}

/// Without the setting, and with it while the forked stream's work is not
/// joined back, the block waits for the capture's end; once the capture
/// stream waits for the fork, the next request on it takes the block, with
/// no event recorded or queried (the capture stays valid).
#[test]
fn a_block_freed_in_a_capture_is_reused_once_the_graph_orders_its_uses() {
    for reuse in [false, true] {
        let conf = if reuse {
            "graph_capture_record_stream_reuse:True"
        } else {
            ""
        };
        let (mut a, freed) = freed_after_a_fork(conf);
        let y = a.malloc(4 * MIB, 1).unwrap();
        assert_ne!(y.ptr.0, freed, "the fork's work may still run: not reused");
        assert_eq!(a.deferred_frees(), 1);

        a.backend_mut().capture_join(1, 2).unwrap(); // joined back
        a.backend_mut().launch(1);
        let z = a.malloc(4 * MIB, 1).unwrap();
        if reuse {
            assert_eq!(z.ptr.0, freed, "the graph orders every later use after it");
            assert_eq!(a.deferred_frees(), 0);
            assert_eq!(a.backend().live_free_markers(), 0);
        } else {
            assert_ne!(z.ptr.0, freed);
            assert_eq!(a.deferred_frees(), 1);
        }
        assert_eq!(a.stats().num_device_alloc, 1, "one segment either way");
        a.check_invariants().unwrap();
        a.free(y.handle.unwrap()).unwrap();
        a.free(z.handle.unwrap()).unwrap();
        end(&mut a, 1);
        let _ = a.malloc(512, 0).unwrap();
        assert_eq!(a.deferred_frees(), 0);
        assert_eq!(a.backend().capture_violations(), 0);
        a.check_invariants().unwrap();
    }
}

/// A request on another stream does not take the block (PyTorch frees
/// only the blocks of the requesting stream), and a block used by a stream
/// outside the capture gets no marker: it waits for the capture's end.
#[test]
fn reuse_needs_the_blocks_stream_and_every_user_in_the_capture() {
    let (mut a, freed) = freed_after_a_fork("graph_capture_record_stream_reuse:True");
    a.backend_mut().capture_join(1, 2).unwrap();
    a.backend_mut().capture_join(3, 1).unwrap(); // stream 3 in the capture, routed to the default pools
    assert!(
        a.backend_mut().capture_join(1, 9).is_err(),
        "the capture may not wait for stream 9's work outside it"
    );
    let other = a.malloc(4 * MIB, 3).unwrap();
    assert_eq!(a.deferred_frees(), 1, "a request on stream 3 leaves it");
    let mine = a.malloc(4 * MIB, 1).unwrap();
    assert_eq!(mine.ptr.0, freed);

    let w = a.malloc(4 * MIB, 1).unwrap();
    a.record_stream(w.handle.unwrap(), 9).unwrap(); // stream 9 is not capturing
    a.free(w.handle.unwrap()).unwrap();
    assert_eq!(a.backend().live_free_markers(), 0, "no marker");
    a.backend_mut().launch(1);
    let v = a.malloc(4 * MIB, 1).unwrap();
    assert_ne!(v.ptr.0, w.ptr.0);
    assert_eq!(a.deferred_frees(), 1);
    for h in [other, mine, v] {
        a.free(h.handle.unwrap()).unwrap();
    }
    end(&mut a, 1);
    a.empty_cache().unwrap();
    assert_eq!(a.deferred_frees(), 0);
    assert_eq!(a.backend().live_free_markers(), 0);
    a.check_invariants().unwrap();
}
