//! TensorFlow's `Allocator` interface (`tsl/framework/allocator.h`), the
//! way the runtimes of the TensorFlow / XLA family embed an allocator, over
//! the same thread-safe caching allocator. Names are Rust's; each call's
//! docs give TensorFlow's. What TensorFlow and its BFC allocator do, with
//! the sources read, is in `docs/tf-allocator-notes.md`.
//!
//! TensorFlow's allocators have no stream: a [`TfAllocator`] serves every
//! request on the stream it was made with (a device's compute stream, as a
//! TF device allocator is per device). Where TensorFlow CHECK-fails (an
//! unknown pointer), the calls here return an error value.
//!
//! It works over any [`SharedAllocator`] (the thread-safe
//! [`CachingAllocator`] of any backend).
//!
//! ```
//! use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator};
//! use cachealloc_mock::MockDevice;
//! use cachealloc_tf::{AllocationAttributes, TfAllocator, ALLOCATOR_ALIGNMENT};
//! let tf = TfAllocator::new(
//!     CachingAllocator::new(DeviceAllocator::new(
//!         MockDevice::new(None), [BlockSlot::VACANT; 64], Config::DEFAULT)),
//!     0, // the stream every request is for
//! );
//! let p = tf.allocate_raw(ALLOCATOR_ALIGNMENT, 1000)?;
//! assert_eq!(tf.requested_size(p)?, 1000);
//! assert_eq!(tf.allocated_size(p)?, 1024);
//! let q = tf.allocate_raw_with(4096, 10, &AllocationAttributes::NO_RETRY)?;
//! assert_eq!(q.0 % 4096, 0);
//! assert_eq!(tf.get_stats()?.num_allocs, 2);
//! tf.deallocate_raw(p)?;
//! tf.deallocate_raw(q)?;
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use cachealloc_core::{
    BlockSlot, CachingAllocator, DeviceAllocator, DeviceBackend, DevicePtr, Error, HistoryStorage,
    MallocFlags, SharedAllocator, StatArray,
};
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

type Res<T, A> = Result<T, Error<<A as SharedAllocator>::BackendError>>;

/// TensorFlow's `AllocationAttributes`, the options of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationAttributes {
    /// `retry_on_failure` (older TensorFlow: `!no_retry_on_failure`): when
    /// false, a request the device cannot serve fails at once, without the
    /// ladder's release-everything-and-retry rung ([`MallocFlags::NO_RETRY`]).
    /// (BFC's retry waits up to 10 s for other threads' frees; PyTorch's
    /// ladder, kept here, releases the cache and retries instead.)
    pub retry_on_failure: bool,
    /// `allocation_will_be_logged`: whether the caller logs the tensor
    /// itself. Accepted for the signature; the allocator's own history
    /// (when recording) logs every allocation either way.
    pub allocation_will_be_logged: bool,
}

impl AllocationAttributes {
    /// TensorFlow's defaults: retry on failure, not logged by the caller.
    pub const DEFAULT: AllocationAttributes = AllocationAttributes {
        retry_on_failure: true,
        allocation_will_be_logged: false,
    };

    /// No retry on failure (optional scratch space, say).
    pub const NO_RETRY: AllocationAttributes = AllocationAttributes {
        retry_on_failure: false,
        allocation_will_be_logged: false,
    };
}

impl Default for AllocationAttributes {
    fn default() -> Self {
        AllocationAttributes::DEFAULT
    }
}

/// TensorFlow's `AllocatorMemoryType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryType {
    /// `kUnknown`.
    Unknown,
    /// `kDevice`: what this allocator hands out.
    Device,
    /// `kHostPageable`.
    HostPageable,
    /// `kHostPinned`.
    HostPinned,
}

/// TensorFlow's `AllocatorStats`, field for field (`int64_t` and
/// `std::optional<int64_t>`), filled from PyTorch's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// `num_allocs`: allocations made through this facade since creation
    /// or the last [`clear_stats`](TfAllocator::clear_stats).
    pub num_allocs: i64,
    /// `bytes_in_use`: bytes of the blocks handed out (rounded sizes, as
    /// BFC counts chunks; PyTorch's `allocated_bytes.all.current`).
    pub bytes_in_use: i64,
    /// `peak_bytes_in_use`: the most `bytes_in_use` since creation or the
    /// last `clear_stats` (`allocated_bytes.all.peak`).
    pub peak_bytes_in_use: i64,
    /// `largest_alloc_size`: the largest block handed out through this
    /// facade since creation or the last `clear_stats`.
    pub largest_alloc_size: i64,
    /// `bytes_limit`: the memory limit (a memory fraction), else the
    /// device's total memory.
    pub bytes_limit: Option<i64>,
    /// `bytes_reserved`: 0, as BFC leaves it (what the allocator holds from
    /// the device is `pool_bytes`).
    pub bytes_reserved: i64,
    /// `peak_bytes_reserved`: 0, as BFC leaves it.
    pub peak_bytes_reserved: i64,
    /// `bytes_reservable_limit`: none, as BFC leaves it.
    pub bytes_reservable_limit: Option<i64>,
    /// `largest_free_block_bytes`: the largest cached block.
    pub largest_free_block_bytes: i64,
    /// `pool_bytes`: bytes held from the device (PyTorch's
    /// `reserved_bytes.all.current`; BFC's region bytes).
    pub pool_bytes: Option<i64>,
    /// `peak_pool_bytes`: its peak (`reserved_bytes.all.peak`; not reset
    /// by `clear_stats`, as in BFC).
    pub peak_pool_bytes: Option<i64>,
}

