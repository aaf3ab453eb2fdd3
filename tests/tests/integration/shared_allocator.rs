//! Every method of `SharedAllocator`, called through `&dyn SharedAllocator`
//! on the simulated device, with what each one answers; and a check that
//! the test keeps up with the interface (each of its methods is called
//! here).

use cachealloc_core::{
    Allocation, BlockSlot, CachingAllocator, CheckpointBlock, Config, DeviceAllocator, DevicePtr,
    Error, MallocFlags, MempoolId, OutOfMemoryObserver, PagesShare, PeerAccess, Pool, PoolOptions,
    SegmentSource, SegmentTable, SharedAllocator, StreamFilter, TraceActions, TraceEntry,
    TraceTracker,
};
use cachealloc_mock::{MockDevice, MockError, MockMachine};
use std::sync::atomic::{AtomicU64, Ordering};

/// The allocator under test.
type Shared = CachingAllocator<MockDevice, Vec<BlockSlot>, 64, Vec<TraceEntry>>;

type Dyn<'a> = &'a dyn SharedAllocator<Stream = u64, BackendError = MockError>;

const MIB: u64 = 1 << 20;

/// Counts what it hears.
struct Count(AtomicU64);

impl TraceTracker for Count {
    fn trace(&self, _: &TraceEntry) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl OutOfMemoryObserver for Count {
    fn out_of_memory(&self, _: u32, _: u64, _: u64, _: u64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

static TRACES: Count = Count(AtomicU64::new(0));
static OOMS: Count = Count(AtomicU64::new(0));

fn device(
    m: &MockMachine,
    ordinal: u32,
    capacity: u64,
) -> impl SharedAllocator<Stream = u64, BackendError = MockError> {
    Shared::new(DeviceAllocator::with_events_and_history(
        MockDevice::with_capacity(capacity)
            .with_base(u64::from(ordinal + 1) << 40)
            .with_ordinal(ordinal)
            .with_machine(m),
        vec![BlockSlot::VACANT; 4],
        vec![TraceEntry::EMPTY; 64],
        Config::DEFAULT,
    ))
    .with_storage_growth(|n| vec![BlockSlot::VACANT; 2 * n as usize])
}

#[test]
fn every_method_through_dyn_shared_allocator() {
    let m = MockMachine::new();
    let (d0, d1) = (device(&m, 0, 64 * MIB), device(&m, 1, 64 * MIB));
    let a: Dyn = &d0;
    let b: Dyn = &d1;

    // The device and its settings.
    assert_eq!((a.ordinal().unwrap(), b.ordinal().unwrap()), (0, 1));
    assert!(!a.has_expandable_segments().unwrap());
    assert_eq!(a.mem_info().unwrap().total, 64 * MIB);
    assert_eq!(a.memory_limit().unwrap(), None);
    a.set_memory_limit(Some(32 * MIB)).unwrap();
    assert_eq!(a.memory_limit().unwrap(), Some(32 * MIB));
    assert_eq!(a.memory_fraction().unwrap(), 0.5);
    a.set_memory_limit(None).unwrap();
    assert_eq!(a.memory_fraction().unwrap(), 1.0);
    // A later settings string: what it leaves out is as torch leaves it.
    a.set_config(Config::parse("roundup_power2_divisions:4").expect("settings"))
        .unwrap();
    let x = a.malloc(1_100_000, 0).unwrap();
    assert_eq!(x.size, 1_310_720);
    a.free_ptr(x.ptr).unwrap();
    a.set_config(Config::parse("").expect("settings")).unwrap();
    a.set_memory_fraction(1.0).unwrap();
    assert!(!a.is_failed());

    // History and observers.
    a.record_history(true, 64, false, TraceActions::NONE)
        .unwrap();
    a.attach_trace_tracker(&TRACES).unwrap();
    a.attach_out_of_memory_observer(&OOMS).unwrap();
    a.record_annotation(7).unwrap();

    // Allocation: more blocks than the 4 slots it started with (the
    // storage grows), each kind of malloc.
    let x = a.malloc(1000, 0).unwrap();
    let y = a.malloc_with(3 * MIB, 0, MallocFlags::NO_RETRY).unwrap();
    let z = a
        .malloc_aligned(4096, 4096, 0, MallocFlags::empty())
        .unwrap();
    assert_eq!(z.ptr.0 % 4096, 0);
    let more: Vec<Allocation> = (0..8).map(|_| a.malloc(512, 0).unwrap()).collect();
    assert_eq!(a.allocation_info_ptr(x.ptr).unwrap().requested_size, 1000);
    assert_eq!(a.allocation_info(x.handle.unwrap()).unwrap().ptr, x.ptr);
    assert_eq!(a.base_allocation(x.ptr).unwrap().1, 2 * MIB);
    assert!(a.owns(y.ptr).unwrap() && !b.owns(y.ptr).unwrap());
    a.record_stream(x.handle.unwrap(), 5).unwrap();
    a.record_stream_ptr(y.ptr, 5).unwrap();
    assert_eq!(a.stats().unwrap().allocation.all().current, 11);
    // An out-of-memory error reaches the observer after the lock.
    let oom = a.malloc(1 << 40, 0).unwrap_err();
    assert!(oom.is_out_of_memory());
    assert_eq!(OOMS.0.load(Ordering::Relaxed), 1);

    // Snapshots and segments.
    let mut seen = 0;
    a.snapshot(&mut |s| seen = s.segments.count()).unwrap();
    assert_eq!(seen, 2);
    let mut device_seen = 9;
    a.segments(&mut |d, s| {
        device_seen = d;
        seen = s.count();
    })
    .unwrap();
    assert_eq!((device_seen, seen), (0, 2));

    // IPC and copies, between the two devices of one machine.
    let h = a.share_ipc_handle(y.ptr).unwrap();
    assert_eq!(b.open_ipc_handle(&h).unwrap(), y.ptr);
    b.close_ipc_handle(&h).unwrap();
    a.release_ipc_share(y.ptr).unwrap();
    assert_eq!(a.enable_peer_access(1).unwrap(), PeerAccess::Enabled);
    let w = b.malloc(MIB, 0).unwrap();
    a.memcpy_async(w.ptr, y.ptr, 4096, 0, None).unwrap();
    a.memcpy_async(w.ptr, y.ptr, 4096, 0, Some((1, 0))).unwrap();
    b.free_ptr(w.ptr).unwrap();

    // Frees, statistics, the cache.
    a.free(x.handle.unwrap()).unwrap();
    a.free_ptr(y.ptr).unwrap();
    a.free_ptr(z.ptr).unwrap();
    for q in &more {
        a.free_ptr(q.ptr).unwrap();
    }
    assert!(matches!(
        a.free_ptr(DevicePtr(1)),
        Err(Error::UnknownPointer { .. })
    ));
    assert!(a.cache_info().unwrap().cached_bytes > 0);
    let f = a.fragmentation(0).unwrap();
    assert_eq!(f.device.free_bytes, a.cache_info().unwrap().cached_bytes);
    let cause = a
        .last_oom_cause()
        .unwrap()
        .expect("the device keeps its last verdict");
    assert_eq!(cause.needed, 1 << 40);
    let Error::OutOfMemory(report) = oom else {
        panic!("{oom:?}")
    };
    assert_eq!(
        a.oom_cause(report.seq).unwrap(),
        Some(cause),
        "found by its number"
    );
    assert_eq!(a.oom_cause(report.seq.wrapping_add(1)).unwrap(), None);
    assert_eq!(
        a.pool_memory(MempoolId::DEFAULT, Pool::Large).unwrap(),
        f.large_pool
    );
    a.reset_peak_allocated_bytes().unwrap();
    a.reset_peak_stats().unwrap();
    a.reset_accumulated_stats().unwrap();
    assert_eq!(a.stats().unwrap().num_ooms, 0);
    a.empty_cache().unwrap();
    assert_eq!(a.stats().unwrap().reserved_bytes.all().current, 0);
    assert!(TRACES.0.load(Ordering::Relaxed) > 0);

    // A private pool: create, route, checkpoint, restore, release.
    let id = MempoolId(1, 1);
    a.create_pool(id, PoolOptions::NONE).unwrap();
    a.set_use_on_oom(id, true).unwrap();
    assert_eq!(a.pool_use_count(id).unwrap(), 1);
    a.begin_allocate_to_pool(id, StreamFilter::All).unwrap();
    let p = a.malloc(MIB, 0).unwrap();
    a.end_allocate_to_pool(id).unwrap();
    assert!(a.check_pool_live_allocations(id, &[p.ptr]).unwrap());
    let mut blocks = vec![CheckpointBlock::EMPTY; a.checkpoint_len(id).unwrap()];
    let n = a.checkpoint_pool(id, &mut blocks).unwrap();
    assert_eq!(n, blocks.len());
    let mut freed = vec![DevicePtr::NULL; n];
    let mut made = vec![Allocation::NULL; n];
    let done = a.restore_pool(id, &blocks, &mut freed, &mut made).unwrap();
    assert_eq!((done.freed, done.allocated), (1, 1));
    assert_eq!(freed[0], p.ptr);
    a.free_ptr(made[0].ptr).unwrap();
    a.set_no_split(id).unwrap();
    // Routing to the pool took a use, as PyTorch's beginAllocateToPool does.
    assert_eq!(a.pool_info(id).unwrap().map(|i| i.use_count), Some(2));
    a.empty_cache_pool(id).unwrap();
    a.release_pool(id).unwrap();
    // torch 2.13's reserved_bytes_by_private_pools: the released pool
    // holds its segment until an empty_cache.
    let mut seen = Vec::new();
    a.reserved_bytes_by_private_pools(&mut |pid, s| {
        seen.push((pid, s.all().allocated, s.all().current))
    })
    .unwrap();
    assert_eq!(seen, [(id, 2 << 20, 2 << 20)]);
    // A capture: its pool gets the capturing stream's requests.
    let g = MempoolId(2, 2);
    a.capture_begin(g, StreamFilter::stream(9)).unwrap();
    let c = a.malloc(4096, 9).unwrap();
    a.capture_end(g).unwrap();
    a.free_ptr(c.ptr).unwrap();
    a.release_pool(g).unwrap();
    // torch 2.13's way: the routing, and the capture marked apart.
    let g = MempoolId(2, 3);
    a.begin_allocate_to_pool_torch(g, StreamFilter::stream(9))
        .unwrap();
    a.mark_capture_begin().unwrap();
    let c = a.malloc(4096, 9).unwrap();
    a.mark_capture_end().unwrap();
    assert!(matches!(a.mark_capture_end(), Err(Error::NoCaptureMarked)));
    a.end_allocate_to_pool(g).unwrap();
    a.free_ptr(c.ptr).unwrap();
    a.release_pool(g).unwrap();
    // Pages of an expandable segment across processes: the simulated
    // device has no file descriptors to export, and says so.
    let mut fds = [0i32; 4];
    let share = PagesShare {
        page_size: 2 << 20,
        pages: 1,
        offset: 0,
    };
    assert!(a.share_ipc_pages(p.ptr, &mut fds).is_err());
    assert!(a.open_ipc_pages(1, &share, &fds[..1]).is_err());
    assert!(a.close_ipc_pages(1, &share, &fds[..1]).is_err());
    // An allocation at the address a freed one had.
    let w = a.malloc(MIB, 0).unwrap();
    a.free_ptr(w.ptr).unwrap();
    let again = a.malloc_with_address(MIB / 2, w.ptr, 0).unwrap();
    assert_eq!(again.ptr, w.ptr);
    a.free_ptr(again.ptr).unwrap();
    // A pool whose segments come from a source of its own (MemPool with an
    // allocator): the device holds none of its bytes.
    fn src_alloc(_: usize, _: u64, _: u64) -> Option<DevicePtr> {
        Some(DevicePtr(1 << 50))
    }
    fn src_free(_: usize, _: DevicePtr, _: u64, _: u64) {}
    let s = MempoolId(3, 3);
    a.create_pool_with_source(
        s,
        PoolOptions::NONE,
        SegmentSource::new(src_alloc, src_free, 0),
    )
    .unwrap();
    a.begin_allocate_to_pool(s, StreamFilter::All).unwrap();
    assert_eq!(a.malloc(4096, 0).unwrap().ptr, DevicePtr(1 << 50));
    a.end_allocate_to_pool(s).unwrap();

    // The segment registry of a process.
    let table: &'static SegmentTable<16> = Box::leak(Box::default());
    let kept = a.malloc(MIB, 0).unwrap();
    a.attach_segment_registry(table, 0).unwrap();
    assert_eq!(
        cachealloc_core::SegmentRegistry::owner(table, kept.ptr.0),
        Some(0)
    );
    a.detach_segment_registry().unwrap();
    a.free_ptr(kept.ptr).unwrap();

    a.check_invariants().unwrap();
    b.check_invariants().unwrap();
}

/// The test above calls each method the interface has: adding an
/// operation to the table (`core/src/operations.rs`) without calling it
/// here fails.
#[test]
fn the_test_calls_every_method_of_the_interface() {
    let this = include_str!("shared_allocator.rs");
    let test = this
        .split("fn every_method_through_dyn_shared_allocator")
        .nth(1)
        .and_then(|t| t.split("fn the_test_calls_every_method").next())
        .expect("the test");
    // The table's, and the two written by hand in `shared.rs`.
    let names = cachealloc_core::OPERATIONS
        .iter()
        .map(|op| op.name)
        .chain(["is_failed", "check_invariants"]);
    for name in names {
        assert!(
            test.contains(&format!(".{name}(")),
            "SharedAllocator::{name} is not called by every_method_through_dyn_shared_allocator"
        );
    }
    assert!(cachealloc_core::OPERATIONS.len() >= 50);
}

/// Storage growth runs a call that ran out of slots once more, after
/// growing, not twice: `empty_cache` on an expandable segment needs a slot
/// for the mapped piece left beside the pages it unmaps, and it counts one
/// `num_sync_all_streams` per run.
#[test]
fn a_call_that_runs_out_of_slots_runs_once_more_after_growing() {
    static GROWN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    fn bigger(n: u32) -> Vec<BlockSlot> {
        GROWN.fetch_add(1, Ordering::Relaxed);
        vec![BlockSlot::VACANT; 2 * n as usize]
    }
    type Small = CachingAllocator<MockDevice, Vec<BlockSlot>, 64>;
    let a = Small::new(DeviceAllocator::with_events(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 16],
        Config::parse("expandable_segments:True").expect("settings"),
    ));
    // Blocks of 30 MiB and 15 MiB in turn on 20 MiB pages: each freed
    // 30 MiB block covers a whole page and part of another, and unmapping
    // the whole page leaves a mapped piece beside it, which takes a slot
    // (four of them: more than the slots a malloc keeps free).
    let pairs: Vec<_> = (0..4)
        .map(|_| {
            let x = a.malloc(30 * MIB, 0).expect("malloc");
            (x, a.malloc(15 * MIB, 0).expect("malloc"))
        })
        .collect();
    // Every other slot taken by small allocations.
    let mut small = Vec::new();
    loop {
        match a.malloc(512, 0) {
            Ok(s) => small.push(s),
            Err(Error::MetadataExhausted { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    for (x, _) in &pairs {
        a.free_ptr(x.ptr).expect("free");
    }
    // Without growth, empty_cache runs out and changes nothing.
    let syncs = |a: &Small| a.stats().expect("stats").num_sync_all_streams;
    let s0 = syncs(&a);
    assert!(matches!(
        a.empty_cache(),
        Err(Error::MetadataExhausted { .. })
    ));
    assert_eq!(syncs(&a), s0 + 1);
    // With growth: one run that runs out, the storage grows once, and one
    // more run that succeeds.
    let a = Small::new(a.into_inner()).with_storage_growth(bigger);
    let (g0, s0) = (GROWN.load(Ordering::Relaxed), syncs(&a));
    a.empty_cache().expect("empty_cache");
    assert_eq!(GROWN.load(Ordering::Relaxed) - g0, 1);
    assert_eq!(syncs(&a), s0 + 2);
    for p in small
        .iter()
        .chain(pairs.iter().map(|(_, y)| y))
        .map(|s| s.ptr)
    {
        a.free_ptr(p).expect("free");
    }
    a.check_invariants().expect("consistent");
}
