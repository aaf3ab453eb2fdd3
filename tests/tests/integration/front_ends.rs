//! The thread-safe front ends inside a host process that calls back:
//! out-of-memory observers run after the device's lock is released and may
//! call the allocator again; a panic while a device's lock is held fails
//! that device for good; the device that owns a pointer is found in the
//! segment registry without any device's lock, right while segments are
//! created and released on other threads, and the registry is part of the
//! invariant checker (shown failing).

use crate::shared_space::{SharedSpace, Space};
use cachealloc_core::SharedAllocator;
use cachealloc_core::{
    BlockSlot, CachingAllocator, Config, DeviceAllocator, DevicePtr, Error, MultiDeviceAllocator,
    SegmentRegistry, SegmentTable, TraceEntry,
};
use cachealloc_mock::MockDevice;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

const MIB: u64 = 1 << 20;

type Mock = CachingAllocator<MockDevice, Vec<BlockSlot>, 64>;

fn mock(capacity: u64) -> Mock {
    CachingAllocator::new(DeviceAllocator::with_events(
        MockDevice::with_capacity(capacity),
        vec![BlockSlot::VACANT; 256],
        Config::DEFAULT,
    ))
}

/// The allocator the observer calls back into.
static CALLED_BACK: OnceLock<&'static Mock> = OnceLock::new();
static OBSERVED: AtomicU32 = AtomicU32::new(0);
static OOMS_SEEN: AtomicU64 = AtomicU64::new(0);
static ANNOTATED: AtomicBool = AtomicBool::new(false);

/// Sees the observer's annotation.
fn annotation_tracker(e: &TraceEntry) {
    if e.action == cachealloc_core::TraceAction::UserDefined && e.context == 7 {
        ANNOTATED.store(true, Ordering::SeqCst);
    }
}

