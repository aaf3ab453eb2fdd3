//! TensorFlow's `Allocator` facade on the simulated device: each call, the
//! no-retry attribute, and `AllocatorStats` against a count kept by hand.

use cachealloc_core::SharedAllocator;
use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator, DevicePtr, Error};
use cachealloc_mock::MockDevice;
use cachealloc_tf::{
    AllocationAttributes, AllocatorStats, MemoryType, TfAllocator, ALLOCATOR_ALIGNMENT,
};

const MIB: u64 = 1 << 20;
type Tf = TfAllocator<CachingAllocator<MockDevice, Vec<BlockSlot>>>;

fn tf(capacity: Option<u64>) -> Tf {
    TfAllocator::from((
        DeviceAllocator::new(
            MockDevice::new(capacity),
            vec![BlockSlot::VACANT; 256],
            Config::DEFAULT,
        ),
        7,
    ))
}

#[test]
fn allocate_and_deallocate_raw() {
    let t = tf(None);
    assert_eq!(t.name(), "cachealloc");
    assert_eq!(tf(None).with_name("GPU_0_bfc").name(), "GPU_0_bfc");
    let p = t.allocate_raw(ALLOCATOR_ALIGNMENT, 1000).unwrap();
    assert_eq!(p.0 % 64, 0);
    // Every request is on the facade's stream.
    let info = t
        .allocator()
        .try_with(|a| a.allocation_info_ptr(p))
        .unwrap();
    assert_eq!(info.stream, 7);
    let q = t.allocate_raw(1 << 16, 3 * MIB).unwrap();
    assert_eq!(q.0 % (1 << 16), 0);
    assert_eq!(
        t.allocate_raw(64, 0).unwrap(),
        DevicePtr::NULL,
        "0 bytes: null, as BFC"
    );
    assert!(matches!(
        t.allocate_raw(48, 100),
        Err(Error::BadAlignment { alignment: 48 })
    ));
    t.deallocate_raw(p).unwrap();
    t.deallocate_raw(q).unwrap();
    t.deallocate_raw(DevicePtr::NULL).unwrap();
    assert!(matches!(
        t.deallocate_raw(p),
        Err(Error::NotAllocated { .. })
    ));
    t.allocator().check_invariants().unwrap();
}

#[test]
fn size_queries() {
    let t = tf(None);
    assert!(t.tracks_allocation_sizes());
    assert!(!t.allocates_opaque_handle());
    assert!(!t.should_allocate_empty_tensors());
    assert_eq!(t.memory_type(), MemoryType::Device);
    t.set_safe_frontier(5);
    let p = t.allocate_raw(64, 1000).unwrap();
    let q = t.allocate_raw(64, 1000).unwrap();
    assert_eq!(t.requested_size(p).unwrap(), 1000);
    assert_eq!(t.allocated_size(p).unwrap(), 1024);
    let (ip, iq) = (t.allocation_id(p).unwrap(), t.allocation_id(q).unwrap());
    assert!(ip >= 1 && iq > ip, "ids from 1, unique: {ip} {iq}");
    assert_eq!(t.allocated_size_slow(p), 1024);
    assert_eq!(
        t.allocated_size_slow(DevicePtr(p.0 + 100)),
        1024,
        "inside it"
    );
    assert_eq!(t.allocated_size_slow(DevicePtr(12345)), 0);
    // Unknown or interior pointers: errors, where TensorFlow CHECK-fails.
    assert!(matches!(
        t.requested_size(DevicePtr(p.0 + 512)),
        Err(Error::InteriorPointer { .. })
    ));
    assert!(matches!(
        t.allocation_id(DevicePtr(12345)),
        Err(Error::UnknownPointer { .. })
    ));
    t.deallocate_raw(p).unwrap();
    assert!(t.allocated_size(p).is_err(), "freed");
}

#[test]
fn no_retry_on_failure_skips_the_release_and_retry_rung() {
    let t = tf(Some(24 * MIB));
    // A 20 MiB segment, cached after the free.
    let p = t.allocate_raw(64, 3 * MIB).unwrap();
    t.deallocate_raw(p).unwrap();
    // 22 MiB on another stream than the cached block's... the facade has
    // one stream, so ask for more than the cached segment holds.
    let e = t
        .allocate_raw_with(64, 21 * MIB, &AllocationAttributes::NO_RETRY)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let s = t.allocator().stats().unwrap();
    assert_eq!(s.num_alloc_retries, 0, "no release-and-retry");
    assert_eq!(
        s.reserved_bytes.all().current,
        20 * MIB as i64,
        "the cache kept"
    );
    // With retry (the default), the cache is released and the request fits.
    let q = t
        .allocate_raw_with(64, 21 * MIB, &AllocationAttributes::default())
        .unwrap();
    let s = t.allocator().stats().unwrap();
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.reserved_bytes.all().current, 22 * MIB as i64);
    t.deallocate_raw(q).unwrap();
    let logged = AllocationAttributes {
        allocation_will_be_logged: true,
        ..AllocationAttributes::DEFAULT
    };
    let r = t.allocate_raw_with(64, 100, &logged).unwrap();
    t.deallocate_raw(r).unwrap();
}

