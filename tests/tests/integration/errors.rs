//! Bad input gets a clear error naming the problem and leaves the allocator
//! exactly as it was: double free, stale and foreign handles, unknown and
//! interior pointers, sizes that overflow, metadata exhaustion, a full event
//! queue, an invalid fraction, a backend that breaks its contract.

use cachealloc_core::{
    testing::TinyBackend, BlockSlot, Config, DeviceAllocator, DevicePtr, Error, FreeAccess,
    FreeMemoryCallback, MallocFlags,
};
use cachealloc_mock::MockDevice;
use cachealloc_tests::{allocator, teardown, MockAllocator};
use std::sync::Mutex;

/// Everything observable: stats, the segment/block layout, slot use.
fn state(a: &MockAllocator) -> String {
    let mut s = format!(
        "{:?} slots {} live {} pending {}\n",
        a.stats(),
        a.slots_in_use(),
        a.live_allocations(),
        a.pending_events()
    );
    for seg in a.segments() {
        s += &format!(
            "{:?}\n",
            (seg.address, seg.total_size, seg.stream, seg.pool)
        );
        for b in seg.blocks() {
            s += &format!("  {b:?}\n");
        }
    }
    s
}

fn unchanged<T: std::fmt::Debug>(
    a: &mut MockAllocator,
    f: impl FnOnce(&mut MockAllocator) -> T,
) -> T {
    let before = state(a);
    let r = f(a);
    assert_eq!(
        before,
        state(a),
        "the failed call changed the allocator ({r:?})"
    );
    a.check_invariants().unwrap();
    r
}

#[test]
fn double_free_and_stale_handles() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let x = a.malloc(1000, 0).unwrap();
    let id = x.handle.unwrap();
    a.free(id).unwrap();
    let e = unchanged(&mut a, |a| a.free(id)).unwrap_err();
    assert!(matches!(e, Error::StaleHandle { .. }), "{e}");
    assert!(e.to_string().contains("double free"), "{e}");
    let e = unchanged(&mut a, |a| a.free_ptr(x.ptr)).unwrap_err();
    assert!(matches!(e, Error::NotAllocated { .. }), "{e}");
    // The slot is reused by a new allocation: the old handle stays stale.
    let y = a.malloc(1000, 0).unwrap();
    assert_eq!(y.ptr, x.ptr);
    assert!(matches!(
        unchanged(&mut a, |a| a.free(id)),
        Err(Error::StaleHandle { .. })
    ));
    assert!(matches!(
        unchanged(&mut a, |a| a.record_stream(id, 1)),
        Err(Error::StaleHandle { .. })
    ));
    assert!(matches!(
        unchanged(&mut a, |a| a.allocation_info(id)),
        Err(Error::StaleHandle { .. })
    ));
    a.free(y.handle.unwrap()).unwrap();
    teardown(&mut a, []).unwrap();
}

#[test]
fn foreign_handles_are_invalid() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let mut b = allocator(None, Config::DEFAULT, 64);
    for _ in 0..10 {
        b.malloc(1000, 0).unwrap();
    }
    let foreign = b.malloc(1000, 0).unwrap().handle.unwrap();
    let e = unchanged(&mut a, |a| a.free(foreign)).unwrap_err();
    assert!(matches!(e, Error::InvalidHandle { .. }), "{e}");
}

#[test]
fn unknown_interior_and_cached_pointers() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let x = a.malloc(4096, 0).unwrap();
    let e = unchanged(&mut a, |a| a.free_ptr(DevicePtr(0x1234))).unwrap_err();
    assert_eq!(
        e,
        Error::UnknownPointer {
            ptr: DevicePtr(0x1234)
        }
    );
    let inside = DevicePtr(x.ptr.0 + 100);
    let e = unchanged(&mut a, |a| a.free_ptr(inside)).unwrap_err();
    assert_eq!(
        e,
        Error::InteriorPointer {
            ptr: inside,
            base: x.ptr
        }
    );
    assert!(e.to_string().contains("not its start"));
    let cached = DevicePtr(x.ptr.0 + 8192);
    assert_eq!(
        unchanged(&mut a, |a| a.free_ptr(cached)).unwrap_err(),
        Error::NotAllocated { ptr: cached }
    );
    assert_eq!(
        unchanged(&mut a, |a| a.record_stream_ptr(inside, 1)).unwrap_err(),
        Error::InteriorPointer {
            ptr: inside,
            base: x.ptr
        }
    );
    // Null is a no-op, as in PyTorch.
    unchanged(&mut a, |a| a.free_ptr(DevicePtr::NULL)).unwrap();
    assert_eq!(a.base_allocation(inside).unwrap(), (x.ptr, 2 << 20));
    assert_eq!(
        a.base_allocation(DevicePtr(1)).unwrap_err(),
        Error::UnknownPointer { ptr: DevicePtr(1) }
    );
    a.free_ptr(x.ptr).unwrap();
    teardown(&mut a, []).unwrap();
}

