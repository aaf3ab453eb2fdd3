//! One device's segments, history and annotations added to a snapshot
//! dict, and the allocator settings as PyTorch names them.

use crate::dict::{
    AnnotationDict, BlockDict, FragmentationDict, Frame, SegmentDict, SettingsDict, SnapshotDict,
    TraceDict,
};
use cachealloc_core::{AllocatorSettings, BlockState, Snapshot, TorchVersion, TraceAction};
use std::collections::HashMap;

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

/// The `allocator_settings` dict of `s` (`conf`: the settings string as
/// given).
pub fn settings_dict(s: AllocatorSettings, conf: &str) -> SettingsDict {
    let c = s.config;
    let since_2_13 = c.torch_version().decisions_of() >= TorchVersion::V2_13;
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
        // torch 2.13 on (the keys the import tells the release by).
        max_cached_size: since_2_13.then_some(pinned_bytes(c.host.pinned_max_cached_size_mb)),
        max_round_threshold: since_2_13
            .then_some(pinned_bytes(c.host.pinned_max_round_threshold_mb)),
    }
}

/// A pinned size in MiB in bytes, -1 when unset.
fn pinned_bytes(mb: u64) -> i64 {
    match mb {
        0 => -1,
        mb => i64::try_from(mb.saturating_mul(1 << 20)).unwrap_or(i64::MAX),
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
    // torch 2.14 on write the pinned host allocator's (empty here).
    if snap.settings.config.torch_version().decisions_of() >= TorchVersion::V2_14 {
        dict.host_segments.get_or_insert_with(Vec::new);
        dict.host_traces.get_or_insert_with(Vec::new);
    }
    dict.cachealloc_fragmentation
        .push(FragmentationDict::of(device, &snap.fragmentation));
    if dict.device_traces.len() <= idx {
        dict.device_traces.resize_with(idx + 1, Vec::new);
    }
    // Trace entries name their pool from torch 2.12 on (its `memory.py`'s
    // `pool_id`).
    let with_pool_ids = snap.settings.config.torch_version() >= TorchVersion::V2_12;
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
            pool_id: with_pool_ids.then_some((e.pool.0, e.pool.1)),
            segment_pool_id: (!e.pool.is_default()).then_some((e.pool.0, e.pool.1)),
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
