//! The snapshot dict: `torch.cuda.memory._snapshot()`'s keys and types, as
//! serde structures (PyTorch's `int64_t`s as Python ints).

use crate::device::settings_dict;
use cachealloc_core::AllocatorSettings;
use serde::Serialize;
use std::collections::BTreeMap;

/// Python ints as PyTorch writes them (its `int64_t`s): memory_viz's older
/// unpickler refuses integers longer than 8 bytes, and the pickle crate
/// writes a `u64` of 2^31 or more in 9 (a sign byte after 8), so values are
/// written as `i64`s (every address and size is below 2^63).
mod py_int {
    use serde::{Serialize, Serializer};

    struct Int(u64);

    impl Serialize for Int {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            one(&self.0, s)
        }
    }

    pub fn one<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        match i64::try_from(*v) {
            Ok(i) => s.serialize_i64(i),
            Err(_) => s.serialize_u64(*v),
        }
    }

    pub fn opt<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_some(&Int(*x)),
            None => s.serialize_none(),
        }
    }

    pub fn pair<S: Serializer>(v: &(u64, u64), s: S) -> Result<S::Ok, S::Error> {
        (Int(v.0), Int(v.1)).serialize(s)
    }

    pub fn opt_pair<S: Serializer>(v: &Option<(u64, u64)>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some((a, b)) => s.serialize_some(&(Int(*a), Int(*b))),
            None => s.serialize_none(),
        }
    }
}

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// What happened there.
    pub name: String,
    /// The trace file.
    pub filename: String,
    /// Its line.
    #[serde(serialize_with = "py_int::one")]
    pub line: u64,
}

/// A block of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockDict {
    /// Its address.
    #[serde(serialize_with = "py_int::one")]
    pub address: u64,
    /// Its size.
    #[serde(serialize_with = "py_int::one")]
    pub size: u64,
    /// The request of its last allocation.
    #[serde(serialize_with = "py_int::one")]
    pub requested_size: u64,
    /// `active_allocated`, `active_pending_free` or `inactive`.
    pub state: &'static str,
    /// Where it was allocated.
    pub frames: Vec<Frame>,
}

/// A segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentDict {
    /// The device.
    pub device: u32,
    /// Its base.
    #[serde(serialize_with = "py_int::one")]
    pub address: u64,
    /// Its size.
    #[serde(serialize_with = "py_int::one")]
    pub total_size: u64,
    /// Bytes of allocated blocks.
    #[serde(serialize_with = "py_int::one")]
    pub allocated_size: u64,
    /// Bytes of allocated or pending blocks.
    #[serde(serialize_with = "py_int::one")]
    pub active_size: u64,
    /// Requests of active blocks.
    #[serde(serialize_with = "py_int::one")]
    pub requested_size: u64,
    /// Its stream.
    #[serde(serialize_with = "py_int::one")]
    pub stream: u64,
    /// `small` or `large`.
    pub segment_type: &'static str,
    /// Its pool (`(0, 0)`: the default pools).
    #[serde(serialize_with = "py_int::pair")]
    pub segment_pool_id: (u64, u64),
    /// Whether expandable.
    pub is_expandable: bool,
    /// Where it was allocated (not recorded: empty).
    pub frames: Vec<Frame>,
    /// Its blocks, in address order.
    pub blocks: Vec<BlockDict>,
}

/// A trace entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceDict {
    /// The action (`alloc`, `free_requested`, ...).
    pub action: &'static str,
    /// The address (every action but `oom`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "py_int::opt")]
    pub addr: Option<u64>,
    /// The device's free bytes (`oom` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "py_int::opt")]
    pub device_free: Option<u64>,
    /// Bytes.
    #[serde(serialize_with = "py_int::one")]
    pub size: u64,
    /// The stream.
    #[serde(serialize_with = "py_int::one")]
    pub stream: u64,
    /// When.
    #[serde(serialize_with = "py_int::one")]
    pub time_us: u64,
    /// Where (present when the entry has a context).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<Frame>,
    /// The pool of the block or segment (`(0, 0)`: the default pools;
    /// torch 2.12 on writes it as `pool_id`). memory_viz does not read it:
    /// its private-pool view finds an entry's pool from the snapshot's
    /// segments (`segment_pool_id`) by address.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "py_int::opt_pair")]
    pub pool_id: Option<(u64, u64)>,
    /// The same pool under the key memory_viz looks for on a trace entry
    /// before it looks the address up in the segments (a key torch does
    /// not write): written for private pools only, so that an allocation
    /// of a pool whose segments are gone by the snapshot still shows in
    /// its pool. Default-pool entries keep torch's keys exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(serialize_with = "py_int::opt_pair")]
    pub segment_pool_id: Option<(u64, u64)>,
}

/// An annotation (PyTorch's `external_annotations` entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AnnotationDict {
    /// Its name.
    pub name: String,
    /// `START` (ours are points).
    pub stage: &'static str,
    /// The device.
    pub device: u32,
    /// When.
    #[serde(serialize_with = "py_int::one")]
    pub time_us: u64,
}

