//! Zero heap allocations per operation in steady state: a counting global
//! allocator around malloc / free / record_stream / sync / event processing
//! on the mock, after a warm-up. (A count, not a timing, so it is asserted.)

use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Whether this thread's allocations are being counted, and how many
    /// (other test threads neither count nor disturb the count).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn note_alloc() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
    }
}

/// Heap allocations made by `f` on this thread.
fn count(f: impl FnOnce()) -> u64 {
    ALLOCS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(Cell::get)
}

// SAFETY: defers to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_operations_do_not_touch_the_heap() {
    let mut a: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64> = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 4096].into_boxed_slice(),
        Config::DEFAULT,
    );
    let sizes = [512u64, 4096, 100_000, 1 << 20, 3 << 20, 12 << 20];
    let round = |a: &mut DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64>| {
        let mut held = [None; 6];
        for (k, &s) in sizes.iter().enumerate() {
            held[k] = a.malloc(s, (k % 2) as u64).unwrap().handle;
        }
        a.record_stream(held[1].unwrap(), 2).unwrap();
        let _ = a.stats().allocated_bytes.all().current;
        for id in held.into_iter().flatten() {
            a.free(id).unwrap();
        }
        a.backend_mut().sync(None);
    };
    for _ in 0..100 {
        round(&mut a); // warm-up: segments, the event pool, the mock's maps
    }
    let n = count(|| {
        for _ in 0..10_000 {
            round(&mut a);
        }
    });
    println!("heap allocations in 10,000 rounds (60,000 mallocs, 60,000 frees, 10,000 record_streams): {n}");
    assert_eq!(n, 0);
    a.check_invariants().unwrap();
}

/// The same with the memory history on (a ring of 256 entries, so it wraps
/// thousands of times) and a trace tracker attached.
#[test]
fn history_and_trackers_do_not_touch_the_heap() {
    use cachealloc_core::{TraceActions, TraceEntry};
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEEN: AtomicU64 = AtomicU64::new(0);
    fn tracker(_: &TraceEntry) {
        SEEN.fetch_add(1, Ordering::Relaxed);
    }
    let mut a: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64, Box<[TraceEntry]>> =
        DeviceAllocator::with_history(
            MockDevice::unlimited(),
            vec![BlockSlot::VACANT; 4096].into_boxed_slice(),
            vec![TraceEntry::EMPTY; 256].into_boxed_slice(),
            Config::DEFAULT,
        );
    a.record_history(true, usize::MAX, false, TraceActions::NONE);
    assert!(a.attach_trace_tracker(&tracker).is_ok());
    let round = |a: &mut DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64, Box<[TraceEntry]>>| {
        let x = a.malloc(4096, 0).unwrap().handle.unwrap();
        let y = a.malloc(3 << 20, 1).unwrap().handle.unwrap();
        a.record_stream(x, 2).unwrap();
        a.free(x).unwrap();
        a.free(y).unwrap();
        a.backend_mut().sync(None);
    };
    for _ in 0..100 {
        round(&mut a);
    }
    let n = count(|| {
        for _ in 0..10_000 {
            round(&mut a);
        }
        let _ = a.snapshot().history.count();
    });
    println!("heap allocations in 10,000 rounds with history on: {n}");
    assert_eq!(n, 0);
    assert!(a.history().dropped() > 50_000 && SEEN.load(Ordering::Relaxed) > 60_000);
    a.check_invariants().unwrap();
}

/// The counter does count (a test that cannot fail proves nothing).
#[test]
fn the_counter_counts() {
    let n = count(|| {
        let v = std::hint::black_box(vec![1u8; 100]);
        drop(v);
    });
    assert_eq!(n, 1);
}