#[test]
fn huge_sizes_fail_before_the_allocator() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    for size in [1u64 << 60, u64::MAX, (1 << 60) + 1] {
        let e = unchanged(&mut a, |a| a.malloc(size, 0)).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("more than 1EB"));
    }
    assert_eq!(a.stats().num_ooms, 0);
    // Just below 1 EiB rounds fine and fails as a normal OOM on a real capacity.
    let mut c = allocator(
        Some(1 << 30),
        Config::parse("roundup_power2_divisions:16").unwrap(),
        64,
    );
    let e = c.malloc((1 << 60) - 1, 0).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    assert_eq!(c.stats().num_ooms, 1);
}

#[test]
fn metadata_exhaustion_is_an_error_that_changes_nothing() {
    let mut a = allocator(None, Config::DEFAULT, 8);
    let mut live = Vec::new();
    let err = loop {
        match unchanged_on_err(&mut a) {
            Ok(x) => live.push(x.ptr),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::MetadataExhausted { capacity: 8 }),
        "{err}"
    );
    assert!(err.to_string().contains("8 slots"));
    teardown(&mut a, live).unwrap();
}

fn unchanged_on_err(
    a: &mut MockAllocator,
) -> Result<cachealloc_core::Allocation, cachealloc_tests::MockAllocError> {
    let before = state(a);
    let r = a.malloc(1000, 0);
    if r.is_err() {
        assert_eq!(before, state(a));
    }
    a.check_invariants().unwrap();
    r
}

#[test]
fn full_event_queue_leaves_the_allocation_live() {
    type Small = DeviceAllocator<MockDevice, Vec<BlockSlot>, 2>;
    let mut a: Small = DeviceAllocator::with_events(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    let x = a.malloc(4096, 0).unwrap();
    let id = x.handle.unwrap();
    for s in 1..=2 {
        a.record_stream(id, s).unwrap();
    }
    assert!(matches!(
        a.record_stream(id, 3),
        Err(Error::StreamUsesFull { capacity: 2 })
    ));
    let y = a.malloc(4096, 0).unwrap();
    a.record_stream(y.handle.unwrap(), 1).unwrap_err(); // table full
    a.free(id).unwrap(); // two events: the queue is now full
    let z = a.malloc(4096, 0).unwrap();
    a.record_stream(z.handle.unwrap(), 5).unwrap();
    let stats = *a.stats();
    let e = a.free(z.handle.unwrap()).unwrap_err();
    assert!(matches!(e, Error::EventQueueFull { capacity: 2 }), "{e}");
    assert_eq!(stats, *a.stats());
    a.check_invariants().unwrap();
    a.backend_mut().sync(None);
    a.malloc(512, 0).unwrap(); // process_events drains the queue
    a.free(z.handle.unwrap()).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn invalid_memory_fraction() {
    let mut a = allocator(Some(1 << 30), Config::DEFAULT, 64);
    for f in [-0.1, 1.5, f64::NAN] {
        assert_eq!(
            unchanged(&mut a, |a| a.set_memory_fraction(f)),
            Err(Error::InvalidFraction)
        );
    }
    a.set_memory_fraction(0.25).unwrap();
    assert_eq!(a.memory_limit(), Some(1 << 28));
}

/// torch 2.11 to 2.15 (each wheel's `setMemoryFraction`): a fraction of
/// 1.0 sets no limit, so an out-of-memory names no "allowed" and garbage
/// collection stays off; a lower one sets a limit.
#[test]
fn a_fraction_of_one_sets_no_limit() {
    let mut a = allocator(
        Some(64 << 20),
        Config::parse("garbage_collection_threshold:0.5").unwrap(),
        64,
    );
    let message = |a: &mut MockAllocator| match a.malloc(100 << 20, 0) {
        Err(Error::OutOfMemory(r)) => r.pytorch_message().to_string(),
        other => panic!("{other:?}"),
    };
    a.set_memory_fraction(0.5).unwrap();
    assert_eq!(a.memory_limit(), Some(32 << 20));
    assert!(message(&mut a).contains("allowed"));
    a.set_memory_fraction(1.0).unwrap();
    assert_eq!(a.memory_limit(), None);
    assert_eq!(a.memory_fraction().unwrap(), 1.0);
    let m = message(&mut a);
    assert!(!m.contains("allowed"), "{m}");
    a.check_invariants().unwrap();
}

#[test]
fn no_retry_flag_skips_the_release_ladder() {
    let mut a = allocator(Some(100 << 20), Config::DEFAULT, 64);
    let x = a.malloc(60 << 20, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    let e = a
        .malloc_with(70 << 20, 0, MallocFlags::NO_RETRY)
        .unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)));
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (0, 1, 0)
    );
    assert_eq!(
        s.reserved_bytes.all().current,
        60 << 20,
        "the cache was kept"
    );
    // Without the flag the ladder frees the cache and succeeds.
    a.malloc(70 << 20, 0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
}