/// An observer that calls back into the allocator that failed (under the
/// old design it ran under that allocator's lock: a deadlock).
fn calling_back(_device: u32, _alloc_size: u64, _total: u64, _free: u64) {
    let a = CALLED_BACK.get().expect("set");
    let s = a.stats().expect("stats from the observer");
    OOMS_SEEN.store(s.num_ooms as u64, Ordering::SeqCst);
    a.with(|a| a.record_annotation(7)).expect("an annotation");
    let x = a.malloc(4096, 0).expect("an allocation from the observer");
    a.free(x.handle.expect("id")).expect("free");
    OBSERVED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn an_oom_observer_may_call_back_into_the_failing_device() {
    let a: &'static Mock = Box::leak(Box::new(mock(64 * MIB)));
    CALLED_BACK.set(a).ok().expect("once");
    a.with(|a| {
        a.attach_trace_tracker(&annotation_tracker).ok();
        a.attach_out_of_memory_observer(&calling_back).ok()
    })
    .expect("attach");
    let held = a.malloc(40 * MIB, 0).expect("malloc");
    let e = a.malloc(40 * MIB, 0).expect_err("out of memory");
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(OBSERVED.load(Ordering::SeqCst), 1);
    assert_eq!(
        OOMS_SEEN.load(Ordering::SeqCst),
        1,
        "it saw the OOM counted"
    );
    assert!(
        ANNOTATED.load(Ordering::SeqCst),
        "the observer's annotation was recorded"
    );
    // Out of memory inside `with`: told once the lock is released, too.
    let e = a.with(|a| a.malloc(40 * MIB, 0)).expect("the device works");
    assert!(e.is_err());
    assert_eq!(OBSERVED.load(Ordering::SeqCst), 2);
    a.free(held.handle.expect("id")).expect("free");
    a.check_invariants().expect("consistent");
}

/// A bare `DeviceAllocator` (no lock) still calls its observers at the
/// failing allocation.
#[test]
fn a_bare_allocator_calls_its_observers_at_once() {
    static SEEN: AtomicU32 = AtomicU32::new(0);
    let mut a = DeviceAllocator::new(
        MockDevice::with_capacity(8 * MIB),
        vec![BlockSlot::VACANT; 16],
        Config::DEFAULT,
    );
    let observer = |_: u32, _: u64, _: u64, _: u64| {
        SEEN.fetch_add(1, Ordering::SeqCst);
    };
    let observer: &'static _ = Box::leak(Box::new(observer));
    a.attach_out_of_memory_observer(observer)
        .ok()
        .expect("room");
    assert!(a.malloc(16 * MIB, 0).is_err());
    assert_eq!(SEEN.load(Ordering::SeqCst), 1);
    // Wrapped and unwrapped again: still at once.
    let mut a = CachingAllocator::new(a).into_inner();
    assert!(a.malloc(16 * MIB, 0).is_err());
    assert_eq!(SEEN.load(Ordering::SeqCst), 2);
}

static PANIC_ARMED: AtomicBool = AtomicBool::new(false);

/// A tracker that panics once armed: a panic inside the locked region, in
/// the middle of an operation (after the allocator started changing its
/// metadata).
fn panicking_tracker(e: &TraceEntry) {
    if PANIC_ARMED.swap(false, Ordering::SeqCst) {
        panic!("a tracker panicked on {:?}", e.action);
    }
}

/// The allocator the re-entering tracker calls, and what its call got.
static REENTERED: OnceLock<&'static Mock> = OnceLock::new();
static REENTRY_REFUSED: AtomicU32 = AtomicU32::new(0);
static REENTRY_ARMED: AtomicBool = AtomicBool::new(false);

/// A trace tracker that calls back into its own device, once armed.
fn reentering_tracker(_: &TraceEntry) {
    if !REENTRY_ARMED.swap(false, Ordering::SeqCst) {
        return;
    }
    if let Some(a) = REENTERED.get() {
        match a.malloc(4096, 0) {
            Err(Error::CalledFromCallback) => {
                REENTRY_REFUSED.fetch_add(1, Ordering::SeqCst);
            }
            other => panic!("a call from the tracker under the lock: {other:?}"),
        }
        assert!(!a.is_failed(), "asked from inside: not failed, no deadlock");
    }
}

/// A callback that runs under a device's lock and calls back into that
/// device (PyTorch's mutex is recursive; this one is not) gets
/// `CalledFromCallback` at once instead of waiting for itself for ever;
/// the outer call goes on, and the device works on.
#[test]
fn a_call_from_a_callback_under_the_lock_is_refused_not_a_deadlock() {
    let a: &'static Mock = Box::leak(Box::new(mock(64 * MIB)));
    REENTERED.set(a).ok();
    a.with(|a| a.attach_trace_tracker(&reentering_tracker).ok())
        .expect("attach");
    REENTRY_ARMED.store(true, Ordering::SeqCst);
    let x = a.malloc(MIB, 0).expect("the outer call succeeds");
    assert_eq!(
        REENTRY_REFUSED.load(Ordering::SeqCst),
        1,
        "the inner call was refused"
    );
    assert!(!a.is_failed());
    a.free(x.handle.expect("handle")).expect("free");
    let y = a.malloc(MIB, 0).expect("the device works on");
    a.free(y.handle.expect("handle")).expect("free");
    a.with(|a| a.check_invariants())
        .expect("lock")
        .expect("consistent");
}

#[test]
fn a_panic_inside_the_lock_fails_the_device() {
    let a = mock(64 * MIB);
    a.with(|a| a.attach_trace_tracker(&panicking_tracker).ok())
        .expect("attach");
    let x = a.malloc(MIB, 0).expect("malloc");
    assert!(!a.is_failed());
    PANIC_ARMED.store(true, Ordering::SeqCst);
    // The tracker sees the new segment's entry: the segment is already
    // counted, the block not yet handed out.
    let r = catch_unwind(AssertUnwindSafe(|| a.malloc(30 * MIB, 0)));
    assert!(r.is_err(), "the tracker's panic reached the caller");
    assert!(a.is_failed());
    let failed = |r: Result<(), Error<cachealloc_mock::MockError>>| {
        assert!(matches!(r, Err(Error::DeviceFailed { device: 0 })), "{r:?}");
    };
    failed(a.malloc(MIB, 0).map(|_| ()));
    failed(a.free(x.handle.expect("id")));
    failed(a.free_ptr(x.ptr));
    failed(a.record_stream_ptr(x.ptr, 1));
    failed(a.empty_cache());
    failed(a.stats().map(|_| ()));
    failed(a.cache_info().map(|_| ()));
    failed(a.with(|_| ()));
    let msg = a.stats().unwrap_err().to_string();
    assert!(msg.contains("device 0 failed"), "{msg}");
    let v = a
        .check_invariants()
        .expect_err("a failed device fails the checker");
    assert!(v.what.contains("device failed"), "{v}");
    // Another device is not affected.
    let b = mock(64 * MIB);
    let y = b.malloc(MIB, 0).expect("another device");
    b.free(y.handle.expect("id")).expect("free");
}

/// A panic in a `with` closure before it touched anything fails the device
/// too: the front end cannot tell how far a closure got.
#[test]
fn a_panic_in_a_with_closure_fails_the_device() {
    let a = mock(64 * MIB);
    let r = catch_unwind(AssertUnwindSafe(|| {
        a.with(|_| panic!("the caller's own code"))
    }));
    assert!(r.is_err());
    assert!(matches!(a.stats(), Err(Error::DeviceFailed { .. })));
}

// ------------------------------------------------------ owner lookups

type Shared = CachingAllocator<SharedSpace, Vec<BlockSlot>, 64>;

fn shared(space: &Space, ordinal: u32) -> Shared {
    CachingAllocator::new(DeviceAllocator::with_events(
        space.device(ordinal),
        vec![BlockSlot::VACANT; 1024],
        Config::DEFAULT,
    ))
}

/// A live allocation published for the lookup threads: (pointer, device,
/// version), the version bumped at every publish and withdraw.
struct Board {
    slots: Vec<(AtomicU64, AtomicU64)>,
}

/// Two devices of one address space create and release segments (every
/// release lets the other device get the same addresses); other threads
/// look up pointers the devices hold, without any device's lock: a pointer
/// that stayed live across the lookup is always found on its device, and
/// no lookup ever names a device for an address neither holds.
#[test]
fn owner_lookups_race_segment_creation_and_release() {
    let space = Space::new(6);
    let table: &'static SegmentTable<64> = Box::leak(Box::default());
    let m = Arc::new(
        MultiDeviceAllocator::new([shared(&space, 0), shared(&space, 1)], table).expect("devices"),
    );
    // Per device: the published pointer and a version (odd: withdrawn).
    let board = Arc::new(Board {
        slots: (0..2)
            .map(|_| (AtomicU64::new(0), AtomicU64::new(1)))
            .collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for d in 0..2usize {
        let (m, board) = (m.clone(), board.clone());
        workers.push(std::thread::spawn(move || {
            let sizes = [4096, 3 * MIB, 12 * MIB, 25 * MIB];
            for k in 0..1000usize {
                let x = m.malloc(d, sizes[(k + d) % 4], 0).expect("malloc");
                let (p, v) = &board.slots[d];
                p.store(x.allocation.ptr.0, Ordering::SeqCst);
                v.fetch_add(1, Ordering::SeqCst); // even: published
                std::thread::yield_now();
                v.fetch_add(1, Ordering::SeqCst); // odd: withdrawn
                m.free(&x).expect("free");
                if k % 3 == 0 {
                    m.device(d)
                        .expect("device")
                        .empty_cache()
                        .expect("empty_cache");
                }
            }
        }));
    }
    let mut lookups = Vec::new();
    for t in 0..2u64 {
        let (m, board, stop) = (m.clone(), board.clone(), stop.clone());
        lookups.push(std::thread::spawn(move || {
            let mut checked = 0u64;
            let mut n = t;
            while !stop.load(Ordering::SeqCst) {
                n = n.wrapping_add(1);
                let d = (n % 2) as usize;
                let (p, v) = &board.slots[d];
                let v1 = v.load(Ordering::SeqCst);
                let ptr = p.load(Ordering::SeqCst);
                let owner = m.owner(DevicePtr(ptr));
                let v2 = v.load(Ordering::SeqCst);
                if v1 == v2 && v1 % 2 == 0 {
                    assert_eq!(owner, Some(d), "a live pointer of device {d} at {ptr:#x}");
                    checked += 1;
                }
                // An address in the middle of the space: whoever answers
                // must hold it (the registry's own view; the devices hold
                // disjoint ranges).
                let _ = m.owner(DevicePtr(0x7000_0000_0000 + (n % 6) * (32 << 20) + 4096));
                if n % 16 == 0 {
                    std::thread::yield_now();
                }
            }
            checked
        }));
    }
    for w in workers {
        w.join().expect("worker");
    }
    stop.store(true, Ordering::SeqCst);
    let checked: u64 = lookups.into_iter().map(|l| l.join().expect("lookup")).sum();
    assert!(checked > 0, "no lookup saw a pointer stay live");
    m.check_invariants().expect("consistent");
    for d in 0..2 {
        m.device(d).unwrap().empty_cache().unwrap();
    }
    assert!(table.is_empty(), "every released segment left the table");
    println!("owner lookups: {checked} lookups of live pointers, all on their device");
}

/// A registry without room: the new segment goes back to the device and
/// the allocation fails with `SegmentTableFull`; nothing leaks.
#[test]
fn a_full_segment_table_refuses_new_segments_cleanly() {
    let space = Space::new(4);
    let table: &'static SegmentTable<2> = Box::leak(Box::default());
    let m =
        MultiDeviceAllocator::new([shared(&space, 0), shared(&space, 1)], table).expect("devices");
    let x = m.malloc(0, 3 * MIB, 0).expect("first segment");
    let y = m.malloc(1, 3 * MIB, 0).expect("second segment");
    let e = m.malloc(0, 25 * MIB, 0).expect_err("no room in the table");
    assert!(matches!(e, Error::SegmentTableFull { capacity: 2 }), "{e}");
    assert!(e.to_string().contains("segment table is full"));
    let s = m.device(0).unwrap().stats().unwrap();
    assert_eq!(
        s.segment.all().current,
        1,
        "the refused segment is not held"
    );
    m.free(&x).unwrap();
    m.free(&y).unwrap();
    m.check_invariants().unwrap();
    for d in 0..2 {
        m.device(d).unwrap().empty_cache().unwrap();
    }
    let mut probe = space.device(9);
    let mut got = 0;
    while cachealloc_core::DeviceBackend::malloc(&mut probe, MIB).is_ok() {
        got += 1;
    }
    assert_eq!(got, 4, "every slot is back in the address space");
}

/// The checker compares the registry with the allocator's segments: an
/// entry lost, one left behind, or a stray one is a violation.
#[test]
fn the_checker_catches_a_registry_out_of_step() {
    let table: &'static SegmentTable<16> = Box::leak(Box::default());
    let mut a = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    let x = a.malloc(MIB, 0).unwrap();
    a.attach_segment_registry(table, 3).unwrap();
    assert_eq!(
        table.owner(x.ptr.0),
        Some(3),
        "a segment held before attaching"
    );
    let y = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(table.owner(y.ptr.0 + 5), Some(3));
    a.check_invariants().unwrap();
    // Lost: the segment of `y` is no longer in the registry.
    let base = y.ptr.0;
    table.hide(3, base);
    let v = a.check_invariants().unwrap_err();
    assert!(v.what.contains("segment registry"), "{v}");
    table.settle(3, base, false);
    a.check_invariants().unwrap();
    // A stray entry of this device.
    table.insert(3, 1 << 50, MIB).unwrap();
    let v = a.check_invariants().unwrap_err();
    assert!(v.what.contains("holds exactly"), "{v}");
    table.hide(3, 1 << 50);
    table.settle(3, 1 << 50, true);
    // Another device's entries are not this one's business.
    table.insert(4, 1 << 51, MIB).unwrap();
    a.check_invariants().unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.free(y.handle.unwrap()).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(table.count(3), 0);
    a.detach_segment_registry();
    assert!(a.segment_registry().is_none());
}

/// The lock under contention: one thread holds it for milliseconds at a
/// time (as a device malloc does) while others allocate and free as fast as
/// they can; every waiter gets through (sleepers are woken, or wake
/// themselves), nothing is counted twice or lost, and the allocator is
/// consistent at the end.
#[test]
fn waiters_behind_long_holds_get_through() {
    let a = Arc::new(mock(1 << 30));
    let stop = Arc::new(AtomicBool::new(false));
    // Set inside the holder's first hold: the workers start behind it.
    let holding = Arc::new(AtomicBool::new(false));
    let holder = {
        let (a, stop, holding) = (a.clone(), stop.clone(), holding.clone());
        std::thread::spawn(move || {
            let mut holds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                a.with(|_| {
                    holding.store(true, Ordering::Relaxed);
                    std::thread::sleep(std::time::Duration::from_millis(2))
                })
                .expect("hold");
                holds += 1;
                std::thread::yield_now();
            }
            holds
        })
    };
    while !holding.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                for i in 0..3000u64 {
                    let x = a.malloc(512 * (1 + (i + t) % 64), t).expect("malloc");
                    a.free_ptr(x.ptr).expect("free");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(holder.join().expect("the holder") > 0);
    let st = a.stats().expect("stats");
    assert_eq!(st.allocation.all().allocated, 9000);
    assert_eq!(st.allocation.all().current, 0);
    a.check_invariants().expect("consistent");
}
