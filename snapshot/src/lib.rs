//! # cachealloc-snapshot
//!
//! PyTorch's memory snapshot, the dict `torch.cuda.memory._snapshot()`
//! returns and pytorch.org/memory_viz reads, built from cachealloc's
//! allocators and written as a pickle or JSON. The trace tools (`cachealloc
//! replay --snapshot`) and the C library (`cachealloc_snapshot`) both
//! write snapshots with it; it is all of the trace machinery the C library
//! links (no trace reader, replay or import).
//!
//! - [`SnapshotDict`] and its parts: the dict's keys and types.
//! - [`add_device`]: one device's segments, history and annotations, named
//!   by a [`SnapshotNames`]; [`settings_dict`]: the allocator settings.
//! - [`write_snapshot`]: to a file.
//! - [`parse_bytes`]: byte counts as people write them (`16GiB`).
//!
//! ```
//! use cachealloc_core::AllocatorSettings;
//! use cachealloc_snapshot::SnapshotDict;
//! let dict = SnapshotDict::new(AllocatorSettings::DEFAULT, "");
//! assert!(dict.segments.is_empty());
//! assert_eq!(dict.allocator_settings.max_split_size, -1);
//! ```

mod device;
mod dict;
mod stats_keys;
mod units;
mod write;

pub use device::{add_device, settings_dict, SnapshotNames};
pub use dict::{
    AnnotationDict, BlockDict, FragmentationDict, Frame, PoolMemoryDict, SegmentDict, SettingsDict,
    SnapshotDict, TraceDict,
};
pub use stats_keys::memory_stats_keys;
pub use units::parse_bytes;
pub use write::write_snapshot;
