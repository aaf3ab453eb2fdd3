//! Private pools whose segments come from a [`SegmentSource`] (PyTorch's
//! `MemPool(allocator=...)`): the source's calls, PyTorch's rules for such
//! pools, and its failures.

use super::tiny;
use crate::backend::DevicePtr;
use crate::config::Config;
use crate::error::Error;
use crate::private_pool::{MempoolId, PoolOptions, SegmentSource, StreamFilter};
use std::boxed::Box;
use std::string::ToString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::vec::Vec;

const M: MempoolId = MempoolId(0, 7);

/// The counting source's state, by context word (each test its own).
struct Counts {
    allocs: AtomicU64,
    frees: AtomicU64,
    releases: AtomicU64,
    /// Bytes handed out and not yet given back.
    live: AtomicU64,
    /// The next address, handed out downwards from 1 << 44.
    next: AtomicU64,
    /// Refuse allocations (an out-of-memory source).
    dry: AtomicU64,
}

static TABLE: Mutex<Vec<&'static Counts>> = Mutex::new(Vec::new());

fn counts(ctx: usize) -> &'static Counts {
    TABLE.lock().unwrap()[ctx]
}

fn alloc(ctx: usize, size: u64, _stream: u64) -> Option<DevicePtr> {
    let c = counts(ctx);
    if c.dry.load(Ordering::SeqCst) != 0 {
        return None;
    }
    c.allocs.fetch_add(1, Ordering::SeqCst);
    c.live.fetch_add(size, Ordering::SeqCst);
    // Each segment below the last: the newest has the lowest address.
    Some(DevicePtr(c.next.fetch_sub(size, Ordering::SeqCst) - size))
}

fn free(ctx: usize, _ptr: DevicePtr, size: u64, _stream: u64) {
    let c = counts(ctx);
    c.frees.fetch_add(1, Ordering::SeqCst);
    c.live.fetch_sub(size, Ordering::SeqCst);
}

fn release(ctx: usize) {
    counts(ctx).releases.fetch_add(1, Ordering::SeqCst);
}

/// A source with counters of its own; its context word.
pub(super) fn counting_source() -> SegmentSource {
    let c: &'static Counts = Box::leak(Box::new(Counts {
        allocs: AtomicU64::new(0),
        frees: AtomicU64::new(0),
        releases: AtomicU64::new(0),
        live: AtomicU64::new(0),
        next: AtomicU64::new(1 << 44),
        dry: AtomicU64::new(0),
    }));
    let mut t = TABLE.lock().unwrap();
    t.push(c);
    SegmentSource::new(alloc, free, t.len() - 1).with_release(release)
}

/// An allocator with pool `M` on a counting source, every request routed
/// there; the source's counts.
fn routed_to_a_source_pool() -> (super::Tiny, &'static Counts) {
    let mut t = tiny();
    let src = counting_source();
    t.create_pool_with_source(M, PoolOptions::NONE, src)
        .unwrap();
    t.begin_allocate_to_pool(M, StreamFilter::All).unwrap();
    (t, counts(src.ctx))
}

#[test]
fn segments_come_from_the_source_and_go_back_to_it() {
    let (mut t, c) = routed_to_a_source_pool();
    let x = t.malloc(3 << 20, 0).unwrap();
    let y = t.malloc(1000, 0).unwrap();
    t.end_allocate_to_pool(M).unwrap();
    // A default-pool request goes to the device, not the source.
    let d = t.malloc(1000, 0).unwrap();
    assert_eq!(c.allocs.load(Ordering::SeqCst), 2);
    assert_eq!(c.live.load(Ordering::SeqCst), (20 << 20) + (2 << 20));
    assert!(x.ptr.0 < 1 << 44 && y.ptr.0 < 1 << 44 && d.ptr.0 < 1 << 44);
    assert_eq!(t.backend().held, 2 << 20);
    assert_eq!(t.stats().segment.all().current, 3);
    assert_eq!(t.stats().num_device_alloc, 3);
    t.check_invariants().unwrap();
    t.free(x.handle.unwrap()).unwrap();
    t.free(y.handle.unwrap()).unwrap();
    // In use: empty_cache keeps its segments.
    t.empty_cache().unwrap();
    assert_eq!(c.frees.load(Ordering::SeqCst), 0);
    t.release_pool(M).unwrap(); // the routing's user (use_mem_pool's exit)
    t.release_pool(M).unwrap(); // ~MemPool
    t.empty_cache().unwrap();
    assert_eq!(c.frees.load(Ordering::SeqCst), 2);
    assert_eq!(c.live.load(Ordering::SeqCst), 0);
    assert_eq!(c.releases.load(Ordering::SeqCst), 1, "the pool is deleted");
    assert!(t.pool_info(M).is_none());
    assert_eq!(t.stats().num_device_free, 2);
    t.check_invariants().unwrap();
}

