//! PyTorch's memory snapshot of a replay's allocators (the dict and its
//! writers are `cachealloc-snapshot`'s, shared with the C library).
//!
//! Frames: a block and a trace entry carry one frame naming the trace line
//! that made them (`{"name": "<action>", "filename": TRACE, "line": N}`), so
//! memory_viz shows where in the trace a block came from.

use crate::device::ReplayDevice;
use crate::replay::Replay;
use cachealloc_core::AllocatorSettings;
use cachealloc_snapshot::{add_device, settings_dict, Frame, SnapshotDict, SnapshotNames};

/// Trace entries the ring buffers dropped, per device (not in the dict:
/// the tool reports it).
pub type Dropped = Vec<(u32, u64)>;

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
