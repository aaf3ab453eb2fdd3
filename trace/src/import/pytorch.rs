//! PyTorch's memory snapshot as it is read: the dict that
//! `torch.cuda.memory._snapshot()` returns, pickled by `_dump_snapshot`
//! (any protocol; the reader runs no code and knows no class, so a
//! snapshot that needs one is refused), or the same dict as JSON. Every
//! format variant of the real recordings is accepted: no `time_us` (older
//! PyTorch), no `frames`, no `allocator_settings`, `oom` with
//! `device_free` instead of `addr`. Keys we do not use are skipped.

use cachealloc_core::TorchVersion;
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
    /// The pinned host allocator's segments (torch 2.14 and later write
    /// the key; only its presence is read).
    #[serde(default)]
    pub host_segments: Option<serde::de::IgnoredAny>,
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
    /// What the allocator's internals tagged the entry with (torch 2.15;
    /// only its presence is read).
    #[serde(default)]
    pub internal_metadata: Option<serde::de::IgnoredAny>,
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
    /// The pinned allocator's cache bound (torch 2.13 and later write the
    /// key; only its presence is read).
    #[serde(default)]
    pub max_cached_size: Option<serde::de::IgnoredAny>,
}

/// The torch release a snapshot was recorded with, as the fields torch
/// writes tell (each release's `torch.cuda.memory._snapshot()` of the same
/// allocations, read under each wheel): an entry's `internal_metadata`
/// (2.15, where the allocator tagged one), `host_segments` (2.14 on), the
/// settings' `max_cached_size` (2.13 on), the entries' `pool_id` (2.12 on);
/// entries without `pool_id`: 2.11 or older. The newest release a marker
/// names, and why; 2.14 stands for 2.14 and 2.15 alike when no entry was
/// tagged (their decisions are the same).
pub fn recorded_with(snap: &PtSnapshot) -> (TorchVersion, &'static str) {
    let entries = || snap.device_traces.iter().flatten();
    if entries().any(|e| e.internal_metadata.is_some()) {
        (
            TorchVersion::V2_15,
            "a trace entry has internal_metadata (torch 2.15)",
        )
    } else if snap.host_segments.is_some() {
        (
            TorchVersion::V2_14,
            "the snapshot has host_segments (torch 2.14 on)",
        )
    } else if snap
        .allocator_settings
        .as_ref()
        .is_some_and(|s| s.max_cached_size.is_some())
    {
        (
            TorchVersion::V2_13,
            "its settings have max_cached_size (torch 2.13 on)",
        )
    } else if entries().any(|e| e.pool_id.is_some()) {
        (
            TorchVersion::V2_12,
            "its trace entries name their pool, pool_id (torch 2.12 on)",
        )
    } else if entries().next().is_some() {
        (
            TorchVersion::V2_11,
            "its trace entries name no pool (torch 2.11 or older)",
        )
    } else {
        (
            TorchVersion::V2_11,
            "no field of a later release, and no trace entries (taken as torch 2.11 or older)",
        )
    }
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
    let bad = |e: pickled::Error| format!("not a PyTorch memory snapshot pickle ({e})");
    match pickled::from_slice(bytes, pickled::DeOptions::new()) {
        // `pickled` reads no int beyond 64 signed bits, not even to skip it,
        // and torch writes `SIZE_MAX` for an unset bound (2.13's
        // `max_cached_size`): read again, such ints saturated, none of them
        // a value this reader uses.
        Err(e) if e.to_string().contains("integer too large") => {
            let mut v = pickled::value_from_slice(bytes, pickled::DeOptions::new()).map_err(bad)?;
            saturate_big_ints(&mut v);
            pickled::from_value(v).map_err(bad)
        }
        r => r.map_err(bad),
    }
}

/// Every int of `v` beyond 64 signed bits made `i64::MAX` (`i64::MIN`
/// below).
fn saturate_big_ints(v: &mut pickled::Value) {
    use pickled::Value;
    match v {
        Value::Int(b) => {
            let text = b.to_string();
            *v = Value::I64(text.parse().unwrap_or(if text.starts_with('-') {
                i64::MIN
            } else {
                i64::MAX
            }));
        }
        Value::List(items) | Value::Tuple(items) => items.iter_mut().for_each(saturate_big_ints),
        Value::Dict(map) => map.values_mut().for_each(saturate_big_ints),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each release's marker, as that release's `_snapshot()` writes it
    /// (read under each wheel, through cachealloc's C++ allocator).
    #[test]
    fn the_release_is_read_off_the_fields() {
        let snap = |extra: &str, entry: &str| {
            let text = format!(
                r#"{{"segments": [], "device_traces": [[{{"action": "alloc", "addr": 1, "size": 512, "stream": 0{entry}}}]]{extra}}}"#
            );
            recorded_with(&read_snapshot(text.as_bytes()).expect("a snapshot")).0
        };
        assert_eq!(snap("", ""), TorchVersion::V2_11);
        assert_eq!(snap("", r#", "pool_id": [0, 0]"#), TorchVersion::V2_12);
        let settings = r#", "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_cached_size": 18446744073709551615}"#;
        assert_eq!(
            snap(settings, r#", "pool_id": [0, 0]"#),
            TorchVersion::V2_13
        );
        let host = r#", "host_segments": [], "host_traces": []"#;
        assert_eq!(snap(host, r#", "pool_id": [0, 0]"#), TorchVersion::V2_14);
        assert_eq!(
            snap(
                host,
                r#", "pool_id": [0, 0], "internal_metadata": "mallocWithAddress""#
            ),
            TorchVersion::V2_15
        );
        let bare = read_snapshot(br#"{"segments": []}"#).expect("a snapshot");
        assert_eq!(recorded_with(&bare).0, TorchVersion::V2_11);
    }

    /// torch writes `SIZE_MAX` for an unset bound, an int of 9 bytes in a
    /// pickle, which `pickled` reads nowhere: read all the same (Python's
    /// `pickle.dumps` of such a snapshot, protocol 4).
    #[test]
    fn a_pickle_with_an_int_beyond_64_bits_is_read() {
        let hex = "800495bf000000000000007d94288c087365676d656e7473945d948c12616c6c6f6361746f725f73657474696e6773947d94288c175059544f5243485f435544415f414c4c4f435f434f4e46948c00948c0f6d61785f6361636865645f73697a65948a09ffffffffffffffff00758c0d6465766963655f747261636573945d945d947d94288c06616374696f6e948c05616c6c6f63948c0461646472944d00108c0473697a65944d00028c0673747265616d944b008c07706f6f6c5f6964944b004b008694756161752e";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let snap = read_snapshot(&bytes).expect("read despite the big int");
        assert_eq!(snap.device_traces[0][0].addr, Some(4096));
        assert_eq!(recorded_with(&snap).0, TorchVersion::V2_13);
    }
}