/// TensorFlow's `AllocatorStats::DebugString`: eight lines, a label padded
/// to 18 columns and the value right-aligned in 20 (raw bytes).
impl fmt::Display for AllocatorStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines = [
            ("Limit:", self.bytes_limit.unwrap_or(0)),
            ("InUse:", self.bytes_in_use),
            ("MaxInUse:", self.peak_bytes_in_use),
            ("NumAllocs:", self.num_allocs),
            ("MaxAllocSize:", self.largest_alloc_size),
            ("Reserved:", self.bytes_reserved),
            ("PeakReserved:", self.peak_bytes_reserved),
            ("LargestFreeBlock:", self.largest_free_block_bytes),
        ];
        for (label, value) in lines {
            writeln!(f, "{label:<18}{value:>20}")?;
        }
        Ok(())
    }
}

/// TensorFlow's `Allocator::kAllocatorAlignment` (64), what its tensor
/// buffers ask for.
pub const ALLOCATOR_ALIGNMENT: u64 = 64;

/// TensorFlow's `Allocator` over a [`SharedAllocator`], serving every
/// request on one stream. Thread-safe as the allocator is.
///
/// What it counts itself (`num_allocs`, `largest_alloc_size`) is kept in
/// atomics beside the allocator (64-bit atomics: the 64-bit hosts TF
/// runtimes run on). Each call takes the device's lock once per allocator
/// operation, not once for the whole call as BFC's one mutex does:
/// `get_stats` reads the statistics, the cache and the limit one after the
/// other, and a `clear_stats` racing an allocation on another thread may
/// count it before or after the reset (or, between the two counters, in
/// `largest_alloc_size` but not `num_allocs`). Statistics read while other
/// threads allocate are a moment's view either way.
pub struct TfAllocator<A: SharedAllocator> {
    allocator: A,
    stream: A::Stream,
    name: &'static str,
    num_allocs: AtomicU64,
    largest: AtomicU64,
}

impl<A: SharedAllocator> TfAllocator<A> {
    /// The facade over `allocator`, for requests on `stream`.
    pub fn new(allocator: A, stream: A::Stream) -> Self {
        TfAllocator {
            allocator,
            stream,
            name: "cachealloc",
            num_allocs: AtomicU64::new(0),
            largest: AtomicU64::new(0),
        }
    }

    /// The same, with the name [`name`](Self::name) returns.
    pub fn with_name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// The allocator underneath (PyTorch's statistics, snapshots, ...).
    pub fn allocator(&self) -> &A {
        &self.allocator
    }

    /// The allocator, unwrapped.
    pub fn into_inner(self) -> A {
        self.allocator
    }

    /// `Name()`.
    pub fn name(&self) -> &str {
        self.name
    }

    /// `AllocateRaw(alignment, num_bytes)`: [`allocate_raw_with`](Self::allocate_raw_with)
    /// with the default attributes.
    pub fn allocate_raw(&self, alignment: u64, num_bytes: u64) -> Res<DevicePtr, A> {
        self.allocate_raw_with(alignment, num_bytes, &AllocationAttributes::DEFAULT)
    }

    /// `AllocateRaw(alignment, num_bytes, allocation_attr)`: `num_bytes`
    /// at a multiple of `alignment` (a power of two, else
    /// [`Error::BadAlignment`]; see `DeviceAllocator::malloc_aligned`).
    /// Zero bytes is the null pointer, as in BFC. Out of memory is an
    /// error value (TensorFlow returns null).
    pub fn allocate_raw_with(
        &self,
        alignment: u64,
        num_bytes: u64,
        attr: &AllocationAttributes,
    ) -> Res<DevicePtr, A> {
        let flags = if attr.retry_on_failure {
            MallocFlags::empty()
        } else {
            MallocFlags::NO_RETRY
        };
        let x = self
            .allocator
            .malloc_aligned(num_bytes, alignment, self.stream, flags)?;
        if x.size > 0 {
            self.num_allocs.fetch_add(1, Relaxed);
            self.largest.fetch_max(x.size, Relaxed);
        }
        Ok(x.ptr)
    }

