//! loom models of the thread-safe front end. Tiny capacities, slots and
//! segments, so a split, a merge, a full slot table and an OOM retry happen
//! within a few operations; owner lookups in the segment registry race
//! segment release and reuse. Every model checks: no two live allocations
//! overlap, `check_invariants()` at the end (stats == a recount), and after
//! teardown the mock holds 0 bytes.
//!
//! RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 cargo test --release -p cachealloc-loom --test loom --target-dir target/loom
#![cfg(loom)]

// The integration tests' backend of devices sharing one address space.
#[path = "../../tests/tests/common/shared_space.rs"]
mod shared_space;

use cachealloc_core::SharedAllocator;
use cachealloc_core::{
    Allocation, BlockSlot, CachingAllocator, Config, DeviceAllocator, DevicePtr, Error,
    MultiDeviceAllocator, SegmentTable,
};
use cachealloc_mock::teardown::teardown;
use cachealloc_mock::MockDevice;
use loom::sync::{Arc, Mutex};
use loom::thread;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` under loom and reports how many interleavings it explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let before = RUNS.load(Ordering::Relaxed);
    let f = std::sync::Arc::new(f);
    loom::model(move || {
        RUNS.fetch_add(1, Ordering::Relaxed);
        // The allocators are built on the stack and moved into their
        // `Arc`s: run the model in a thread with more than loom's default
        // 32 KiB of stack (a `DeviceAllocator` is ~10 KiB).
        let f = f.clone();
        thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || f())
            .expect("spawn")
            .join()
            .expect("the model panicked");
    });
    println!(
        "{name}: {} interleavings explored",
        RUNS.load(Ordering::Relaxed) - before
    );
}

type Alloc = CachingAllocator<MockDevice, Vec<BlockSlot>, 4>;
const MIB: u64 = 1 << 20;

fn device(capacity: u64, slots: usize) -> Alloc {
    CachingAllocator::new(DeviceAllocator::with_events(
        MockDevice::with_capacity(capacity),
        vec![BlockSlot::VACANT; slots],
        Config::DEFAULT,
    ))
}

/// Live ranges across threads: an allocation must not overlap any other.
#[derive(Default)]
struct Registry(Mutex<Vec<(u64, u64)>>);

impl Registry {
    fn add(&self, a: &Allocation) {
        if a.ptr.is_null() {
            return;
        }
        let mut v = self.0.lock().unwrap();
        for &(p, s) in v.iter() {
            assert!(
                a.ptr.0 + a.size <= p || p + s <= a.ptr.0,
                "overlap: {a:?} with ({p:#x}, {s})"
            );
        }
        v.push((a.ptr.0, a.size));
    }
    fn remove(&self, a: &Allocation) {
        self.0.lock().unwrap().retain(|&(p, _)| p != a.ptr.0);
    }
}

/// Allocate, tolerating the errors a tiny device gives (out of memory, a full
/// slot table), and register the result.
fn try_malloc(a: &Alloc, reg: &Registry, size: u64, stream: u64) -> Option<Allocation> {
    match a.malloc(size, stream) {
        Ok(x) => {
            reg.add(&x);
            Some(x)
        }
        Err(Error::OutOfMemory(_) | Error::MetadataExhausted { .. }) => None,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

fn free(a: &Alloc, reg: &Registry, x: Allocation) {
    reg.remove(&x);
    a.free(x.handle.unwrap()).unwrap();
}

fn finish(a: Alloc, live: impl IntoIterator<Item = DevicePtr>) {
    a.check_invariants().unwrap();
    let mut inner = a.into_inner();
    teardown(&mut inner, live).unwrap();
}

/// Three threads malloc and free on one 4 MiB device with 6 slots: splits,
/// merges, a full slot table, large requests that fail after the counted
/// retry.
static SAW_OOM_RETRY: AtomicUsize = AtomicUsize::new(0);
static SAW_FULL_SLOTS: AtomicUsize = AtomicUsize::new(0);
static SAW_SPLIT_MERGE: AtomicUsize = AtomicUsize::new(0);

#[test]
fn concurrent_malloc_free() {
    model("concurrent_malloc_free", || {
        let a = Arc::new(device(4 * MIB, 6));
        let reg = Arc::new(Registry::default());
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = try_malloc(&a, &reg, MIB, 0);
                let y = try_malloc(&a, &reg, 512 << 10, 0);
                for v in [x, y].into_iter().flatten() {
                    free(&a, &reg, v);
                }
            })
        };
        let t2 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = try_malloc(&a, &reg, MIB, 0);
                // Large pool: a 20 MiB segment never fits the 4 MiB device, so
                // this runs the whole ladder (flush + counted retry) and fails,
                // unless the slot table is full first.
                match a.malloc(3 * MIB, 0) {
                    Err(Error::OutOfMemory(_)) => {
                        assert!(a.stats().unwrap().num_alloc_retries >= 1);
                        SAW_OOM_RETRY.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Error::MetadataExhausted { .. }) => {
                        SAW_FULL_SLOTS.fetch_add(1, Ordering::Relaxed);
                    }
                    other => panic!("unexpected: {other:?}"),
                }
                if let Some(v) = x {
                    free(&a, &reg, v);
                }
            })
        };
        let z = try_malloc(&a, &reg, 1000, 1);
        if let Some(v) = z {
            free(&a, &reg, v);
        }
        t1.join().unwrap();
        t2.join().unwrap();
        let s = a.stats().unwrap();
        if s.inactive_split.all().allocated > 0 && s.inactive_split.all().freed > 0 {
            SAW_SPLIT_MERGE.fetch_add(1, Ordering::Relaxed);
        }
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, []);
    });
    // Across the interleavings, every interesting path was taken.
    for (what, n) in [
        ("OOM after the retry", &SAW_OOM_RETRY),
        ("full slot table", &SAW_FULL_SLOTS),
        ("split and merge", &SAW_SPLIT_MERGE),
    ] {
        let n = n.load(Ordering::Relaxed);
        println!("  {what}: {n} interleavings");
        assert!(n > 0, "no interleaving reached: {what}");
    }
}

/// A free with a pending event (record_stream) on one thread while another
/// thread's malloc runs process_events.
#[test]
fn pending_free_and_process_events() {
    model("pending_free_and_process_events", || {
        let a = Arc::new(device(8 * MIB, 16));
        let reg = Arc::new(Registry::default());
        let x = try_malloc(&a, &reg, 4096, 1).unwrap();
        a.record_stream(x.handle.unwrap(), 0).unwrap();
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                free(&a, &reg, x);
                a.with(|d| d.backend_mut().sync(Some(0))).unwrap();
            })
        };
        let t2 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || try_malloc(&a, &reg, 4096, 1))
        };
        t1.join().unwrap();
        let y = t2.join().unwrap();
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, y.map(|v| v.ptr));
    });
}

/// empty_cache racing malloc and free.
#[test]
fn empty_cache_races_malloc_and_free() {
    model("empty_cache_races_malloc_and_free", || {
        let a = Arc::new(device(4 * MIB, 8));
        let reg = Arc::new(Registry::default());
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                if let Some(x) = try_malloc(&a, &reg, MIB, 0) {
                    free(&a, &reg, x);
                }
            })
        };
        let t2 = {
            let a = a.clone();
            thread::spawn(move || a.empty_cache().unwrap())
        };
        if let Some(y) = try_malloc(&a, &reg, 512, 0) {
            free(&a, &reg, y);
        }
        t1.join().unwrap();
        t2.join().unwrap();
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, []);
    });
}

/// Reading stats while others allocate: every snapshot is self-consistent.
#[test]
fn stats_read_races_malloc_and_free() {
    model("stats_read_races_malloc_and_free", || {
        let a = Arc::new(device(4 * MIB, 8));
        let reg = Arc::new(Registry::default());
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = try_malloc(&a, &reg, 3000, 0);
                let y = try_malloc(&a, &reg, 5000, 0);
                for v in [x, y].into_iter().flatten() {
                    free(&a, &reg, v);
                }
            })
        };
        for _ in 0..2 {
            let s = a.stats().unwrap();
            for arr in [
                &s.allocation,
                &s.allocated_bytes,
                &s.reserved_bytes,
                &s.active,
                &s.segment,
            ] {
                assert_eq!(
                    arr.all().current,
                    arr.small_pool().current + arr.large_pool().current
                );
                assert!(arr.all().current <= arr.all().peak);
            }
            assert!(s.reserved_bytes.all().current >= s.allocated_bytes.all().current);
            assert!(s.active.all().current >= s.allocation.all().current);
        }
        t1.join().unwrap();
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, []);
    });
}

/// record_stream racing the free of the same allocation from another
/// thread: it either lands before the free (the free then waits for the
/// stream) or fails with a stale handle; nothing is corrupted.
#[test]
fn record_stream_races_free() {
    model("record_stream_races_free", || {
        let a = Arc::new(device(4 * MIB, 8));
        let x = a.malloc(4096, 1).unwrap();
        let id = x.handle.unwrap();
        let t1 = {
            let a = a.clone();
            thread::spawn(move || a.free(id).unwrap())
        };
        let t2 = {
            let a = a.clone();
            thread::spawn(move || a.record_stream(id, 2))
        };
        t1.join().unwrap();
        match t2.join().unwrap() {
            Ok(()) => assert_eq!(
                a.stats().unwrap().active.all().current,
                1,
                "the free waits for stream 2"
            ),
            Err(Error::StaleHandle { .. }) => {
                assert_eq!(a.stats().unwrap().active.all().current, 0)
            }
            Err(e) => panic!("unexpected: {e}"),
        }
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, []);
    });
}

/// Two devices; frees by pointer are routed to the owner from other threads.
#[test]
fn two_devices_route_frees_across_threads() {
    model("two_devices_route_frees_across_threads", || {
        let dev = |base: u64| {
            CachingAllocator::new(DeviceAllocator::with_events(
                MockDevice::with_capacity(8 * MIB).with_base(base),
                vec![BlockSlot::VACANT; 8],
                Config::DEFAULT,
            ))
        };
        let table: &'static SegmentTable<8> = Box::leak(Box::default());
        let m: Arc<MultiDeviceAllocator<CachingAllocator<MockDevice, Vec<BlockSlot>, 4>, 2>> =
            Arc::new(MultiDeviceAllocator::new([dev(1 << 40), dev(2 << 40)], table).unwrap());
        let a = m.malloc(0, 4096, 0).unwrap();
        let b = m.malloc(1, 4096, 0).unwrap();
        let t1 = {
            let m = m.clone();
            thread::spawn(move || {
                m.free_ptr(b.allocation.ptr).unwrap();
                let c = m.malloc(0, 512, 0).unwrap();
                m.free_ptr(c.allocation.ptr).unwrap();
            })
        };
        let t2 = {
            let m = m.clone();
            thread::spawn(move || m.free_ptr(a.allocation.ptr).unwrap())
        };
        t1.join().unwrap();
        t2.join().unwrap();
        m.check_invariants().unwrap();
        for d in 0..2 {
            let s = m.device(d).unwrap().stats().unwrap();
            assert_eq!(s.allocation.all().current, 0);
            assert_eq!(s.allocation.all().allocated, if d == 0 { 2 } else { 1 });
        }
        let m = Arc::try_unwrap(m).ok().unwrap();
        let [d0, d1] = m.into_devices();
        finish(d0, []);
        finish(d1, []);
    });
}

/// The device that owns a pointer comes from the segment registry, without
/// any device's lock, while device 0 releases its segment and device 1
/// creates one in the same address space (the space hands device 1 the
/// addresses device 0 just gave back): device 1's live pointer is always
/// found on device 1, and device 0's pointer is found on device 0, or on
/// nobody once its release began, or on device 1 only once device 1 got it.
#[test]
fn owner_lookup_races_segment_release_and_reuse() {
    use shared_space::{SharedSpace, Space};
    model("owner_lookup_races_segment_release_and_reuse", || {
        let space = Space::new(2);
        let table: &'static SegmentTable<8> = Box::leak(Box::default());
        let dev = |d: u32| -> CachingAllocator<SharedSpace, Vec<BlockSlot>, 4> {
            CachingAllocator::new(DeviceAllocator::with_events(
                space.device(d),
                vec![BlockSlot::VACANT; 8],
                Config::DEFAULT,
            ))
        };
        let m = Arc::new(MultiDeviceAllocator::new([dev(0), dev(1)], table).unwrap());
        let x = m.malloc(0, 4096, 0).unwrap();
        let p = x.allocation.ptr;
        let t1 = {
            let m = m.clone();
            thread::spawn(move || {
                m.free(&x).unwrap();
                m.device(0).unwrap().empty_cache().unwrap();
            })
        };
        let t2 = {
            let m = m.clone();
            thread::spawn(move || {
                let y = m.malloc(1, 4096, 0).unwrap();
                assert_eq!(
                    m.owner(y.allocation.ptr),
                    Some(1),
                    "device 1's live pointer"
                );
                y
            })
        };
        let seen = m.owner(p);
        t1.join().unwrap();
        let y = t2.join().unwrap();
        if seen == Some(1) {
            assert_eq!(
                y.allocation.ptr, p,
                "device 1 was named for an address it never held"
            );
        }
        assert_ne!(m.owner(p), Some(0), "device 0 released it");
        m.check_invariants().unwrap();
        m.free(&y).unwrap();
        m.device(1).unwrap().empty_cache().unwrap();
        assert!(table.is_empty());
    });
}

/// The segment table's lookups take no lock: a lookup reads the entries
/// between two reads of a sequence number, while a writer inserts a
/// segment below the one looked up (shifting it up a slot) and removes it
/// again (shifting it back). A lookup never sees a torn table: the stable
/// segment is always found on its device, the moving one on its device or
/// on nobody.
#[test]
fn lookups_race_the_table_shifting_under_them() {
    use cachealloc_core::SegmentRegistry;
    model("lookups_race_the_table_shifting_under_them", || {
        let table: &'static SegmentTable<4> = Box::leak(Box::default());
        table.insert(0, 0x2000, 0x1000).unwrap();
        let writer = thread::spawn(move || {
            table.insert(1, 0x1000, 0x800).unwrap();
            table.hide(1, 0x1000);
            table.settle(1, 0x1000, true);
        });
        // Without a yield here loom runs the writer only after the lookups.
        thread::yield_now();
        assert_eq!(table.owner(0x2800), Some(0), "the stable segment");
        let moving = table.owner(0x1400);
        assert!(moving.is_none() || moving == Some(1), "{moving:?}");
        writer.join().unwrap();
        assert_eq!((table.len(), table.owner(0x1400)), (1, None));
    });
}

/// A removal leaves a tombstone (one slot's write; the first one, before
/// the race) and, once tombstones pass half the entries, one write
/// compacts the table, moving the stable segment down two slots under a
/// lookup. A lookup never sees a torn
/// table: the stable segment is always found on its device, a removed one
/// on its device (not removed yet) or on nobody.
#[test]
fn lookups_race_removal_and_compaction() {
    use cachealloc_core::SegmentRegistry;
    model("lookups_race_removal_and_compaction", || {
        let table: &'static SegmentTable<4> = Box::leak(Box::default());
        table.insert(1, 0x1000, 0x800).unwrap();
        table.insert(1, 0x1800, 0x800).unwrap();
        table.insert(0, 0x2000, 0x1000).unwrap();
        table.hide(1, 0x1000);
        table.settle(1, 0x1000, true);
        assert_eq!((table.len(), table.slots_in_use()), (2, 3), "a tombstone");
        let writer = thread::spawn(move || {
            table.hide(1, 0x1800);
            table.settle(1, 0x1800, true);
        });
        thread::yield_now();
        assert_eq!(table.owner(0x2800), Some(0), "the stable segment");
        let removed = table.owner(0x1c00);
        assert!(removed.is_none() || removed == Some(1), "{removed:?}");
        writer.join().unwrap();
        assert_eq!((table.len(), table.slots_in_use()), (1, 1), "compacted");
        assert_eq!((table.owner(0x1400), table.owner(0x2000)), (None, Some(0)));
    });
}

/// Routing ends while another thread allocates: the allocation goes to
/// exactly one of the two pools (the private pool if it came first, the
/// default pool after), its segment says so, and after the pool is released
/// and the cache emptied nothing is left.
static SAW_IN_POOL: AtomicUsize = AtomicUsize::new(0);
static SAW_IN_DEFAULT: AtomicUsize = AtomicUsize::new(0);

#[test]
fn allocation_races_end_allocate_to_pool() {
    use cachealloc_core::{MempoolId, StreamFilter};
    const POOL: MempoolId = MempoolId(1, 0);
    model("allocation_races_end_allocate_to_pool", || {
        let a = Arc::new(device(8 * MIB, 8));
        let reg = Arc::new(Registry::default());
        a.capture_begin(POOL, StreamFilter::stream(1)).unwrap();
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = try_malloc(&a, &reg, 4096, 1).expect("room for 4 KiB");
                let pool = a
                    .with(|d| d.allocation_info(x.handle.unwrap()).unwrap().pool)
                    .unwrap();
                let owner = a
                    .with(|d| {
                        d.segments()
                            .find(|s| s.blocks().any(|b| b.address == x.ptr))
                            .map(|s| s.pool_id)
                    })
                    .unwrap();
                assert_eq!(owner, Some(pool), "the segment and the allocation disagree");
                assert!(pool == POOL || pool == MempoolId::DEFAULT);
                if pool == POOL {
                    SAW_IN_POOL.fetch_add(1, Ordering::Relaxed);
                } else {
                    SAW_IN_DEFAULT.fetch_add(1, Ordering::Relaxed);
                }
                free(&a, &reg, x);
            })
        };
        a.capture_end(POOL).unwrap();
        t1.join().unwrap();
        assert_eq!(a.pool_use_count(POOL).unwrap(), 1);
        a.release_pool(POOL).unwrap();
        let a = Arc::try_unwrap(a).ok().expect("threads joined");
        finish(a, []);
    });
    assert!(
        SAW_IN_POOL.load(Ordering::Relaxed) > 0,
        "never allocated in the pool"
    );
    assert!(
        SAW_IN_DEFAULT.load(Ordering::Relaxed) > 0,
        "never allocated after the routing ended"
    );
}

/// Expandable segments: one thread grows the segment (maps pages) and frees,
/// another allocates from the same stream's segment, a third empties the
/// cache (unmapping free pages) on a 50 MiB device whose large reservation
/// has 3 pages of 20 MiB: both allocations at once need more pages than the
/// device has. Across the interleavings an unmap and a full device (a
/// counted retry) are both seen.
static SAW_UNMAP: AtomicUsize = AtomicUsize::new(0);
static SAW_FULL_DEVICE: AtomicUsize = AtomicUsize::new(0);

#[test]
fn expandable_segments_grow_while_others_unmap() {
    model("expandable_segments_grow_while_others_unmap", || {
        let a = Arc::new(CachingAllocator::new(DeviceAllocator::with_events(
            MockDevice::with_capacity(50 * MIB),
            vec![BlockSlot::VACANT; 16],
            Config::parse("expandable_segments:True").unwrap(),
        )));
        let reg = Arc::new(Registry::default());
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                if let Some(x) = try_malloc(&a, &reg, 30 * MIB, 0) {
                    free(&a, &reg, x);
                }
            })
        };
        let t2 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || try_malloc(&a, &reg, 25 * MIB, 0))
        };
        a.empty_cache().unwrap();
        t1.join().unwrap();
        let y = t2.join().unwrap();
        let s = a.stats().unwrap();
        if s.num_device_free > 0 {
            SAW_UNMAP.fetch_add(1, Ordering::Relaxed);
        }
        if s.num_ooms > 0 || s.num_alloc_retries > 0 {
            SAW_FULL_DEVICE.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(s.segment.all().peak, 0, "maps are never segments");
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, y.map(|v| v.ptr));
    });
    for (what, n) in [
        ("an unmap", &SAW_UNMAP),
        ("a full device", &SAW_FULL_DEVICE),
    ] {
        let n = n.load(Ordering::Relaxed);
        println!("  {what}: {n} interleavings");
        assert!(n > 0, "no interleaving reached: {what}");
    }
}

/// The compact policy on a 6 MiB device (three 2 MiB pages): thread 1 frees
/// 4 MiB it allocated on stream 1 while thread 2 asks for 4 MiB on stream 2
/// and the main thread empties the cache. Stream 2 may get thread 1's
/// memory only after waiting for stream 1 (a device-side wait of a
/// hand-over, or the stream synchronize before an unmap). Across the
/// interleavings a hand-over and a full device are both seen.
static SAW_HANDOVER: AtomicUsize = AtomicUsize::new(0);
static SAW_COMPACT_OOM: AtomicUsize = AtomicUsize::new(0);

#[test]
fn compact_hand_over_races_free_and_empty_cache() {
    model("compact_hand_over_races_free_and_empty_cache", || {
        let a = Arc::new(CachingAllocator::new(DeviceAllocator::with_events(
            MockDevice::with_capacity(6 * MIB),
            vec![BlockSlot::VACANT; 16],
            Config::parse("policy:compact").unwrap(),
        )));
        let reg = Arc::new(Registry::default());
        let t1 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = try_malloc(&a, &reg, 4 * MIB, 1)?;
                let range = (x.ptr.0, x.size);
                free(&a, &reg, x);
                Some(range)
            })
        };
        let t2 = {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || try_malloc(&a, &reg, 4 * MIB, 2))
        };
        a.empty_cache().unwrap();
        let x = t1.join().unwrap();
        let y = t2.join().unwrap();
        if let (Some((p, s)), Some(y)) = (x, &y) {
            let overlap = y.ptr.0 < p + s && p < y.ptr.0 + y.size;
            let waited = a
                .with(|d| {
                    let m = d.backend();
                    m.stream_waits().contains(&(2, 1)) || m.stream_synchronizations().contains(&1)
                })
                .unwrap();
            assert!(
                !overlap || waited,
                "stream 2 reused stream 1's memory unordered"
            );
        }
        if a.with(|d| d.stream_handovers()).unwrap() > 0 {
            SAW_HANDOVER.fetch_add(1, Ordering::Relaxed);
        }
        if y.is_none() {
            SAW_COMPACT_OOM.fetch_add(1, Ordering::Relaxed);
        }
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, y.map(|v| v.ptr));
    });
    for (what, n) in [
        ("a hand-over", &SAW_HANDOVER),
        ("a full device", &SAW_COMPACT_OOM),
    ] {
        let n = n.load(Ordering::Relaxed);
        println!("  {what}: {n} interleavings");
        assert!(n > 0, "no interleaving reached: {what}");
    }
}

/// Storage growth between threads: two threads each malloc on a device
/// whose 2 slots are full, so each call runs out of slots; its retry takes
/// the lock again, and grows the storage only if no other call grew it
/// since (a second growth from the old capacity would make no larger
/// storage, and the call would fail with `MetadataExhausted` though the
/// storage had room). Both mallocs succeed in every interleaving.
static SAW_GROWN_BY_OTHER: AtomicUsize = AtomicUsize::new(0);

#[test]
fn storage_growth_races_storage_growth() {
    model("storage_growth_races_storage_growth", || {
        let a = device(4 * MIB, 2).with_storage_growth(|n| vec![BlockSlot::VACANT; 4 * n as usize]);
        let a = Arc::new(a);
        let reg = Arc::new(Registry::default());
        // A 2 MiB segment split in two: both slots used.
        let first = try_malloc(&a, &reg, 512, 0).expect("the first block");
        let spawn = |a: &Arc<Alloc>, reg: &Arc<Registry>| {
            let (a, reg) = (a.clone(), reg.clone());
            thread::spawn(move || {
                let x = a.malloc(512, 0).expect("the storage grows");
                reg.add(&x);
                x
            })
        };
        let (t1, t2) = (spawn(&a, &reg), spawn(&a, &reg));
        let (x, y) = (t1.join().unwrap(), t2.join().unwrap());
        // 2 -> 8 -> 32 slots: each thread grew. 2 -> 8 alone (room for
        // both): one thread grew, before or after the other ran out.
        if a.with(|d| d.slot_capacity()).unwrap() == 8 {
            SAW_GROWN_BY_OTHER.fetch_add(1, Ordering::Relaxed);
        }
        for v in [first, x, y] {
            free(&a, &reg, v);
        }
        let a = Arc::try_unwrap(a).ok().unwrap();
        finish(a, []);
    });
    let n = SAW_GROWN_BY_OTHER.load(Ordering::Relaxed);
    println!("  grown by the other thread: {n} interleavings");
    assert!(n > 0, "no interleaving had one thread grow for both");
}