/// The allocator settings (PyTorch's `AllocatorConfigInfo`, its key names).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingsDict {
    /// The settings string as given.
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF")]
    pub conf: String,
    /// `max_split_size` (-1: unlimited).
    pub max_split_size: i64,
    /// `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// PyTorch's pinned-memory thread count.
    pub pinned_num_register_threads: u32,
    /// `release_lock_on_cudamalloc`.
    pub release_lock_on_cudamalloc: bool,
    /// PyTorch's pinned-memory setting.
    pub pinned_use_cuda_host_register: bool,
    /// `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
    /// Divisions per size bucket, keyed "1", "2", "4", ... (MiB).
    pub roundup_power2_divisions: BTreeMap<String, u32>,
    /// The pinned allocator's cache bound in bytes, -1 when unset (as
    /// `max_split_size`: memory_viz reads no int beyond 8 bytes); torch 2.13
    /// on write the key, and the import reads the release off it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cached_size: Option<i64>,
    /// The pinned allocator's rounding bound (as `max_cached_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_round_threshold: Option<i64>,
}

/// The snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotDict {
    /// Every device's segments, by device then address.
    pub segments: Vec<SegmentDict>,
    /// One trace list per device index.
    pub device_traces: Vec<Vec<TraceDict>>,
    /// The settings (of the first device).
    pub allocator_settings: SettingsDict,
    /// Annotations.
    pub external_annotations: Vec<AnnotationDict>,
    /// cachealloc's accounting of each device's memory by pool (a key
    /// memory_viz and PyTorch's readers ignore).
    pub cachealloc_fragmentation: Vec<FragmentationDict>,
    /// The pinned host allocator's segments and history: empty (host
    /// memory is not cachealloc's), written as torch 2.14 on write them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_segments: Option<Vec<u64>>,
    /// (As `host_segments`.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_traces: Option<Vec<u64>>,
}

/// One pool's memory (`PoolMemory`), in a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolMemoryDict {
    /// Bytes of mapped segments.
    #[serde(serialize_with = "py_int::one")]
    pub reserved_bytes: u64,
    /// Bytes of the blocks handed out.
    #[serde(serialize_with = "py_int::one")]
    pub allocated_bytes: u64,
    /// Bytes their callers asked for.
    #[serde(serialize_with = "py_int::one")]
    pub requested_bytes: u64,
    /// Bytes of cached blocks.
    #[serde(serialize_with = "py_int::one")]
    pub free_bytes: u64,
    /// The largest cached block.
    #[serde(serialize_with = "py_int::one")]
    pub largest_free_block: u64,
    /// Cached blocks.
    #[serde(serialize_with = "py_int::one")]
    pub free_blocks: u64,
    /// Bytes of freed blocks waiting on events.
    #[serde(serialize_with = "py_int::one")]
    pub pending_free_bytes: u64,
    /// Expandable segments' address space with no page mapped.
    #[serde(serialize_with = "py_int::one")]
    pub unmapped_bytes: u64,
    /// 1 - largest free block / free bytes.
    pub external_fragmentation: f64,
    /// Allocated minus requested bytes.
    #[serde(serialize_with = "py_int::one")]
    pub rounding_waste: u64,
}

impl From<&cachealloc_core::PoolMemory> for PoolMemoryDict {
    fn from(m: &cachealloc_core::PoolMemory) -> Self {
        PoolMemoryDict {
            reserved_bytes: m.reserved_bytes,
            allocated_bytes: m.allocated_bytes,
            requested_bytes: m.requested_bytes,
            free_bytes: m.free_bytes,
            largest_free_block: m.largest_free_block,
            free_blocks: m.free_blocks,
            pending_free_bytes: m.pending_free_bytes,
            unmapped_bytes: m.unmapped_bytes,
            external_fragmentation: m.external_fragmentation(),
            rounding_waste: m.rounding_waste(),
        }
    }
}

/// One device's memory by pool (`Fragmentation`), in a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FragmentationDict {
    /// The device.
    pub device: u32,
    /// Every pool.
    pub total: PoolMemoryDict,
    /// The default small pool.
    pub small_pool: PoolMemoryDict,
    /// The default large pool.
    pub large_pool: PoolMemoryDict,
    /// Every private pool together.
    pub private_pools: PoolMemoryDict,
    /// Bytes cached in the default pools in blocks of the default stream.
    #[serde(serialize_with = "py_int::one")]
    pub default_stream_free_bytes: u64,
    /// Bytes cached in the default pools in blocks of other streams.
    #[serde(serialize_with = "py_int::one")]
    pub other_streams_free_bytes: u64,
}

impl FragmentationDict {
    /// Device `device`'s accounting `f`.
    pub fn of(device: u32, f: &cachealloc_core::Fragmentation) -> Self {
        FragmentationDict {
            device,
            total: (&f.device).into(),
            small_pool: (&f.small_pool).into(),
            large_pool: (&f.large_pool).into(),
            private_pools: (&f.private_pools).into(),
            default_stream_free_bytes: f.stream_free_bytes,
            other_streams_free_bytes: f.other_streams_free_bytes,
        }
    }
}

impl SnapshotDict {
    /// An empty snapshot with the settings `settings` (`conf`: the settings
    /// string as given).
    pub fn new(settings: AllocatorSettings, conf: &str) -> Self {
        SnapshotDict {
            segments: Vec::new(),
            device_traces: Vec::new(),
            allocator_settings: settings_dict(settings, conf),
            external_annotations: Vec::new(),
            cachealloc_fragmentation: Vec::new(),
            host_segments: None,
            host_traces: None,
        }
    }
}
