//! [`Report`]: what a replay measured, and its JSON (the replay contract of
//! the design).

use crate::snapshot::Dropped;
use cachealloc_core::{DeviceStats, OomClass, PoolInfo};
use cachealloc_mock::RealAddressUse;
use cachealloc_snapshot::{memory_stats_keys, FragmentationDict, SnapshotDict};

/// The result of a replay.
#[non_exhaustive]
pub struct Report {
    /// The trace file.
    pub trace: String,
    /// The header's `source`.
    pub source: String,
    /// The config string.
    pub conf: String,
    /// Device capacity in force.
    pub capacity: Option<u64>,
    /// Events.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Of which, by verdict (`OomClass::index`).
    pub oom_classes: [u64; cachealloc_core::OomClass::COUNT],
    /// The first out-of-memory: where and why.
    pub first_oom: Option<crate::FirstOom>,
    /// Per device, where its reserved memory is after the last event
    /// (cachealloc's accounting; the default stream's view).
    pub fragmentation: Vec<(u64, cachealloc_core::Fragmentation)>,
    /// Peak of the sum of requested sizes of live allocations.
    pub peak_live_bytes: u64,
    /// Peak reserved bytes (summed over devices' peaks).
    pub peak_reserved_bytes: u64,
    /// Per device: its index and statistics.
    pub devices: Vec<(u64, DeviceStats)>,
    /// Per device (as `devices`): the peak of its live requested bytes.
    pub device_peak_live: Vec<u64>,
    /// The private pools that exist at the end: (device, pool).
    pub pools: Vec<(u64, PoolInfo)>,
    /// The torch release whose decisions the replay took.
    pub torch_version: cachealloc_core::TorchVersion,
    /// Each private pool's reserved bytes, deleted pools too (torch 2.13's
    /// `reserved_bytes_by_private_pools`): (device, pool, statistics).
    pub pool_reserved: Vec<(u64, cachealloc_core::MempoolId, cachealloc_core::StatArray)>,
    /// Per device, how the recorded malloc addresses were used (with
    /// `Options::real_addresses`; empty otherwise).
    pub real_addresses: Vec<(u64, RealAddressUse)>,
    /// Block slots per device: (device, the most in use at once, the
    /// storage's slots at the end).
    pub slots: Vec<(u64, u32, u32)>,
    /// The snapshot, when asked for, and the trace entries each device's
    /// history dropped.
    pub snapshot: Option<(SnapshotDict, Dropped)>,
    /// Wall time of the whole run: reading, decompressing, parsing, replaying.
    pub total_seconds: f64,
    /// Time spent reading, decompressing and parsing, summed over the
    /// threads that did it (for a large file, other threads than the
    /// replay's: it can exceed `total_seconds`).
    pub parse_seconds: f64,
    /// Of which replaying the parsed events: the allocator's bookkeeping on
    /// the simulated device and the replay's id map (the replay figure).
    pub replay_seconds: f64,
}

impl Report {
    /// `peak_reserved_bytes / peak_live_bytes` (with several devices, the
    /// sum of each device's peak reserved over the sum of each one's peak
    /// live bytes).
    pub fn fragmentation(&self) -> f64 {
        if self.device_peak_live.len() > 1 {
            let live: u64 = self.device_peak_live.iter().sum();
            return self.peak_reserved_bytes as f64 / live.max(1) as f64;
        }
        if self.peak_live_bytes == 0 {
            if self.peak_reserved_bytes == 0 {
                1.0
            } else {
                f64::INFINITY
            }
        } else {
            self.peak_reserved_bytes as f64 / self.peak_live_bytes as f64
        }
    }