#[test]
fn a_pool_with_a_source_never_maps_pages() {
    let (mut t, c) = routed_to_a_source_pool();
    t.set_config(Config::parse("expandable_segments:True").unwrap());
    // 3 MiB from a 20 MiB plain segment, split by the plain rule (more
    // than 1 MiB remains), not page by page.
    let x = t.malloc(3 << 20, 0).unwrap();
    let y = t.malloc(19 << 20, 0).unwrap();
    t.end_allocate_to_pool(M).unwrap();
    assert_eq!(c.allocs.load(Ordering::SeqCst), 2);
    assert_eq!(t.stats().reserved_bytes.all().current, 40 << 20);
    // The second request (19 MiB) does not fit the 17 MiB remainder: its
    // own 20 MiB segment, whose 1 MiB tail is not split off (plain rule:
    // more than 1 MiB must remain).
    assert_eq!(t.allocation_info(y.handle.unwrap()).unwrap().size, 20 << 20);
    assert_eq!(t.allocation_info(x.handle.unwrap()).unwrap().size, 3 << 20);
    // The default pool maps pages as configured (a 20 MiB page of the
    // large pool's segment).
    let d = t.malloc(3 << 20, 0).unwrap();
    assert_eq!(t.allocation_info(d.handle.unwrap()).unwrap().size, 3 << 20);
    assert_eq!(t.stats().reserved_bytes.all().current, 60 << 20);
    assert_eq!(t.pool_info(M).unwrap().segments, 2);
    t.check_invariants().unwrap();
}

#[test]
fn a_dry_source_is_an_out_of_memory_and_the_ladder_goes_on() {
    let (mut t, c) = routed_to_a_source_pool();
    let x = t.malloc(1000, 0).unwrap();
    c.dry.store(1, Ordering::SeqCst);
    let e = t.malloc(30 << 20, 0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(t.stats().num_ooms, 1);
    assert_eq!(t.stats().num_alloc_retries, 1);
    // Nothing changed in the pool: its one segment, its live block.
    assert_eq!(t.pool_info(M).unwrap().segments, 1);
    c.dry.store(0, Ordering::SeqCst);
    t.free(x.handle.unwrap()).unwrap();
    t.end_allocate_to_pool(M).unwrap();
    t.check_invariants().unwrap();
}

#[test]
fn a_bad_address_from_the_source_goes_back_to_it() {
    fn bad(_: usize, _: u64, _: u64) -> Option<DevicePtr> {
        Some(DevicePtr(12345)) // not 512-byte aligned
    }
    static FREED: AtomicU64 = AtomicU64::new(0);
    fn back(_: usize, p: DevicePtr, _: u64, _: u64) {
        FREED.store(p.0, Ordering::SeqCst);
    }
    let mut t = tiny();
    t.create_pool_with_source(M, PoolOptions::NONE, SegmentSource::new(bad, back, 0))
        .unwrap();
    t.begin_allocate_to_pool(M, StreamFilter::All).unwrap();
    let e = t.malloc(1000, 0).unwrap_err();
    assert!(matches!(e, Error::BackendContract { .. }), "{e}");
    assert!(e.to_string().contains("512-byte aligned"), "{e}");
    assert_eq!(FREED.load(Ordering::SeqCst), 12345);
    assert_eq!(t.stats().segment.all().current, 0);
    t.check_invariants().unwrap();
}

#[test]
fn a_source_pool_must_be_new() {
    let mut t = tiny();
    t.create_pool(M, PoolOptions::NONE).unwrap();
    let e = t
        .create_pool_with_source(M, PoolOptions::NONE, counting_source())
        .unwrap_err();
    assert!(matches!(e, Error::PoolExists { id: M }), "{e}");
    assert!(e.to_string().contains("allocator of its own"), "{e}");
    // Another user of a source pool takes no source: the pool keeps its own.
    let n = MempoolId(0, 8);
    t.create_pool_with_source(n, PoolOptions::NONE.no_split(), counting_source())
        .unwrap();
    t.create_pool(n, PoolOptions::NONE).unwrap();
    let info = t.pool_info(n).unwrap();
    assert!(info.has_source && info.options.no_split && info.use_count == 2);
    let e = t
        .create_pool_with_source(MempoolId::DEFAULT, PoolOptions::NONE, counting_source())
        .unwrap_err();
    assert!(matches!(e, Error::UnknownPool { .. }), "{e}");
}
