//! [`SharedAllocator`]: every operation a front end asks of one device's
//! allocator, taking `&self`, object safe. It is implemented once, for the
//! thread-safe [`CachingAllocator`], and every front end goes through it:
//! [`MultiDeviceAllocator`](crate::MultiDeviceAllocator), the TensorFlow
//! facade (`cachealloc-tf`) and the C library. Its methods are made from
//! the operation table (`operations.rs`): a new operation is written on
//! [`DeviceAllocator`] and as an entry of the table, and every front end
//! has it. (The replay
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
use crate::config::Config;
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

    // Every operation of the table (`operations.rs`).
    crate::operations!([declare]);

    // Outside the table: they answer for a failed device too.

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

    crate::operations!([define]);

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
