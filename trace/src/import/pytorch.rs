//! PyTorch's memory snapshot as it is read: the dict that
//! `torch.cuda.memory._snapshot()` returns, pickled by `_dump_snapshot`
//! (any protocol; the reader runs no code and knows no class, so a
//! snapshot that needs one is refused), or the same dict as JSON. Every
//! format variant of the real recordings is accepted: no `time_us` (older
//! PyTorch), no `frames`, no `allocator_settings`, `oom` with
//! `device_free` instead of `addr`. Keys we do not use are skipped.

use serde::Deserialize;

/// The snapshot.
#[derive(Clone, Debug, Deserialize)]
pub struct PtSnapshot {
    /// Every device's segments.
    pub segments: Vec<PtSegment>,
    /// One trace list per device index.
    #[serde(default)]
    pub device_traces: Vec<Vec<PtEntry>>,
    /// The allocator settings (PyTorch 2.3 and later).
    #[serde(default)]
    pub allocator_settings: Option<PtSettings>,
}

/// A segment.
#[derive(Clone, Debug, Deserialize)]
pub struct PtSegment {
    /// Device ordinal.
    pub device: u64,
    /// Base address (for an expandable segment: of this mapped range).
    pub address: u64,
    /// Bytes.
    pub total_size: u64,
    /// The raw stream handle.
    #[serde(default)]
    pub stream: i64,
    /// `"small"` or `"large"`.
    #[serde(default)]
    pub segment_type: Option<String>,
    /// Owning pool, `(0, 0)` for the default pools.
    #[serde(default)]
    pub segment_pool_id: Option<(u64, u64)>,
    /// Whether expandable.
    #[serde(default)]
    pub is_expandable: bool,
    /// Its blocks, in address order.
    pub blocks: Vec<PtBlock>,
}

/// A block.
#[derive(Clone, Debug, Deserialize)]
pub struct PtBlock {
    /// Bytes.
    pub size: u64,
    /// The request of its last allocation.
    #[serde(default)]
    pub requested_size: Option<u64>,
    /// `active_allocated`, `active_pending_free` (`active_awaiting_free`) or `inactive`.
    pub state: String,
}

impl PtBlock {
    /// Whether the block is live or waiting for its streams (not cached).
    pub fn is_active(&self) -> bool {
        self.state != "inactive"
    }
}

/// A trace entry.
#[derive(Clone, Debug, Deserialize)]
pub struct PtEntry {
    /// `alloc`, `free_requested`, `free_completed`, `segment_alloc`,
    /// `segment_free`, `segment_map`, `segment_unmap`, `snapshot`, `oom`, ...
    pub action: String,
    /// Block or segment address (every action but `oom`).
    #[serde(default)]
    pub addr: Option<u64>,
    /// The device's free bytes (`oom`).
    #[serde(default)]
    pub device_free: Option<u64>,
    /// Bytes (see PyTorch's `record_trace` call sites).
    #[serde(default)]
    pub size: u64,
    /// The raw stream handle.
    #[serde(default)]
    pub stream: i64,
    /// Microseconds since the epoch (PyTorch 2.1 and later).
    #[serde(default)]
    pub time_us: Option<i64>,
    /// The entry's pool, `(0, 0)` for the default pools (PyTorch 2.12 and
    /// later).
    #[serde(default)]
    pub pool_id: Option<(u64, u64)>,
}

/// The allocator settings PyTorch records.
#[derive(Clone, Debug, Deserialize)]
pub struct PtSettings {
    /// The settings string in force.
    #[serde(rename = "PYTORCH_CUDA_ALLOC_CONF", default)]
    pub conf: String,
    /// Whether expandable segments were on.
    #[serde(default)]
    pub expandable_segments: bool,
}

/// Read a snapshot: JSON if `bytes` starts like JSON, else a pickle.
pub fn read_snapshot(bytes: &[u8]) -> Result<PtSnapshot, String> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        return serde_json::from_slice(bytes).map_err(|e| format!("not a snapshot in JSON ({e})"));
    }
    // `pickled`, serde-pickle's fork: PyTorch's pickles share frame dicts
    // and strings through the memo, which serde-pickle 1.2's memo reference
    // counting loses track of ("recursive structure found" on every real
    // snapshot; birkenfeld/serde-pickle#24).
    pickled::from_slice(bytes, pickled::DeOptions::new())
        .map_err(|e| format!("not a PyTorch memory snapshot pickle ({e})"))
}