#[test]
fn free_memory_callback_runs_before_the_device_and_can_free() {
    // A callback with state of its own: the allocations it may release.
    let held: &'static Mutex<Vec<DevicePtr>> = Box::leak(Box::new(Mutex::new(Vec::new())));
    let release_held: &'static dyn FreeMemoryCallback =
        Box::leak(Box::new(move |a: &mut dyn FreeAccess| {
            let v: Vec<DevicePtr> = held.lock().unwrap().drain(..).collect();
            let freed = !v.is_empty();
            for p in v {
                assert!(a.free_ptr(p));
            }
            freed
        }));
    let mut a = allocator(Some(40 << 20), Config::DEFAULT, 64);
    assert!(a.add_free_memory_callback(release_held).is_ok());
    let x = a.malloc(30 << 20, 0).unwrap();
    held.lock().unwrap().push(x.ptr);
    let y = a.malloc(30 << 20, 0).unwrap();
    assert_eq!(
        y.ptr, x.ptr,
        "served from the cache after the callback freed x"
    );
    let s = a.stats();
    assert_eq!(
        (s.num_device_alloc, s.num_alloc_retries, s.num_ooms),
        (1, 0, 0)
    );
}

/// A segment the device returns overlapping one it already gave is a
/// `BackendContract` error that changes nothing, and the range goes back to
/// the device: the mock holds what it held before.
#[test]
fn an_overlapping_segment_is_refused_and_handed_back() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let x = a.malloc(512, 0).unwrap();
    let held = a.backend().held_bytes();
    for (addr, size) in [(x.ptr.0 + 4096, 4 << 20), (x.ptr.0 - (1 << 20), 12 << 20)] {
        a.backend_mut().place_next_malloc(addr);
        let e = unchanged(&mut a, |a| a.malloc(size, 0)).unwrap_err();
        assert!(
            matches!(e, Error::BackendContract { what, .. } if what.contains("overlapping")),
            "{e}"
        );
        assert_eq!(a.backend().held_bytes(), held, "the range was handed back");
    }
    teardown(&mut a, [x.ptr]).unwrap();
}

/// The two cases where nothing can be handed back, documented leaks: a null
/// segment, and one at the base of a held segment (freeing that address
/// would release the held segment).
#[test]
fn a_null_or_duplicate_segment_is_refused_and_leaked() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let x = a.malloc(512, 0).unwrap();
    let held = a.backend().held_bytes();
    // Stream 1: no cached block serves it, so the device is asked.
    a.backend_mut().place_next_malloc(x.ptr.0);
    let e = unchanged(&mut a, |a| a.malloc(1 << 20, 1)).unwrap_err();
    assert!(
        matches!(e, Error::BackendContract { what, .. } if what.contains("base of a held segment")),
        "{e}"
    );
    assert_eq!(
        a.backend().held_bytes(),
        held + (2 << 20),
        "leaked, not freed"
    );
    a.backend_mut().place_next_malloc(0);
    let e = unchanged(&mut a, |a| a.malloc(1 << 20, 1)).unwrap_err();
    assert!(matches!(
        e,
        Error::BackendContract {
            what: "malloc returned null",
            ..
        }
    ));
    // The held segment is intact and still serves allocations.
    let y = a.malloc(512, 0).unwrap();
    assert_eq!(a.base_allocation(y.ptr).unwrap().0, x.ptr);
    a.free_ptr(y.ptr).unwrap();
    a.free_ptr(x.ptr).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.backend().held_bytes(),
        2 * (2 << 20),
        "exactly the two leaked ranges"
    );
    a.check_invariants().unwrap();
}

#[test]
fn a_failed_device_free_keeps_the_segment() {
    let mut a = DeviceAllocator::new(
        TinyBackend::default(),
        [BlockSlot::VACANT; 16],
        Config::DEFAULT,
    );
    let x = a.malloc(512, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.backend_mut().fail_next_free = true;
    assert!(matches!(a.empty_cache(), Err(Error::Backend(_))));
    assert_eq!(a.stats().reserved_bytes.all().current, 2 << 20);
    assert_eq!(a.stats().num_device_free, 0, "a failed free is not counted");
    a.check_invariants().unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.backend().held, 0);
}

