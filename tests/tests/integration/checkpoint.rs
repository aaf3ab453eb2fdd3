//! Private-pool checkpoints (PyTorch's `getCheckpointState` /
//! `setCheckpointPoolState`, what cudagraph trees rewind a shared pool
//! with): a restore brings back the recorded layout block for block, at the
//! same addresses, without a device call; a restore that cannot be done
//! changes nothing.

use cachealloc_core::{
    Allocation, BlockSlot, BlockState, CheckpointBlock, Config, DeviceAllocator, DevicePtr, Error,
    MempoolId, StreamFilter,
};
use cachealloc_mock::MockDevice;

type A = DeviceAllocator<MockDevice, Vec<BlockSlot>>;
const POOL: MempoolId = MempoolId(1, 0);

fn allocator() -> A {
    DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 256],
        Config::DEFAULT,
    )
}

/// A segment: its base and its blocks' (offset, size, state).
type Layout = (u64, Vec<(u64, u64, BlockState)>);

/// The pool's segments.
fn layout(a: &A) -> Vec<Layout> {
    a.segments()
        .filter(|s| s.pool_id == POOL)
        .map(|s| {
            let base = s.address.0;
            (
                base,
                s.blocks()
                    .map(|b| (b.address.0 - base, b.size, b.state))
                    .collect(),
            )
        })
        .collect()
}

/// A recording into the pool: two segments, allocated and free blocks.
fn record(a: &mut A) -> Vec<Allocation> {
    a.capture_begin(POOL, StreamFilter::stream(1)).unwrap();
    let xs: Vec<Allocation> = [4096, 8192, 2 << 20, 3 << 20, 512]
        .iter()
        .map(|&n| a.malloc(n, 1).unwrap())
        .collect();
    a.free(xs[1].handle.unwrap()).unwrap(); // a hole in the small segment
    a.free(xs[2].handle.unwrap()).unwrap(); // a hole in the large one
    a.capture_end(POOL).unwrap();
    xs
}

#[test]
fn restore_brings_back_the_recorded_layout() {
    let mut a = allocator();
    let xs = record(&mut a);
    let recorded = layout(&a);
    let mut cp = vec![CheckpointBlock::EMPTY; a.checkpoint_len(POOL).unwrap()];
    let cp = a.checkpoint_pool(POOL, &mut cp).unwrap().to_vec();
    assert_eq!(cp.len(), recorded.iter().map(|s| s.1.len()).sum::<usize>());

    // The program goes on: frees what it recorded, allocates elsewhere in
    // the pool (a new segment too).
    for x in [xs[0], xs[3]] {
        a.free(x.handle.unwrap()).unwrap();
    }
    a.begin_allocate_to_pool(POOL, StreamFilter::stream(1))
        .unwrap();
    let y = a.malloc(1000, 1).unwrap();
    let z = a.malloc(30 << 20, 1).unwrap();
    a.end_allocate_to_pool(POOL).unwrap();
    let (reserved, calls) = (
        a.stats().reserved_bytes.all().current,
        a.backend().counters().total,
    );

    let mut freed = vec![DevicePtr::NULL; 8];
    let mut made = vec![Allocation::NULL; 8];
    let n = a.restore_pool(POOL, &cp, &mut freed, &mut made).unwrap();
    a.check_invariants().unwrap();
    let mut freed = freed[..n.freed].to_vec();
    freed.sort();
    let mut expect_freed = vec![xs[4].ptr, y.ptr, z.ptr];
    expect_freed.sort();
    assert_eq!(
        freed, expect_freed,
        "every allocation of the pool was freed"
    );
    let made: Vec<_> = made[..n.allocated]
        .iter()
        .map(|m| (m.ptr, m.size, m.requested_size))
        .collect();
    let want: Vec<_> = cp
        .iter()
        .filter(|b| b.allocated)
        .map(|b| (b.ptr, b.size, b.size))
        .collect();
    assert_eq!(
        made, want,
        "the recorded allocations, the block size as request"
    );
    // The recorded segments have their layout back; the later segment is whole and free.
    let now = layout(&a);
    for seg in &recorded {
        assert!(
            now.contains(seg),
            "segment {:#x} not restored: {now:?}",
            seg.0
        );
    }
    assert!(now
        .iter()
        .filter(|s| !recorded.iter().any(|r| r.0 == s.0))
        .all(|s| s.1.len() == 1 && s.1[0].2 == BlockState::Inactive));
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        reserved,
        "no segment came or went"
    );
    assert_eq!(a.backend().counters().total, calls, "no device call");
    // The restored allocations are ordinary: freed by pointer, reused.
    for m in &want {
        a.free_ptr(m.0).unwrap();
    }
    assert_eq!(a.check_pool_live_allocations(POOL, &[]), Ok(true));
    a.check_invariants().unwrap();
}

