//! Aligned allocations (TensorFlow's `AllocateRaw(alignment, ...)`): up to
//! 512 bytes the old path bit for bit; above, the returned pointer is
//! aligned, the allocation fits inside its block, nothing overlaps, the
//! invariants hold, under every pool and split rule; bad alignments are
//! errors that change nothing.

use cachealloc_core::{
    Allocation, BlockSlot, Config, DeviceAllocator, Error, MallocFlags, MempoolId, PoolOptions,
    StreamFilter,
};
use cachealloc_mock::MockDevice;
use std::collections::BTreeMap;

type A = DeviceAllocator<MockDevice, Vec<BlockSlot>>;

const MIB: u64 = 1 << 20;

fn allocator(conf: &str) -> A {
    DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 4096],
        Config::parse(conf).unwrap(),
    )
}

/// The configurations of the split rules: PyTorch's default, oversize
/// blocks, rounding divisions, expandable segments, the compact policy.
const CONFS: [&str; 5] = [
    "",
    "max_split_size_mb:24",
    "roundup_power2_divisions:4",
    "expandable_segments:True",
    "policy:compact",
];

/// The live allocations, checked against each other and the allocator.
#[derive(Default)]
struct Live(BTreeMap<u64, (Allocation, u64)>);

impl Live {
    fn add(&mut self, a: &A, x: Allocation, size: u64, align: u64) {
        assert_eq!(x.ptr.0 % align.max(1), 0, "{x:?} not aligned to {align}");
        assert!(x.size >= size, "{x:?} holds less than {size}");
        let info = a.allocation_info(x.handle.unwrap()).unwrap();
        assert_eq!((info.ptr, info.requested_size), (x.ptr, size));
        // The allocation lies inside its segment.
        let (base, seg) = a.base_allocation(x.ptr).unwrap_or_else(|_| {
            let s = a
                .segments()
                .find(|s| s.address.0 <= x.ptr.0 && x.ptr.0 < s.address.0 + s.total_size)
                .expect("a segment holds it");
            (s.address, s.total_size)
        });
        assert!(
            base.0 <= x.ptr.0 && x.ptr.0 + x.size <= base.0 + seg,
            "{x:?} outside its segment"
        );
        if let Some((&p, (y, _))) = self.0.range(..x.ptr.0 + x.size).next_back() {
            assert!(p + y.size <= x.ptr.0, "{x:?} overlaps {y:?}");
        }
        if let Some((&p, _)) = self.0.range(x.ptr.0..).next() {
            assert!(x.ptr.0 + x.size <= p, "{x:?} overlaps the block at {p:#x}");
        }
        self.0.insert(x.ptr.0, (x, size));
    }
}

#[test]
fn up_to_512_bytes_alignment_is_the_old_path_bit_for_bit() {
    for conf in CONFS {
        let (mut a, mut b) = (allocator(conf), allocator(conf));
        let mut live = Vec::new();
        let mut rng = 0x9e3779b97f4a7c15u64;
        for k in 0..600u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng.is_multiple_of(3) && !live.is_empty() {
                let (x, y): (Allocation, Allocation) =
                    live.swap_remove((rng >> 8) as usize % live.len());
                a.free(x.handle.unwrap()).unwrap();
                b.free(y.handle.unwrap()).unwrap();
                continue;
            }
            let size =
                [1, 511, 4096, 700_000, 3 * MIB, 12 * MIB, 25 * MIB][(rng >> 16) as usize % 7];
            let align = [1, 2, 64, 256, 512][(k % 5) as usize];
            let stream = rng >> 40 & 1;
            let x = a.malloc(size, stream).unwrap();
            let y = b
                .malloc_aligned(size, align, stream, MallocFlags::empty())
                .unwrap();
            assert_eq!(
                (x.ptr, x.size, x.requested_size),
                (y.ptr, y.size, y.requested_size),
                "{conf}"
            );
            live.push((x, y));
        }
        assert_eq!(a.stats(), b.stats(), "{conf}");
        assert_eq!(a.backend().counters(), b.backend().counters(), "{conf}");
        b.check_invariants().unwrap();
    }
}