    /// Events replayed per second of bookkeeping (parsing excluded; the
    /// figure the benchmarks quote).
    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.replay_seconds.max(1e-9)
    }

    /// Events per second of the whole run, reading and parsing included.
    pub fn end_to_end_events_per_second(&self) -> f64 {
        self.events as f64 / self.total_seconds.max(1e-9)
    }

    /// The statistics of the lowest device (device 0 in single-device traces).
    pub fn stats(&self) -> &DeviceStats {
        &self.devices[0].1
    }

    /// The JSON object of the replay contract (design.md).
    pub fn to_json(&self) -> serde_json::Value {
        let stats_json = |device: u64, s: &DeviceStats| {
            let pools: Vec<_> =
                if self.torch_version.decisions_of() >= cachealloc_core::TorchVersion::V2_13 {
                    self.pool_reserved
                        .iter()
                        .filter(|p| p.0 == device)
                        .map(|p| (p.1, p.2))
                        .collect()
                } else {
                    Vec::new()
                };
            let mut m = serde_json::Map::new();
            for (k, v) in memory_stats_keys(s, self.torch_version, &pools) {
                m.insert(k, v.into());
            }
            serde_json::Value::Object(m)
        };
        let mut v = serde_json::json!({
            "trace": self.trace,
            "source": self.source,
            "conf": self.conf,
            "capacity": self.capacity,
            "events": self.events,
            "allocs": self.allocs,
            "ooms": self.ooms,
            "torch_version": self.torch_version.to_string(),
            "memory_stats": stats_json(self.devices[0].0, self.stats()),
            "peak_live_bytes": self.peak_live_bytes,
            "device_peak_live_bytes": self.device_peak_live,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "fragmentation": self.fragmentation(),
            "num_device_alloc": self.devices.iter().map(|d| d.1.num_device_alloc).sum::<i64>(),
            "num_device_free": self.devices.iter().map(|d| d.1.num_device_free).sum::<i64>(),
            "slots_used": self.slots.iter().map(|s| u64::from(s.1)).sum::<u64>(),
            "slots_capacity": self.slots.iter().map(|s| u64::from(s.2)).sum::<u64>(),
            "replay_seconds": self.replay_seconds,
            "parse_seconds": self.parse_seconds,
            "total_seconds": self.total_seconds,
            "events_per_second": self.events_per_second(),
            "end_to_end_events_per_second": self.end_to_end_events_per_second(),
        });
        v["ooms_by_class"] = OomClass::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), self.oom_classes[c.index()].into()))
            .collect::<serde_json::Map<_, _>>()
            .into();
        v["first_oom"] = match &self.first_oom {
            None => serde_json::Value::Null,
            Some(o) => {
                let c = &o.cause;
                serde_json::json!({
                    "line": o.line,
                    "device": o.device,
                    "stream": o.stream,
                    "size": o.size,
                    "class": c.class.as_str(),
                    "needed": c.needed,
                    "live_bytes": c.live_bytes,
                    "limit": c.limit,
                    "segment": c.segment,
                    "headroom": c.headroom,
                    "free_bytes": c.free_bytes,
                    "largest_free_block": c.largest_free_block,
                    "pending_free_bytes": c.pending_free_bytes,
                    "other_streams_bytes": c.other_streams_bytes,
                    "private_pools_bytes": c.private_pools_bytes,
                    "other_size_bytes": c.other_size_bytes,
                    "unmapped_bytes": c.unmapped_bytes,
                    "message": o.message,
                })
            }
        };
        // The snapshot's `cachealloc_fragmentation` entries, as JSON.
        v["fragmentation_at_end"] = self
            .fragmentation
            .iter()
            .map(|(d, f)| {
                serde_json::to_value(FragmentationDict::of(*d as u32, f))
                    .unwrap_or(serde_json::Value::Null)
            })
            .collect();
        if !self.pools.is_empty() {
            v["pools"] = self
                .pools
                .iter()
                .map(|(d, p)| {
                    serde_json::json!({
                        "device": d,
                        "pool": [p.id.0, p.id.1],
                        "use_count": p.use_count,
                        "segments": p.segments,
                        "reserved_bytes": p.reserved_bytes,
                        "peak_reserved_bytes": p.peak_reserved_bytes,
                    })
                })
                .collect();
        }
        if !self.real_addresses.is_empty() {
            let m: serde_json::Map<_, _> = self
                .real_addresses
                .iter()
                .map(|(i, u)| {
                    (
                        i.to_string(),
                        serde_json::json!({"placed": u.placed, "missed": u.missed, "unused": u.unused}),
                    )
                })
                .collect();
            v["real_addresses"] = serde_json::Value::Object(m);
        }
        if self.devices.len() > 1 {
            let devs: serde_json::Map<_, _> = self
                .devices
                .iter()
                .map(|(i, s)| {
                    (
                        i.to_string(),
                        serde_json::json!({"memory_stats": stats_json(*i, s)}),
                    )
                })
                .collect();
            v["devices"] = serde_json::Value::Object(devs);
        }
        v
    }
}