#[test]
fn allocator_stats_against_a_hand_count() {
    let t = tf(Some(64 * MIB));
    let blank = t.get_stats().unwrap();
    assert_eq!(
        blank,
        AllocatorStats {
            bytes_limit: Some(64 * MIB as i64),
            pool_bytes: Some(0),
            peak_pool_bytes: Some(0),
            ..AllocatorStats::default()
        }
    );
    // By hand: blocks of 1024, 4096, 3 MiB (a 20 MiB segment) and 2 MiB
    // small segment; 1000 -> 1024, 4000 -> 4096.
    let a = t.allocate_raw(64, 1000).unwrap();
    let b = t.allocate_raw(64, 4000).unwrap();
    let c = t.allocate_raw(64, 3 * MIB).unwrap();
    let s = t.get_stats().unwrap();
    let in_use = 1024 + 4096 + 3 * MIB as i64;
    assert_eq!(s.num_allocs, 3);
    assert_eq!((s.bytes_in_use, s.peak_bytes_in_use), (in_use, in_use));
    assert_eq!(s.largest_alloc_size, 3 * MIB as i64);
    assert_eq!(s.pool_bytes, Some(22 * MIB as i64)); // 2 MiB small + 20 MiB large
    assert_eq!(s.peak_pool_bytes, Some(22 * MIB as i64));
    // The small segment's free rest: 2 MiB - 5 KiB; the large one's: 17 MiB.
    assert_eq!(s.largest_free_block_bytes, 17 * MIB as i64);
    assert_eq!(
        (
            s.bytes_reserved,
            s.peak_bytes_reserved,
            s.bytes_reservable_limit
        ),
        (0, 0, None)
    );
    t.deallocate_raw(c).unwrap();
    let s = t.get_stats().unwrap();
    assert_eq!(s.bytes_in_use, 1024 + 4096);
    assert_eq!(s.peak_bytes_in_use, in_use, "the peak stays");
    assert_eq!(s.largest_free_block_bytes, 20 * MIB as i64, "merged back");
    // ClearStats: num_allocs and largest_alloc_size restart, the peak in
    // use becomes the current value, the rest stays.
    assert!(t.clear_stats());
    let s = t.get_stats().unwrap();
    assert_eq!((s.num_allocs, s.largest_alloc_size), (0, 0));
    assert_eq!(
        (s.bytes_in_use, s.peak_bytes_in_use),
        (1024 + 4096, 1024 + 4096)
    );
    assert_eq!(
        s.peak_pool_bytes,
        Some(22 * MIB as i64),
        "not reset, as in BFC"
    );
    let d = t.allocate_raw(64, 512).unwrap();
    // What others allocate from the allocator underneath is not the
    // facade's (BFC counts its own allocations).
    let other = t.allocator().malloc(MIB, 7).unwrap();
    let s = t.get_stats().unwrap();
    assert_eq!((s.num_allocs, s.largest_alloc_size), (1, 512));
    t.allocator().free(other.handle.unwrap()).unwrap();
    // PyTorch's own peak of reserved memory was not touched either.
    assert_eq!(
        t.allocator().stats().unwrap().reserved_bytes.all().peak,
        22 * MIB as i64
    );
    let text = s.to_string();
    assert!(text.starts_with("Limit:            "), "{text}");
    assert_eq!(text.lines().count(), 8);
    assert!(text.contains(&format!("NumAllocs:{:>28}", 1)), "{text}");
    for p in [a, b, d] {
        t.deallocate_raw(p).unwrap();
    }
    // Without a memory limit, the limit is the device's total memory.
    let u = TfAllocator::from((
        DeviceAllocator::new(
            MockDevice::new(Some(8 << 30)),
            vec![BlockSlot::VACANT; 16],
            Config::DEFAULT,
        ),
        0u64,
    ));
    let u: Tf = u;
    assert_eq!(u.get_stats().unwrap().bytes_limit, Some(8 << 30));
    // A limit of u64::MAX saturates at i64::MAX, never wraps to -1.
    u.allocator()
        .with(|a| a.set_memory_limit(u64::MAX))
        .unwrap();
    assert_eq!(u.get_stats().unwrap().bytes_limit, Some(i64::MAX));
}
