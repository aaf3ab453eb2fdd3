//! [`SharedAllocator`]: every operation a front end asks of one device's
//! allocator, taking `&self`, object safe. It is implemented once, for the
//! thread-safe [`CachingAllocator`], and every front end goes through it:
//! [`MultiDeviceAllocator`](crate::MultiDeviceAllocator), the TensorFlow
//! facade (`cachealloc-tf`) and the C library. A new operation is written
//! on [`DeviceAllocator`] and here, and every front end has it. (The replay
//! drives each device's `DeviceAllocator` itself: it owns them, one thread
//! each, and a lock per event would cost it about a fifth of its speed.)
//!
//! Callers that need several operations under one lock use
//! [`CachingAllocator::with`] (a closure, not a guard: a `no_std` guard's
//! drop cannot tell a panic from a normal return, and a panic while the
//! lock is held must fail the device).
//!
//! ```
//! # use cachealloc_mock::MockDevice;
//! use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator, SharedAllocator};
//! let a = CachingAllocator::new(DeviceAllocator::new(
//!     MockDevice::new(None), [BlockSlot::VACANT; 64], Config::DEFAULT));
//! let dev: &dyn SharedAllocator<Stream = u64, BackendError = cachealloc_mock::MockError> = &a;
//! let x = dev.malloc(4096, 0)?;
//! dev.free_ptr(x.ptr)?;
//! assert_eq!(dev.stats()?.allocation.all().allocated, 1);
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```

use crate::allocation::{Allocation, AllocationInfo, MallocFlags};
#[allow(unused_imports)] // the operations' docs link to it
use crate::allocator::DeviceAllocator;
use crate::allocator::{CheckpointBlock, PagesShare, RestoreCounts, ShareableHandle};
use crate::arena::{BlockId, BlockSlot};
use crate::backend::{DeviceBackend, DevicePtr, MemInfo, PeerAccess};
use crate::caching::CachingAllocator;
use crate::error::Error;
use crate::fragmentation::{Fragmentation, PoolMemory};
use crate::history::{HistoryStorage, OutOfMemoryObserver, TraceActions, TraceTracker};
use crate::invariants::InvariantViolation;
use crate::oom_cause::OomCause;
use crate::pool::Pool;
use crate::private_pool::{MempoolId, PoolInfo, PoolOptions, SegmentSource, StreamFilter};
use crate::segment_table::SegmentRegistry;
use crate::snapshot::{CacheInfo, Segments, Snapshot};
use crate::stats::{DeviceStats, StatArray};

/// A result of a [`SharedAllocator`] call.
pub type SharedResult<T, E> = Result<T, Error<E>>;

/// One device's caching allocator, shared between threads: every operation
/// of the front ends, each under the device's lock for that one call.
/// Streams are the backend's (`From<u64>` and `Into<u64>`, so a front end
/// that has raw handles converts with `.into()`). Every call on a device a
/// panic failed returns [`Error::DeviceFailed`].
pub trait SharedAllocator: Sync {
    /// The backend's stream.
    type Stream: Copy + From<u64> + Into<u64>;
    /// The backend's error (the `source()` of [`Error::Backend`]).
    type BackendError: core::error::Error + 'static;

    // -- allocation ------------------------------------------------------

    /// [`DeviceAllocator::malloc`].
    fn malloc(
        &self,
        size: u64,
        stream: Self::Stream,
    ) -> SharedResult<Allocation, Self::BackendError>;
    /// [`DeviceAllocator::malloc_with`].
    fn malloc_with(
        &self,
        size: u64,
        stream: Self::Stream,
        flags: MallocFlags,
    ) -> SharedResult<Allocation, Self::BackendError>;
    /// [`DeviceAllocator::malloc_aligned`].
    fn malloc_aligned(
        &self,
        size: u64,
        alignment: u64,
        stream: Self::Stream,
        flags: MallocFlags,
    ) -> SharedResult<Allocation, Self::BackendError>;
    /// [`DeviceAllocator::malloc_with_address`].
    fn malloc_with_address(
        &self,
        size: u64,
        addr: DevicePtr,
        stream: Self::Stream,
    ) -> SharedResult<Allocation, Self::BackendError>;
    /// [`DeviceAllocator::free`].
    fn free(&self, id: BlockId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::free_ptr`].
    fn free_ptr(&self, ptr: DevicePtr) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::record_stream`].
    fn record_stream(
        &self,
        id: BlockId,
        stream: Self::Stream,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::record_stream_ptr`].
    fn record_stream_ptr(
        &self,
        ptr: DevicePtr,
        stream: Self::Stream,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::allocation_info`].
    fn allocation_info(
        &self,
        id: BlockId,
    ) -> SharedResult<AllocationInfo<Self::Stream>, Self::BackendError>;
    /// [`DeviceAllocator::allocation_info_ptr`].
    fn allocation_info_ptr(
        &self,
        ptr: DevicePtr,
    ) -> SharedResult<AllocationInfo<Self::Stream>, Self::BackendError>;
    /// [`DeviceAllocator::base_allocation`].
    fn base_allocation(&self, ptr: DevicePtr)
        -> SharedResult<(DevicePtr, u64), Self::BackendError>;
    /// Whether `ptr` lies in a segment of this device (under its lock; a
    /// [`SegmentRegistry`] answers without it).
    fn owns(&self, ptr: DevicePtr) -> SharedResult<bool, Self::BackendError>;

    // -- the cache and the device ---------------------------------------

    /// [`DeviceAllocator::empty_cache`].
    fn empty_cache(&self) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::cache_info`].
    fn cache_info(&self) -> SharedResult<CacheInfo, Self::BackendError>;
    /// [`DeviceAllocator::fragmentation`].
    fn fragmentation(
        &self,
        stream: Self::Stream,
    ) -> SharedResult<Fragmentation, Self::BackendError>;
    /// [`DeviceAllocator::last_oom_cause`]: the device's, whichever thread
    /// ran out (an out-of-memory observer is told its own).
    fn last_oom_cause(&self) -> SharedResult<Option<OomCause>, Self::BackendError>;
    /// [`DeviceAllocator::oom_cause`]: the verdict on out-of-memory number
    /// `seq` of the device (a failed call's, by its error's number).
    fn oom_cause(&self, seq: u32) -> SharedResult<Option<OomCause>, Self::BackendError>;
    /// [`DeviceAllocator::pool_memory`].
    fn pool_memory(
        &self,
        id: MempoolId,
        pool: Pool,
    ) -> SharedResult<PoolMemory, Self::BackendError>;
    /// [`DeviceAllocator::set_memory_fraction`].
    fn set_memory_fraction(&self, fraction: f64) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::set_memory_limit`] (`None`:
    /// [`clear_memory_limit`](DeviceAllocator::clear_memory_limit)).
    fn set_memory_limit(&self, bytes: Option<u64>) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::memory_limit`].
    fn memory_limit(&self) -> SharedResult<Option<u64>, Self::BackendError>;
    /// [`DeviceAllocator::memory_fraction`].
    fn memory_fraction(&self) -> SharedResult<f64, Self::BackendError>;
    /// The device's free and total memory, from the backend.
    fn mem_info(&self) -> SharedResult<MemInfo, Self::BackendError>;
    /// The device's ordinal.
    fn ordinal(&self) -> SharedResult<u32, Self::BackendError>;
    /// [`DeviceAllocator::has_expandable_segments`].
    fn has_expandable_segments(&self) -> SharedResult<bool, Self::BackendError>;

    // -- statistics ------------------------------------------------------

    /// A copy of the statistics (the lock is held only for the copy).
    fn stats(&self) -> SharedResult<DeviceStats, Self::BackendError>;
    /// [`DeviceAllocator::reset_peak_stats`].
    fn reset_peak_stats(&self) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::reset_peak_allocated_bytes`].
    fn reset_peak_allocated_bytes(&self) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::reset_accumulated_stats`].
    fn reset_accumulated_stats(&self) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::reserved_bytes_by_private_pools`] (`f` runs under
    /// the lock).
    fn reserved_bytes_by_private_pools(
        &self,
        f: &mut dyn FnMut(MempoolId, &StatArray),
    ) -> SharedResult<(), Self::BackendError>;

    // -- history, observers, snapshots -----------------------------------

    /// [`DeviceAllocator::record_history`].
    fn record_history(
        &self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::record_annotation`].
    fn record_annotation(&self, id: u64) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::attach_trace_tracker`]: [`Error::CallbacksFull`]
    /// when the device has as many trackers as it holds.
    fn attach_trace_tracker(
        &self,
        tracker: &'static dyn TraceTracker,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::attach_out_of_memory_observer`]:
    /// [`Error::CallbacksFull`] when the device has as many observers as it
    /// holds. Observers are called after the device's lock is released.
    fn attach_out_of_memory_observer(
        &self,
        observer: &'static dyn OutOfMemoryObserver,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::snapshot`] (it records its `snapshot` entry),
    /// given to `f` under the lock.
    fn snapshot(
        &self,
        f: &mut dyn FnMut(Snapshot<'_, Self::Stream>),
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::segments`] (nothing recorded), given to `f` under
    /// the lock with the device's ordinal.
    fn segments(
        &self,
        f: &mut dyn FnMut(u32, Segments<'_, Self::Stream>),
    ) -> SharedResult<(), Self::BackendError>;

    // -- private pools (CUDA graphs, MemPool) -----------------------------

    /// [`DeviceAllocator::create_pool`].
    fn create_pool(
        &self,
        id: MempoolId,
        options: PoolOptions,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::create_pool_with_source`].
    fn create_pool_with_source(
        &self,
        id: MempoolId,
        options: PoolOptions,
        source: SegmentSource,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::begin_allocate_to_pool`]: from now on, requests
    /// on the streams `filter` accepts (from any thread) go to pool `id`.
    fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter<Self::Stream>,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::end_allocate_to_pool`].
    fn end_allocate_to_pool(&self, id: MempoolId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::capture_begin`].
    fn capture_begin(
        &self,
        id: MempoolId,
        filter: StreamFilter<Self::Stream>,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::capture_end`].
    fn capture_end(&self, id: MempoolId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::release_pool`].
    fn release_pool(&self, id: MempoolId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::pool_use_count`].
    fn pool_use_count(&self, id: MempoolId) -> SharedResult<u32, Self::BackendError>;
    /// [`DeviceAllocator::pool_info`].
    fn pool_info(&self, id: MempoolId) -> SharedResult<Option<PoolInfo>, Self::BackendError>;
    /// [`DeviceAllocator::set_use_on_oom`].
    fn set_use_on_oom(&self, id: MempoolId, on: bool) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::set_no_split`].
    fn set_no_split(&self, id: MempoolId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::empty_cache_pool`].
    fn empty_cache_pool(&self, id: MempoolId) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::check_pool_live_allocations`].
    fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        ptrs: &[DevicePtr],
    ) -> SharedResult<bool, Self::BackendError>;
    /// [`DeviceAllocator::checkpoint_len`].
    fn checkpoint_len(&self, id: MempoolId) -> SharedResult<usize, Self::BackendError>;
    /// [`DeviceAllocator::checkpoint_pool`]: how many blocks of `out` it
    /// filled.
    fn checkpoint_pool(
        &self,
        id: MempoolId,
        out: &mut [CheckpointBlock],
    ) -> SharedResult<usize, Self::BackendError>;
    /// [`DeviceAllocator::restore_pool`].
    fn restore_pool(
        &self,
        id: MempoolId,
        blocks: &[CheckpointBlock],
        freed: &mut [DevicePtr],
        allocated: &mut [Allocation],
    ) -> SharedResult<RestoreCounts, Self::BackendError>;

    // -- IPC, peers, copies -----------------------------------------------

    /// [`DeviceAllocator::share_ipc_handle`].
    fn share_ipc_handle(&self, ptr: DevicePtr)
        -> SharedResult<ShareableHandle, Self::BackendError>;
    /// [`DeviceAllocator::release_ipc_share`].
    fn release_ipc_share(&self, ptr: DevicePtr) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::open_ipc_handle`].
    fn open_ipc_handle(
        &self,
        handle: &ShareableHandle,
    ) -> SharedResult<DevicePtr, Self::BackendError>;
    /// [`DeviceAllocator::close_ipc_handle`].
    fn close_ipc_handle(&self, handle: &ShareableHandle) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::share_ipc_pages`].
    fn share_ipc_pages(
        &self,
        ptr: DevicePtr,
        fds: &mut [i32],
    ) -> SharedResult<PagesShare, Self::BackendError>;
    /// [`DeviceAllocator::open_ipc_pages`].
    fn open_ipc_pages(
        &self,
        pid: u32,
        share: &PagesShare,
        fds: &[i32],
    ) -> SharedResult<DevicePtr, Self::BackendError>;
    /// [`DeviceAllocator::close_ipc_pages`].
    fn close_ipc_pages(
        &self,
        pid: u32,
        share: &PagesShare,
        fds: &[i32],
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::enable_peer_access`].
    fn enable_peer_access(&self, peer: u32) -> SharedResult<PeerAccess, Self::BackendError>;
    /// A device-to-device copy of `bytes` on `stream`: plain
    /// ([`DeviceAllocator::memcpy_async`]), or through the driver's peer
    /// copy with `peer` = the destination's and the source's devices
    /// ([`DeviceAllocator::memcpy_peer_async`]).
    fn memcpy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Self::Stream,
        peer: Option<(u32, u32)>,
    ) -> SharedResult<(), Self::BackendError>;

    // -- the device's place in a process ----------------------------------

    /// [`DeviceAllocator::attach_segment_registry`].
    fn attach_segment_registry(
        &self,
        registry: &'static dyn SegmentRegistry,
        device: u32,
    ) -> SharedResult<(), Self::BackendError>;
    /// [`DeviceAllocator::detach_segment_registry`].
    fn detach_segment_registry(&self) -> SharedResult<(), Self::BackendError>;
    /// Whether a call panicked while it held the lock: the device refuses
    /// every call from then on ([`Error::DeviceFailed`]).
    fn is_failed(&self) -> bool;
    /// [`DeviceAllocator::check_invariants`]; a failed device fails it.
    fn check_invariants(&self) -> Result<(), InvariantViolation>;
}