#[test]
fn larger_alignments_under_every_split_rule() {
    for conf in CONFS {
        let mut a = allocator(conf);
        let mut live = Live::default();
        let mut rng = 0x2545f4914f6cdd1du64 ^ conf.len() as u64;
        for k in 0..1500u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng % 5 < 2 && !live.0.is_empty() {
                let p = *live
                    .0
                    .keys()
                    .nth((rng >> 8) as usize % live.0.len())
                    .unwrap();
                let (x, _) = live.0.remove(&p).unwrap();
                a.free_ptr(x.ptr).unwrap();
            } else {
                let size =
                    [1, 512, 4096, 100_000, MIB, 3 * MIB, 12 * MIB][(rng >> 16) as usize % 7];
                let align = [1024, 4096, 65536, 2 * MIB, 4 * MIB][(rng >> 24) as usize % 5];
                let x = a
                    .malloc_aligned(size, align, rng >> 40 & 1, MallocFlags::empty())
                    .unwrap_or_else(|e| panic!("{conf}: {size} at {align}: {e}"));
                live.add(&a, x, size, align);
            }
            if k % 100 == 0 {
                a.empty_cache().unwrap();
            }
            a.check_invariants()
                .unwrap_or_else(|v| panic!("{conf}, op {k}: {v}"));
        }
        for (_, (x, _)) in std::mem::take(&mut live.0) {
            a.free(x.handle.unwrap()).unwrap();
        }
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        assert_eq!(a.backend().held_bytes(), 0, "{conf}: everything back");
        assert_eq!(a.stats().inactive_split.all().current, 0, "{conf}");
    }
}

#[test]
fn the_cut_off_low_end_is_a_free_block_that_merges_back() {
    let mut a = allocator("");
    let first = a.malloc(512, 0).unwrap(); // the small segment's start
    let x = a
        .malloc_aligned(4096, 4096, 0, MallocFlags::empty())
        .unwrap();
    assert_eq!(x.ptr.0 % 4096, 0);
    assert_eq!(
        x.ptr.0 - first.ptr.0,
        4096,
        "the block after the first 512 bytes, cut"
    );
    // [first | free 3584 | x | free rest]: one segment, four blocks.
    let seg = a.segments().next().unwrap();
    assert_eq!(seg.block_count, 4);
    assert_eq!(a.stats().inactive_split.all().current, 2);
    // The cut-off block serves a later small request.
    let y = a.malloc(1024, 0).unwrap();
    assert_eq!(y.ptr.0, first.ptr.0 + 512);
    for z in [y, x, first] {
        a.free(z.handle.unwrap()).unwrap();
    }
    assert_eq!(a.segments().next().unwrap().block_count, 1, "all merged");
    a.check_invariants().unwrap();
    // base_allocation and allocation_info are exact for an aligned block.
    let z = a
        .malloc_aligned(100, 1 << 21, 0, MallocFlags::empty())
        .unwrap();
    assert_eq!(z.ptr.0 % (1 << 21), 0);
    let info = a.allocation_info(z.handle.unwrap()).unwrap();
    assert_eq!((info.ptr, info.requested_size), (z.ptr, 100));
    let (base, size) = a.base_allocation(z.ptr).unwrap();
    assert!(base.0 <= z.ptr.0 && z.ptr.0 + z.size <= base.0 + size);
    a.free_ptr(z.ptr).unwrap();
}

#[test]
fn bad_alignments_are_errors_that_change_nothing() {
    let mut a = allocator("");
    for bad in [0, 3, 768, 1000, u64::MAX] {
        let e = a
            .malloc_aligned(4096, bad, 0, MallocFlags::empty())
            .unwrap_err();
        assert!(
            matches!(e, Error::BadAlignment { alignment } if alignment == bad),
            "{e}"
        );
        assert!(e.to_string().contains("not a power of two"), "{e}");
    }
    // So large that the padded request passes 1 EiB: too large, not a panic.
    let e = a
        .malloc_aligned(4096, 1 << 62, 0, MallocFlags::empty())
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let e = a
        .malloc_aligned(u64::MAX - 4096, 1 << 20, 0, MallocFlags::empty())
        .unwrap_err();
    assert!(
        matches!(e, Error::TooLarge { .. } | Error::SizeOverflow { .. }),
        "{e}"
    );
    assert_eq!(a.stats().num_device_alloc, 0);
    assert_eq!(
        a.malloc_aligned(0, 4096, 0, MallocFlags::empty()).unwrap(),
        Allocation::NULL
    );
    a.check_invariants().unwrap();
}

