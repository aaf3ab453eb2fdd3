//! What a dropped `DeviceAllocator` gives back: every segment of a pool
//! whose segments come from a source of its own (cached or still holding a
//! live block) goes back to the source, the source's `release` runs once,
//! and the segment registry forgets the allocator's segments.

use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, DevicePtr, MempoolId, PoolOptions, SegmentRegistry,
    SegmentSource, SegmentTable, StreamFilter,
};
use cachealloc_mock::MockDevice;
use std::sync::atomic::{AtomicU64, Ordering};

/// What the source handed out and got back, and its releases.
static HANDED: AtomicU64 = AtomicU64::new(0);
static BACK: AtomicU64 = AtomicU64::new(0);
static RELEASED: AtomicU64 = AtomicU64::new(0);
static NEXT: AtomicU64 = AtomicU64::new(1 << 50);

fn src_alloc(_: usize, size: u64, _: u64) -> Option<DevicePtr> {
    HANDED.fetch_add(size, Ordering::SeqCst);
    Some(DevicePtr(
        NEXT.fetch_add(size.next_multiple_of(1 << 21), Ordering::SeqCst),
    ))
}
fn src_free(_: usize, _: DevicePtr, size: u64, _: u64) {
    BACK.fetch_add(size, Ordering::SeqCst);
}
fn src_release(_: usize) {
    RELEASED.fetch_add(1, Ordering::SeqCst);
}

#[test]
fn a_dropped_allocator_gives_source_segments_back_and_forgets_its_registry_entries() {
    let table: &'static SegmentTable<16> = Box::leak(Box::default());
    {
        let mut a = DeviceAllocator::new(
            MockDevice::unlimited(),
            vec![BlockSlot::VACANT; 64],
            Config::DEFAULT,
        );
        a.attach_segment_registry(table, 3).unwrap();
        let pool = MempoolId(9, 1);
        let source = SegmentSource::new(src_alloc, src_free, 0).with_release(src_release);
        a.create_pool_with_source(pool, PoolOptions::NONE, source)
            .unwrap();
        a.begin_allocate_to_pool(pool, StreamFilter::All).unwrap();
        let live = a.malloc(4 << 20, 0).unwrap();
        let cached = a.malloc(30 << 20, 0).unwrap();
        a.end_allocate_to_pool(pool).unwrap();
        a.free_ptr(cached.ptr).unwrap();
        let device = a.malloc(1 << 20, 0).unwrap();
        assert_eq!(table.count(3), 3, "two source segments and a device one");
        assert!(HANDED.load(Ordering::SeqCst) > 0 && BACK.load(Ordering::SeqCst) == 0);
        let _ = (live, device);
    }
    assert_eq!(
        BACK.load(Ordering::SeqCst),
        HANDED.load(Ordering::SeqCst),
        "every segment of the source pool went back, the live one's too"
    );
    assert_eq!(RELEASED.load(Ordering::SeqCst), 1, "release ran once");
    assert_eq!(table.count(3), 0, "the registry forgot the allocator");
}