    /// `DeallocateRaw(ptr)`: free what `allocate_raw` returned (null is a
    /// no-op; anything else unknown is an error value, where TensorFlow
    /// CHECK-fails).
    pub fn deallocate_raw(&self, ptr: DevicePtr) -> Res<(), A> {
        self.allocator.free_ptr(ptr)
    }

    /// `TracksAllocationSizes()`: true.
    pub fn tracks_allocation_sizes(&self) -> bool {
        true
    }

    /// `AllocatesOpaqueHandle()`: false (device memory, not handles).
    pub fn allocates_opaque_handle(&self) -> bool {
        false
    }

    /// `ShouldAllocateEmptyTensors()` (older TensorFlow): false.
    pub fn should_allocate_empty_tensors(&self) -> bool {
        false
    }

    /// `RequestedSize(ptr)`: the bytes asked for.
    pub fn requested_size(&self, ptr: DevicePtr) -> Res<u64, A> {
        self.allocator
            .allocation_info_ptr(ptr)
            .map(|i| i.requested_size)
    }

    /// `AllocatedSize(ptr)`: the bytes of the block (at least the request).
    pub fn allocated_size(&self, ptr: DevicePtr) -> Res<u64, A> {
        self.allocator.allocation_info_ptr(ptr).map(|i| i.size)
    }

    /// `AllocationId(ptr)`: the allocation's id, unique in this allocator
    /// (from 1, as BFC's).
    pub fn allocation_id(&self, ptr: DevicePtr) -> Res<i64, A> {
        self.allocator
            .allocation_info_ptr(ptr)
            .map(|i| i.allocation_id as i64)
    }

    /// `AllocatedSizeSlow(ptr)`: the bytes of the live allocation that
    /// contains `ptr` (its start or any byte inside it), else 0 (also on a
    /// failed device).
    pub fn allocated_size_slow(&self, ptr: DevicePtr) -> u64 {
        match self.allocator.allocation_info_ptr(ptr) {
            Ok(i) => i.size,
            Err(Error::InteriorPointer { base, .. }) => self
                .allocator
                .allocation_info_ptr(base)
                .map_or(0, |i| i.size),
            Err(_) => 0,
        }
    }

    /// `GetStats()`. Asks the device for its total memory when no memory
    /// limit is set (`bytes_limit`).
    pub fn get_stats(&self) -> Res<AllocatorStats, A> {
        let stats = self.allocator.stats()?;
        let cache = self.allocator.cache_info()?;
        let limit = match self.allocator.memory_limit()? {
            Some(l) => l,
            None => self.allocator.mem_info()?.total,
        };
        let all = |s: &StatArray| *s.all();
        let allocated = all(&stats.allocated_bytes);
        let reserved = all(&stats.reserved_bytes);
        Ok(AllocatorStats {
            num_allocs: self.num_allocs.load(Relaxed) as i64,
            bytes_in_use: allocated.current,
            peak_bytes_in_use: allocated.peak,
            largest_alloc_size: self.largest.load(Relaxed) as i64,
            // A limit past i64 (set_memory_limit(u64::MAX): no limit in
            // effect) saturates rather than wrapping to -1.
            bytes_limit: Some(i64::try_from(limit).unwrap_or(i64::MAX)),
            bytes_reserved: 0,
            peak_bytes_reserved: 0,
            bytes_reservable_limit: None,
            largest_free_block_bytes: cache.largest_block as i64,
            pool_bytes: Some(reserved.current),
            peak_pool_bytes: Some(reserved.peak),
        })
    }

    /// `ClearStats()`, as BFC does it: `num_allocs` and
    /// `largest_alloc_size` restart from 0, `peak_bytes_in_use` becomes
    /// `bytes_in_use`; nothing else changes (`peak_pool_bytes` neither).
    /// Returns true (supported; false on a failed device).
    pub fn clear_stats(&self) -> bool {
        let ok = self.allocator.reset_peak_allocated_bytes().is_ok();
        if ok {
            self.num_allocs.store(0, Relaxed);
            self.largest.store(0, Relaxed);
        }
        ok
    }

    /// `SetSafeFrontier(count)`: nothing to do (there is no `freed_by_func`
    /// timestamping).
    pub fn set_safe_frontier(&self, _count: u64) {}

    /// `GetMemoryType()`: device memory.
    pub fn memory_type(&self) -> MemoryType {
        MemoryType::Device
    }
}

/// A facade over a device allocator (made thread-safe) and the stream of
/// its requests.
impl<B, S, const E: usize, H, const P: usize> From<(DeviceAllocator<B, S, E, H, P>, B::Stream)>
    for TfAllocator<CachingAllocator<B, S, E, H, P>>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
    CachingAllocator<B, S, E, H, P>: SharedAllocator<Stream = B::Stream>,
{
    fn from((a, stream): (DeviceAllocator<B, S, E, H, P>, B::Stream)) -> Self {
        TfAllocator::new(CachingAllocator::new(a), stream)
    }
}