#[test]
fn private_pools_and_no_retry() {
    const POOL: MempoolId = MempoolId(1, 0);
    const RIGID: MempoolId = MempoolId(2, 0);
    let mut a = allocator("");
    a.begin_allocate_to_pool(POOL, StreamFilter::stream(1))
        .unwrap();
    let x = a
        .malloc_aligned(5000, 8192, 1, MallocFlags::empty())
        .unwrap();
    assert_eq!(x.ptr.0 % 8192, 0);
    a.end_allocate_to_pool(POOL).unwrap();
    assert_eq!(a.allocation_info(x.handle.unwrap()).unwrap().pool, POOL);
    a.create_pool(RIGID, PoolOptions::NONE.no_split()).unwrap();
    a.begin_allocate_to_pool(RIGID, StreamFilter::stream(2))
        .unwrap();
    let e = a
        .malloc_aligned(5000, 8192, 2, MallocFlags::empty())
        .unwrap_err();
    assert!(e.to_string().contains("never splits"), "{e}");
    assert!(a.malloc_aligned(5000, 512, 2, MallocFlags::empty()).is_ok());
    a.end_allocate_to_pool(RIGID).unwrap();
    // No retry: under a capacity, the request fails without the ladder's
    // release-and-retry rung.
    let mut b = DeviceAllocator::new(
        MockDevice::new(Some(24 * MIB)),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    let y = b.malloc(3 * MIB, 0).unwrap();
    b.free(y.handle.unwrap()).unwrap(); // a cached 20 MiB segment
    let e = b
        .malloc_aligned(3 * MIB, 4 * MIB, 1, MallocFlags::NO_RETRY)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(b.stats().num_alloc_retries, 0);
    let z = b
        .malloc_aligned(3 * MIB, 4 * MIB, 1, MallocFlags::empty())
        .unwrap();
    assert_eq!((z.ptr.0 % (4 * MIB), b.stats().num_alloc_retries), (0, 1));
    b.check_invariants().unwrap();
}

#[test]
fn an_aligned_request_does_not_cut_a_block_of_a_pool_that_never_splits() {
    const RIGID: MempoolId = MempoolId(3, 0);
    let mut a = DeviceAllocator::new(
        MockDevice::new(Some(20 * MIB)),
        vec![BlockSlot::VACANT; 64],
        Config::DEFAULT,
    );
    a.create_pool(RIGID, PoolOptions::NONE.use_on_oom().no_split())
        .unwrap();
    a.begin_allocate_to_pool(RIGID, StreamFilter::stream(1))
        .unwrap();
    let x = a.malloc(3 * MIB, 1).unwrap(); // the device's whole 20 MiB
    a.end_allocate_to_pool(RIGID).unwrap();
    a.free(x.handle.unwrap()).unwrap(); // cached in the pool, whole
                                        // A default-pool request may fall back to it (use_on_oom) ...
    let y = a.malloc(5 * MIB, 1).unwrap();
    assert_eq!(a.allocation_info(y.handle.unwrap()).unwrap().pool, RIGID);
    a.free(y.handle.unwrap()).unwrap();
    // ... but an aligned one would cut it: it skips the pool.
    let e = a
        .malloc_aligned(5 * MIB, 4 * MIB, 1, MallocFlags::NO_RETRY)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let seg = a.segments().find(|s| s.pool_id == RIGID).unwrap();
    assert_eq!(seg.block_count, 1, "the pool's segment is still whole");
    a.check_invariants().unwrap();
}

#[test]
fn an_oversize_block_keeps_its_rest() {
    // 22 MiB is below max_split_size (24 MiB); padded for 4 MiB it is not.
    let mut a = allocator("max_split_size_mb:24");
    let x = a
        .malloc_aligned(22 * MIB, 4 * MIB, 0, MallocFlags::empty())
        .unwrap();
    assert_eq!(x.ptr.0 % (4 * MIB), 0);
    let seg = a.segments().next().unwrap();
    let end = seg.address.0 + seg.total_size;
    assert_eq!(
        x.ptr.0 + x.size,
        end,
        "no remainder split off the oversize block"
    );
    assert_eq!(a.stats().oversize_allocations.current, 1);
    a.free(x.handle.unwrap()).unwrap();
    assert_eq!(
        a.segments().next().unwrap().block_count,
        1,
        "merged back whole"
    );
    a.check_invariants().unwrap();
}

#[test]
fn a_segment_base_that_is_not_512_aligned_is_a_contract_error() {
    use cachealloc_core::testing::TinyBackend;
    let mut a = DeviceAllocator::new(
        TinyBackend {
            next: (1 << 40) + 256, // what CUDA documents: 256-byte alignment
            ..TinyBackend::default()
        },
        [BlockSlot::VACANT; 16],
        Config::DEFAULT,
    );
    let e = a.malloc(4096, 0).unwrap_err();
    assert!(e.to_string().contains("not 512-byte aligned"), "{e}");
    assert_eq!(a.backend().held, 0, "the segment was handed back");
    a.check_invariants().unwrap();
}