#[test]
fn a_restore_that_cannot_be_done_changes_nothing() {
    let mut a = allocator();
    let xs = record(&mut a);
    let mut store = vec![CheckpointBlock::EMPTY; 16];
    let cp = a.checkpoint_pool(POOL, &mut store).unwrap().to_vec();
    let before = (
        layout(&a),
        a.stats().allocation.all().allocated,
        a.history().len(),
    );
    let mut freed = vec![DevicePtr::NULL; 8];
    let mut made = vec![Allocation::NULL; 8];
    let refused =
        |a: &mut A, cp: &[CheckpointBlock], freed: &mut [DevicePtr], made: &mut [Allocation]| {
            match a.restore_pool(POOL, cp, freed, made) {
                Err(Error::Checkpoint { what, .. }) => what,
                other => panic!("expected a refusal, got {other:?}"),
            }
        };
    // A segment that is not the pool's.
    let mut wrong = cp.clone();
    let first_len = 1 + wrong[1..].iter().position(|b| b.segment_start).unwrap();
    for b in &mut wrong[..first_len] {
        b.ptr = DevicePtr(b.ptr.0 + (1 << 40));
    }
    assert!(refused(&mut a, &wrong, &mut freed, &mut made).contains("could not find"));
    // A segment of another size.
    let mut shorter = cp.clone();
    let last = shorter.iter().rposition(|b| !b.segment_start).unwrap();
    shorter.remove(last);
    assert!(refused(&mut a, &shorter, &mut freed, &mut made).contains("size"));
    // Blocks that do not tile their segment.
    let mut gap = cp.clone();
    gap[1].ptr = DevicePtr(gap[1].ptr.0 + 512);
    assert!(refused(&mut a, &gap, &mut freed, &mut made).contains("tile"));
    // Outputs too short.
    assert!(refused(&mut a, &cp, &mut freed[..0], &mut made).contains("too short"));
    // A routing to the pool.
    a.begin_allocate_to_pool(POOL, StreamFilter::stream(1))
        .unwrap();
    assert!(refused(&mut a, &cp, &mut freed, &mut made).contains("routed"));
    a.end_allocate_to_pool(POOL).unwrap();
    // A block of the pool used on another stream.
    a.record_stream(xs[0].handle.unwrap(), 2).unwrap();
    assert!(refused(&mut a, &cp, &mut freed, &mut made).contains("stream uses"));
    assert_eq!(
        (
            layout(&a),
            a.stats().allocation.all().allocated,
            a.history().len()
        ),
        before,
        "a refused restore changed the allocator"
    );
    a.check_invariants().unwrap();
    // Checkpoint storage too short.
    let mut tiny = [CheckpointBlock::EMPTY; 2];
    assert!(matches!(
        a.checkpoint_pool(POOL, &mut tiny),
        Err(Error::Checkpoint { .. })
    ));
    assert!(matches!(
        a.checkpoint_pool(MempoolId(9, 9), &mut store),
        Err(Error::UnknownPool { .. })
    ));
}
