//! PyTorch's memory snapshot (the dict `torch.cuda.memory._snapshot()`
//! returns and pytorch.org/memory_viz reads) from a replay's allocators:
//! segments with their blocks, one trace list per device, the allocator
//! settings, and annotations. Written as a pickle (protocol 3, which
//! memory_viz's own unpickler reads) or as JSON.
//!
//! Frames: a block and a trace entry carry one frame naming the trace line
//! that made them (`{"name": "<action>", "filename": TRACE, "line": N}`), so
//! memory_viz shows where in the trace a block came from.

use crate::device::ReplayDevice;
use crate::replay::Replay;
use cachealloc_core::{AllocatorSettings, BlockState, Snapshot, TraceAction};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

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
}

/// Trace entries the ring buffers dropped, per device (not in the dict:
/// the tool reports it).
pub type Dropped = Vec<(u32, u64)>;

/// Where a snapshot's names come from: the frames of a trace entry or an
/// allocated block (from the opaque context the caller gave the entry), and
/// the names of annotations (from their ids).
pub trait SnapshotNames {
    /// The frames of an entry of `action` whose context is `context`
    /// (blocks use their last `alloc` entry's).
    fn frames(&self, action: &str, context: u64) -> Vec<Frame>;
    /// The name of annotation `id`.
    fn annotation(&self, id: u64) -> String;
}

/// A replay's names: a frame naming the trace line, `annotation N`.
struct TraceLines<'a>(&'a str);

impl SnapshotNames for TraceLines<'_> {
    fn frames(&self, action: &str, line: u64) -> Vec<Frame> {
        if line == 0 {
            return Vec::new();
        }
        vec![Frame {
            name: action.to_string(),
            filename: self.0.to_string(),
            line,
        }]
    }

    fn annotation(&self, id: u64) -> String {
        format!("annotation {id}")
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
        }
    }
}

impl<D: ReplayDevice> Replay<D> {
    /// Take a snapshot of every device (each records its `snapshot` entry),
    /// naming `trace` in the frames; `conf` is the settings string as given.
    pub fn snapshot_dict(&mut self, trace: &str, conf: &str) -> (SnapshotDict, Dropped) {
        let mut dict = SnapshotDict::new(AllocatorSettings::DEFAULT, conf);
        let mut dropped = Vec::new();
        for (k, d) in self.devices.iter_mut().enumerate() {
            let snap = d.alloc.snapshot();
            if k == 0 {
                dict.allocator_settings = settings_dict(snap.settings, conf);
            }
            dropped.push((snap.device, snap.dropped));
            add_device(&mut dict, snap, &TraceLines(trace));
        }
        (dict, dropped)
    }
}

/// The `allocator_settings` dict of `s` (`conf`: the settings string as
/// given).
pub fn settings_dict(s: AllocatorSettings, conf: &str) -> SettingsDict {
    let c = s.config;
    SettingsDict {
        conf: conf.to_string(),
        max_split_size: if c.max_split_size == u64::MAX {
            -1
        } else {
            c.max_split_size as i64
        },
        garbage_collection_threshold: c.garbage_collection_threshold,
        expandable_segments: s.expandable_segments,
        pinned_num_register_threads: s.pinned_num_register_threads,
        release_lock_on_cudamalloc: s.release_lock_on_cudamalloc,
        pinned_use_cuda_host_register: s.pinned_use_cuda_host_register,
        graph_capture_record_stream_reuse: s.graph_capture_record_stream_reuse,
        roundup_power2_divisions: c
            .roundup_power2_divisions
            .iter()
            .enumerate()
            .map(|(i, d)| ((1u64 << i).to_string(), *d))
            .collect(),
    }
}

/// Add one device's segments, history and annotations to `dict`, named by
/// `names`.
pub fn add_device<St: Into<u64> + From<u64> + Copy>(
    dict: &mut SnapshotDict,
    snap: Snapshot<'_, St>,
    names: &dyn SnapshotNames,
) {
    let device = snap.device;
    let idx = device as usize;
    if dict.device_traces.len() <= idx {
        dict.device_traces.resize_with(idx + 1, Vec::new);
    }
    // The context of the last allocation at each address: the blocks' frames.
    let mut allocated_at: HashMap<u64, u64> = HashMap::new();
    for e in snap.history {
        match e.action {
            TraceAction::Alloc => {
                allocated_at.insert(e.addr, e.context);
            }
            TraceAction::UserDefined => {
                dict.external_annotations.push(AnnotationDict {
                    name: names.annotation(e.context),
                    stage: "START",
                    device,
                    time_us: e.time_us,
                });
                continue;
            }
            _ => {}
        }
        let oom = e.action == TraceAction::Oom;
        dict.device_traces[idx].push(TraceDict {
            action: e.action.as_str(),
            addr: (!oom).then_some(e.addr),
            device_free: oom.then_some(e.addr),
            size: e.size,
            stream: e.stream,
            time_us: e.time_us,
            frames: names.frames(e.action.as_str(), e.context),
        });
    }
    for seg in snap.segments {
        let blocks = seg
            .blocks()
            .map(|b| BlockDict {
                address: b.address.0,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state.as_str(),
                frames: if b.state == BlockState::Inactive {
                    Vec::new()
                } else {
                    allocated_at
                        .get(&b.address.0)
                        .map_or(Vec::new(), |&c| names.frames("alloc", c))
                },
            })
            .collect();
        dict.segments.push(SegmentDict {
            device,
            address: seg.address.0,
            total_size: seg.total_size,
            allocated_size: seg.allocated_size,
            active_size: seg.active_size,
            requested_size: seg.requested_size,
            stream: seg.stream.into(),
            segment_type: match seg.pool {
                cachealloc_core::Pool::Small => "small",
                _ => "large",
            },
            segment_pool_id: (seg.pool_id.0, seg.pool_id.1),
            is_expandable: seg.is_expandable,
            frames: Vec::new(),
            blocks,
        });
    }
}

/// Write `dict` to `path`: JSON if it ends in `.json`, else a pickle
/// (protocol 3).
pub fn write_snapshot(path: &str, dict: &SnapshotDict) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
    let mut w = std::io::BufWriter::new(file);
    if path.ends_with(".json") {
        serde_json::to_writer(&mut w, dict).map_err(|e| format!("{path}: {e}"))?;
    } else {
        pickled::to_writer(&mut w, dict, pickled::SerOptions::new())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    std::io::Write::flush(&mut w).map_err(|e| format!("{path}: {e}"))
}
