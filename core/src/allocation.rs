//! What a caller gets from the allocator for one allocation: the per-call
//! [`MallocFlags`], the [`Allocation`] itself, and [`AllocationInfo`] (the
//! answers to TensorFlow's `RequestedSize` / `AllocatedSize` / `AllocationId`).
//! Both name their fields alike: `handle` (the [`BlockId`] to free it with),
//! `size` (the block's), `requested_size` (the caller's) and
//! `allocation_id` (a number unique to the allocation).

use crate::arena::BlockId;
use crate::backend::DevicePtr;

bitflags::bitflags! {
    /// Per-call options of [`DeviceAllocator::malloc_with`](crate::DeviceAllocator::malloc_with).
    ///
    /// ```
    /// use cachealloc_core::MallocFlags;
    /// assert!(MallocFlags::NO_RETRY.contains(MallocFlags::NO_RETRY));
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct MallocFlags: u8 {
        /// Fail at once when neither the cache nor one device malloc can serve
        /// the request: no release of cached segments, no retry (TensorFlow's
        /// `no_retry_on_failure`). The failure still counts in `num_ooms`.
        const NO_RETRY = 1 << 0;
    }
}

/// A successful allocation.
///
/// ```
/// use cachealloc_core::Allocation;
/// assert!(Allocation::NULL.ptr.is_null() && Allocation::NULL.handle.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Allocation {
    /// The device address (null for a zero-byte request).
    pub ptr: DevicePtr,
    /// The handle to free it with (`None` for a zero-byte request).
    pub handle: Option<BlockId>,
    /// The block size (rounded; may exceed the request by up to 1 MiB of unsplit slack).
    pub size: u64,
    /// The bytes asked for.
    pub requested_size: u64,
    /// A number unique to this allocation (TensorFlow's `AllocationId`).
    pub allocation_id: u64,
}

impl Allocation {
    /// What a zero-byte request returns: a null pointer, nothing to free.
    pub const NULL: Allocation = Allocation {
        ptr: DevicePtr::NULL,
        handle: None,
        size: 0,
        requested_size: 0,
        allocation_id: 0,
    };
}

/// What the allocator knows of a live allocation.
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// # use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
/// # let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let x = a.malloc(1000, 0)?;
/// let info = a.allocation_info_ptr(x.ptr)?;
/// assert_eq!((info.requested_size, info.size), (1000, 1024));
/// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AllocationInfo<St> {
    /// Its start.
    pub ptr: DevicePtr,
    /// The handle to free it with.
    pub handle: BlockId,
    /// The block size (TensorFlow's `AllocatedSize`).
    pub size: u64,
    /// The bytes asked for (TensorFlow's `RequestedSize`).
    pub requested_size: u64,
    /// Its unique number (TensorFlow's `AllocationId`).
    pub allocation_id: u64,
    /// Its allocation stream.
    pub stream: St,
    /// The pool it came from ([`MempoolId::DEFAULT`](crate::MempoolId::DEFAULT)
    /// unless a private pool).
    pub pool: crate::MempoolId,
}