impl<B, S, const E: usize, H, const P: usize> SharedAllocator for CachingAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
    Self: Sync,
{
    type Stream = B::Stream;
    type BackendError = B::Error;

    #[inline]
    fn malloc(&self, size: u64, stream: B::Stream) -> SharedResult<Allocation, B::Error> {
        self.try_growing(|a| a.malloc(size, stream))
    }

    #[inline]
    fn malloc_with(
        &self,
        size: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> SharedResult<Allocation, B::Error> {
        self.try_growing(|a| a.malloc_with(size, stream, flags))
    }

    #[inline]
    fn malloc_aligned(
        &self,
        size: u64,
        alignment: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> SharedResult<Allocation, B::Error> {
        self.try_growing(|a| a.malloc_aligned(size, alignment, stream, flags))
    }

    fn malloc_with_address(
        &self,
        size: u64,
        addr: DevicePtr,
        stream: B::Stream,
    ) -> SharedResult<Allocation, B::Error> {
        self.try_growing(|a| a.malloc_with_address(size, addr, stream))
    }

    #[inline]
    fn free(&self, id: BlockId) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.free(id))
    }

    #[inline]
    fn free_ptr(&self, ptr: DevicePtr) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.free_ptr(ptr))
    }

    #[inline]
    fn record_stream(&self, id: BlockId, stream: B::Stream) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.record_stream(id, stream))
    }

    #[inline]
    fn record_stream_ptr(&self, ptr: DevicePtr, stream: B::Stream) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.record_stream_ptr(ptr, stream))
    }

    fn allocation_info(&self, id: BlockId) -> SharedResult<AllocationInfo<B::Stream>, B::Error> {
        self.try_with(|a| a.allocation_info(id))
    }

    fn allocation_info_ptr(
        &self,
        ptr: DevicePtr,
    ) -> SharedResult<AllocationInfo<B::Stream>, B::Error> {
        self.try_with(|a| a.allocation_info_ptr(ptr))
    }

    fn base_allocation(&self, ptr: DevicePtr) -> SharedResult<(DevicePtr, u64), B::Error> {
        self.try_with(|a| a.base_allocation(ptr))
    }

    fn owns(&self, ptr: DevicePtr) -> SharedResult<bool, B::Error> {
        self.with(|a| a.owns(ptr))
    }

    fn empty_cache(&self) -> SharedResult<(), B::Error> {
        self.try_growing(|a| a.empty_cache())
    }

    fn cache_info(&self) -> SharedResult<CacheInfo, B::Error> {
        self.with(|a| a.cache_info())
    }

    fn fragmentation(&self, stream: B::Stream) -> SharedResult<Fragmentation, B::Error> {
        self.with(|a| a.fragmentation(stream))
    }

    fn last_oom_cause(&self) -> SharedResult<Option<OomCause>, B::Error> {
        self.with(|a| a.last_oom_cause())
    }

    fn oom_cause(&self, seq: u32) -> SharedResult<Option<OomCause>, B::Error> {
        self.with(|a| a.oom_cause(seq))
    }

    fn pool_memory(&self, id: MempoolId, pool: Pool) -> SharedResult<PoolMemory, B::Error> {
        self.try_with(|a| a.pool_memory(id, pool))
    }

    fn set_memory_fraction(&self, fraction: f64) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.set_memory_fraction(fraction))
    }

    fn set_memory_limit(&self, bytes: Option<u64>) -> SharedResult<(), B::Error> {
        self.with(|a| match bytes {
            Some(b) => a.set_memory_limit(b),
            None => a.clear_memory_limit(),
        })
    }

    fn memory_limit(&self) -> SharedResult<Option<u64>, B::Error> {
        self.with(|a| a.memory_limit())
    }

    fn memory_fraction(&self) -> SharedResult<f64, B::Error> {
        self.try_with(|a| a.memory_fraction())
    }

    fn mem_info(&self) -> SharedResult<MemInfo, B::Error> {
        self.try_with(|a| a.backend_mut().mem_info().map_err(Error::Backend))
    }

    fn ordinal(&self) -> SharedResult<u32, B::Error> {
        self.with(|a| a.backend().ordinal())
    }

    fn has_expandable_segments(&self) -> SharedResult<bool, B::Error> {
        self.with(|a| a.has_expandable_segments())
    }

    #[inline]
    fn stats(&self) -> SharedResult<DeviceStats, B::Error> {
        self.with(|a| *a.stats())
    }

    fn reset_peak_stats(&self) -> SharedResult<(), B::Error> {
        self.with(|a| a.reset_peak_stats())
    }

    fn reserved_bytes_by_private_pools(
        &self,
        f: &mut dyn FnMut(MempoolId, &StatArray),
    ) -> SharedResult<(), B::Error> {
        self.with(|a| a.reserved_bytes_by_private_pools(|id, s| f(id, s)))
    }

    fn reset_peak_allocated_bytes(&self) -> SharedResult<(), B::Error> {
        self.with(|a| a.reset_peak_allocated_bytes())
    }

    fn reset_accumulated_stats(&self) -> SharedResult<(), B::Error> {
        self.with(|a| a.reset_accumulated_stats())
    }

    fn record_history(
        &self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) -> SharedResult<(), B::Error> {
        self.with(|a| a.record_history(enabled, max_entries, clear, skip))
    }

    fn record_annotation(&self, id: u64) -> SharedResult<(), B::Error> {
        self.with(|a| a.record_annotation(id))
    }

    fn attach_trace_tracker(
        &self,
        tracker: &'static dyn TraceTracker,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| {
            a.attach_trace_tracker(tracker)
                .map_err(|_| callbacks_full("trace trackers"))
        })
    }

    fn attach_out_of_memory_observer(
        &self,
        observer: &'static dyn OutOfMemoryObserver,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| {
            a.attach_out_of_memory_observer(observer)
                .map_err(|_| callbacks_full("out-of-memory observers"))
        })
    }

    fn snapshot(&self, f: &mut dyn FnMut(Snapshot<'_, B::Stream>)) -> SharedResult<(), B::Error> {
        self.with(|a| f(a.snapshot()))
    }

    fn segments(
        &self,
        f: &mut dyn FnMut(u32, Segments<'_, B::Stream>),
    ) -> SharedResult<(), B::Error> {
        self.with(|a| f(a.backend().ordinal(), a.segments()))
    }

    fn create_pool(&self, id: MempoolId, options: PoolOptions) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.create_pool(id, options))
    }

    fn create_pool_with_source(
        &self,
        id: MempoolId,
        options: PoolOptions,
        source: SegmentSource,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.create_pool_with_source(id, options, source))
    }

    fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.begin_allocate_to_pool(id, filter))
    }

    fn end_allocate_to_pool(&self, id: MempoolId) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.end_allocate_to_pool(id))
    }

    fn capture_begin(
        &self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.capture_begin(id, filter))
    }

    fn capture_end(&self, id: MempoolId) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.capture_end(id))
    }

    fn release_pool(&self, id: MempoolId) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.release_pool(id))
    }

    fn pool_use_count(&self, id: MempoolId) -> SharedResult<u32, B::Error> {
        self.with(|a| a.pool_use_count(id))
    }

    fn pool_info(&self, id: MempoolId) -> SharedResult<Option<PoolInfo>, B::Error> {
        self.with(|a| a.pool_info(id))
    }

    fn set_use_on_oom(&self, id: MempoolId, on: bool) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.set_use_on_oom(id, on))
    }

    fn set_no_split(&self, id: MempoolId) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.set_no_split(id))
    }

    fn empty_cache_pool(&self, id: MempoolId) -> SharedResult<(), B::Error> {
        self.try_growing(|a| a.empty_cache_pool(id))
    }

    fn check_pool_live_allocations(
        &self,
        id: MempoolId,
        ptrs: &[DevicePtr],
    ) -> SharedResult<bool, B::Error> {
        self.try_with(|a| a.check_pool_live_allocations(id, ptrs))
    }

    fn checkpoint_len(&self, id: MempoolId) -> SharedResult<usize, B::Error> {
        self.try_with(|a| a.checkpoint_len(id))
    }

    fn checkpoint_pool(
        &self,
        id: MempoolId,
        out: &mut [CheckpointBlock],
    ) -> SharedResult<usize, B::Error> {
        self.try_with(|a| a.checkpoint_pool(id, out).map(|b| b.len()))
    }

    fn restore_pool(
        &self,
        id: MempoolId,
        blocks: &[CheckpointBlock],
        freed: &mut [DevicePtr],
        allocated: &mut [Allocation],
    ) -> SharedResult<RestoreCounts, B::Error> {
        self.try_with(|a| a.restore_pool(id, blocks, freed, allocated))
    }

    fn share_ipc_handle(&self, ptr: DevicePtr) -> SharedResult<ShareableHandle, B::Error> {
        self.try_with(|a| a.share_ipc_handle(ptr))
    }

    fn release_ipc_share(&self, ptr: DevicePtr) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.release_ipc_share(ptr))
    }

    fn open_ipc_handle(&self, handle: &ShareableHandle) -> SharedResult<DevicePtr, B::Error> {
        self.try_with(|a| a.open_ipc_handle(handle))
    }

    fn close_ipc_handle(&self, handle: &ShareableHandle) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.close_ipc_handle(handle))
    }

    fn share_ipc_pages(
        &self,
        ptr: DevicePtr,
        fds: &mut [i32],
    ) -> SharedResult<PagesShare, B::Error> {
        self.try_with(|a| a.share_ipc_pages(ptr, fds))
    }

    fn open_ipc_pages(
        &self,
        pid: u32,
        share: &PagesShare,
        fds: &[i32],
    ) -> SharedResult<DevicePtr, B::Error> {
        self.try_with(|a| a.open_ipc_pages(pid, share, fds))
    }

    fn close_ipc_pages(
        &self,
        pid: u32,
        share: &PagesShare,
        fds: &[i32],
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.close_ipc_pages(pid, share, fds))
    }

    fn enable_peer_access(&self, peer: u32) -> SharedResult<PeerAccess, B::Error> {
        self.try_with(|a| a.enable_peer_access(peer))
    }

    fn memcpy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: B::Stream,
        peer: Option<(u32, u32)>,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| match peer {
            None => a.memcpy_async(dst, src, bytes, stream),
            Some((dd, sd)) => a.memcpy_peer_async(dst, dd, src, sd, bytes, stream),
        })
    }

    fn attach_segment_registry(
        &self,
        registry: &'static dyn SegmentRegistry,
        device: u32,
    ) -> SharedResult<(), B::Error> {
        self.try_with(|a| a.attach_segment_registry(registry, device))
    }

    fn detach_segment_registry(&self) -> SharedResult<(), B::Error> {
        self.with(|a| a.detach_segment_registry())
    }

    fn is_failed(&self) -> bool {
        CachingAllocator::is_failed(self)
    }

    fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.with(|a| a.check_invariants())
            .unwrap_or(Err(InvariantViolation::new(
                "device failed: a call panicked while it held the device's lock",
                None,
                0,
                1,
            )))
    }
}

/// A device's full list of callbacks of kind `what`.
fn callbacks_full<E>(what: &'static str) -> Error<E> {
    Error::CallbacksFull {
        what,
        capacity: crate::allocator::MAX_CALLBACKS,
    }
}
