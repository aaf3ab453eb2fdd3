//! # cachealloc-core
//!
//! The block / segment / pool algorithm of PyTorch's CUDA caching allocator
//! (`DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`), as a
//! `no_std` crate that never allocates on the host and is generic over a
//! [`DeviceBackend`] (device malloc / free, events, memory info).
//!
//! ```text
//!  device memory, as the backend hands it out (one `malloc` = one segment)
//!
//!  segment 0 (small pool, 2 MiB)            segment 1 (large pool, 20 MiB)
//!  +------+------+--------------------+      +-----------+----------------------+
//!  | A 512| B 1K |  free 2095616      |      | C 5 MiB   |  free 15 MiB         |
//!  +------+------+--------------------+      +-----------+----------------------+
//!   ^ head: the slot at the segment base      blocks tile the segment exactly;
//!     keeps its handle for the segment's      no two neighbours are both free
//!     whole life                              (a free merges with free neighbours)
//!
//!  host metadata (out of band, fixed capacity, no heap):
//!    [BlockSlot; N]  one slot per block, addressed by a u32 index + generation
//!      - segment list:  prev / next            (address order inside a segment)
//!      - free index:    exact (stream, size, address) order per pool (best fit):
//!                       256 size classes under a two-level bitmap, each a treap
//!      - segment index: treap keyed by base address (pointer lookups, snapshots)
//!      - live index:    hash chains from pointer to allocated block (free by ptr)
//! ```
//!
//! A request is rounded (512 B, or `roundup_power2_divisions`), sent to the
//! small pool (<= 1 MiB) or the large pool, and served by the smallest cached
//! block of the same stream that fits (lowest address among equal sizes).
//! On a miss the allocator runs PyTorch's ladder: free-memory callbacks,
//! garbage collection, a device malloc of a new segment (2 MiB, 20 MiB, or
//! the request rounded to 2 MiB), releasing oversize cached blocks, releasing
//! every cached segment and retrying, and finally an out-of-memory error that
//! carries the numbers of PyTorch's message.
//!
//! Every statistic of `torch.cuda.memory_stats()` is kept with PyTorch's
//! semantics ([`DeviceStats`]) and can be listed under the same flat key
//! names without allocating ([`DeviceStats::for_each`]).
//! [`DeviceAllocator::check_invariants`] re-derives all of it from the block
//! lists and is shared by unit tests, integration tests and fuzz targets.
//!
//! ```
//! use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
//! # use cachealloc_mock::MockDevice;
//! let storage = [BlockSlot::VACANT; 64];
//! let mut alloc =
//!     DeviceAllocator::new(MockDevice::new(None), storage, Config::DEFAULT);
//! let a = alloc.malloc(1000, 0)?;
//! assert_eq!(a.size, 1024);
//! alloc.free(a.handle.expect("non-empty allocation"))?;
//! assert_eq!(alloc.stats().reserved_bytes.all().current, 2 << 20);
//! alloc.check_invariants().expect("consistent");
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

#[cfg(any(test, feature = "std", loom))]
extern crate std;

mod allocation;
mod allocator;
mod arena;
pub mod backend;
mod bin_map;
pub mod caching;
pub mod config;
mod error;
mod events;
mod fragmentation;
mod free_index;
pub mod history;
mod index;
mod invariants;
mod live;
mod oom_cause;
mod operations;
pub mod policy;
mod pool;
mod private_pool;
mod segment_index;
mod segment_table;
mod shared;
mod snapshot;
pub mod stats;
mod sync;
#[cfg(any(test, loom, feature = "testing"))]
pub mod testing;
mod torch_version;

pub use allocation::{Allocation, AllocationInfo, MallocFlags};
pub use allocator::{
    needs_peer_copy, CheckpointBlock, DeviceAllocator, FreeAccess, FreeMemoryCallback, PagesShare,
    RestoreCounts, ShareableHandle, DEFAULT_EVENTS, DEFAULT_IPC_HANDLES, DEFAULT_IPC_SHARES,
    DEFAULT_POOLS, MAX_CALLBACKS, OOM_CAUSES_KEPT,
};
pub use arena::{BlockId, BlockSlot};
pub use backend::{
    DeviceBackend, DevicePtr, EventStatus, IpcMemHandle, MallocError, MemInfo, PeerAccess, VmError,
    NO_MARKER,
};
pub use caching::{CachingAllocator, DeviceAllocation, MultiDeviceAllocator};
pub use config::{Config, ConfigError, ConfigItems, Oddity, Policy};
pub use error::{Error, Explained, NotShareable, OomReport, PytorchMessage};
pub use fragmentation::{Fragmentation, PoolMemory};
pub use history::{
    History, HistoryEntries, HistoryStorage, NoHistory, OutOfMemoryObserver, TraceAction,
    TraceActions, TraceEntry, TraceTracker,
};
pub use invariants::InvariantViolation;
pub use oom_cause::{OomCause, OomClass};
pub use operations::{CFunction, Operation, OPERATIONS};
pub use pool::Pool;
pub use private_pool::{MempoolId, PoolInfo, PoolOptions, SegmentSource, StreamFilter};
pub use segment_table::{MoreSlots, RegistryRefusal, SegmentRegistry, SegmentSlot, SegmentTable};
pub use shared::{SharedAllocator, SharedResult};
pub use snapshot::{
    AllocatorSettings, BlockInfo, BlockState, Blocks, CacheInfo, SegmentInfo, Segments, Snapshot,
};
pub use stats::{DeviceStats, Stat, StatArray};
pub use torch_version::{BlockOrder, TorchVersion};