#[test]
fn snapshot_cache_info_and_allocation_info() {
    let mut a = allocator(None, Config::DEFAULT, 64);
    let x = a.malloc(1000, 1).unwrap();
    let y = a.malloc(3 << 20, 0).unwrap();
    let z = a.malloc(2000, 1).unwrap();
    a.record_stream(z.handle.unwrap(), 0).unwrap();
    a.free(z.handle.unwrap()).unwrap();
    let info = a.allocation_info(x.handle.unwrap()).unwrap();
    assert_eq!(
        (info.requested_size, info.size, info.stream),
        (1000, 1024, 1)
    );
    assert_ne!(
        info.allocation_id,
        a.allocation_info(y.handle.unwrap()).unwrap().allocation_id
    );
    let segs: Vec<_> = a.segments().collect();
    assert_eq!(segs.len(), 2);
    assert!(segs[0].address < segs[1].address);
    let small = &segs[0];
    let states: Vec<_> = small.blocks().map(|b| b.state.as_str()).collect();
    assert_eq!(
        states,
        ["active_allocated", "active_pending_free", "inactive"]
    );
    assert_eq!(
        (
            small.allocated_size,
            small.active_size,
            small.requested_size
        ),
        (1024, 1024 + 2048, 3000)
    );
    let ci = a.cache_info();
    assert_eq!(ci.cached_bytes, (2 << 20) - 3072 + (20 << 20) - (3 << 20));
    assert_eq!(ci.largest_block, (17) << 20);
    assert_eq!(
        ci.cached_bytes as i64,
        a.stats().reserved_bytes.all().current - a.stats().active_bytes.all().current
    );
}

/// Regression (found by the `ops` fuzz logic): with the event queue full of
/// events that have already completed, a free of a record_stream'd block
/// used to fail with EventQueueFull until some later malloc drained the
/// queue. It now drains completed events itself before refusing.
#[test]
fn free_drains_completed_events_before_refusing() {
    type Small = DeviceAllocator<MockDevice, Vec<BlockSlot>, 2>;
    let mut a: Small = DeviceAllocator::with_events(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    let x = a.malloc(4096, 0).unwrap();
    a.record_stream(x.handle.unwrap(), 1).unwrap();
    a.record_stream(x.handle.unwrap(), 2).unwrap();
    let z = a.malloc(4096, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap(); // the queue is full: two events
    a.record_stream(z.handle.unwrap(), 1).unwrap();
    a.backend_mut().sync(None); // both events complete; nobody has looked yet
    a.free(z.handle.unwrap())
        .expect("completed events make room");
    assert_eq!(a.pending_events(), 1);
    a.check_invariants().unwrap();
    a.backend_mut().sync(None);
    a.empty_cache().unwrap();
    assert_eq!(a.backend().held_bytes(), 0);
}

/// A backend failure keeps the backend's error as its `source()` (the
/// chain `anyhow` and friends print); the allocator's own errors have none.
#[test]
fn the_backend_error_is_the_source() {
    use std::error::Error as _;
    let mut a = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 16],
        Config::DEFAULT,
    );
    a.backend_mut()
        .fail_nth(cachealloc_mock::CallKind::Malloc, 0);
    let e = a.malloc(4096, 0).unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e}");
    let source = e.source().expect("the backend's error");
    assert!(
        e.to_string().contains(&source.to_string()),
        "{e} / {source}"
    );
    assert!(source
        .downcast_ref::<cachealloc_mock::MockError>()
        .is_some());
    let unknown = a.free_ptr(DevicePtr(1)).unwrap_err();
    assert!(unknown.source().is_none());
}

/// The error stays small: every result is as large as it, so a large
/// error costs every call a copy (the verdict's bytes live beside it, in
/// `DeviceAllocator::last_oom_cause` and the observers' calls).
#[test]
fn the_error_stays_small() {
    use cachealloc_core::{Allocation, Error};
    use cachealloc_mock::MockError;
    let error = std::mem::size_of::<Error<MockError>>();
    let result = std::mem::size_of::<Result<Allocation, Error<MockError>>>();
    println!("Error<MockError>: {error} bytes; Result<Allocation, _>: {result} bytes");
    assert!(error <= 128, "Error<MockError> is {error} bytes");
    assert!(
        result <= 128,
        "Result<Allocation, Error<MockError>> is {result} bytes"
    );
}
