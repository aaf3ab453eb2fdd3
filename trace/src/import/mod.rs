//! `cachealloc import`: a PyTorch memory snapshot that carries its history
//! (`device_traces`, recorded with `torch.cuda.memory._record_memory_history`)
//! as a trace that replays what the real allocator was asked to do.
//!
//! - `pytorch.rs` reads the snapshot (pickle or JSON, every format variant
//!   of the real recordings);
//! - `state.rs` walks each device's history backwards from its final
//!   segments to the state the recording began from;
//! - `warmup.rs` writes the events that rebuild that state (marked
//!   `"warmup": true`, counted in the header's `prefix_events`);
//! - `body.rs` turns the entries into events, and reads the device capacity
//!   off failed device mallocs.
//!
//! The header keeps the real device mallocs (`malloc_addresses`), so a
//! replay with `--real-addresses` gets the real addresses and breaks
//! best-fit ties as PyTorch did there.

mod body;
mod expandable;
mod pytorch;
mod rmm;
mod state;
mod warmup;

pub use body::{DeviceFacts, PENDING_STREAM_BASE};
pub use pytorch::{
    read_snapshot, recorded_with, PtBlock, PtEntry, PtSegment, PtSettings, PtSnapshot,
};
pub use rmm::{import_rmm_log, is_rmm_log};
pub use state::{initial_state, Block, InitialState, Segment};

use crate::event::Event;
use cachealloc_core::{policy, Config};

/// Trace stream ids for the raw stream handles of a snapshot: their rank
/// in increasing handle order (PyTorch orders its free blocks by the
/// handle), so the default stream 0 stays 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamMap {
    handles: Vec<u64>,
}

impl StreamMap {
    fn of(snapshot: &PtSnapshot) -> StreamMap {
        let mut handles: Vec<u64> = snapshot
            .segments
            .iter()
            .map(|s| s.stream as u64)
            .chain(
                snapshot
                    .device_traces
                    .iter()
                    .flatten()
                    .filter(|e| e.action != "snapshot")
                    .map(|e| e.stream as u64),
            )
            .collect();
        handles.sort_unstable();
        handles.dedup();
        StreamMap { handles }
    }

    /// The trace stream of a raw handle.
    pub fn id(&self, handle: i64) -> u64 {
        self.handles
            .binary_search(&(handle as u64))
            .unwrap_or_else(|k| k) as u64
    }

    /// (handle, trace stream) pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.handles.iter().enumerate().map(|(i, &h)| (h, i as u64))
    }
}

/// What the import of one device found.
#[derive(Clone, Debug, Default)]
pub struct DeviceImport {
    /// The device.
    pub device: u64,
    /// Its trace entries.
    pub entries: usize,
    /// The first entry used (entries before it contradict the final state).
    pub first_usable: usize,
    /// Why the entries before `first_usable` were left out.
    pub cut_reason: Option<String>,
    /// The state the recording began from.
    pub initial: InitialState,
    /// Warm-up events that rebuild it.
    pub warmup_events: usize,
    /// What its entries say.
    pub facts: DeviceFacts,
}

impl DeviceImport {
    /// Whether the recording began after the allocator held memory.
    pub fn warm_start(&self) -> bool {
        !self.initial.segments.is_empty()
    }
}

/// The memory limit a recording ran under: PyTorch's
/// `set_per_process_memory_fraction(fraction)` on a device of
/// `device_total` bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryLimit {
    /// The fraction.
    pub fraction: f64,
    /// The device's memory.
    pub device_total: u64,
}

/// A snapshot turned into a trace.
pub struct Imported {
    /// The header (a JSON object).
    pub header: serde_json::Value,
    /// The events: warm-up first (`true`), with their time relative to the
    /// first recorded entry.
    pub events: Vec<(Event, bool, Option<u64>)>,
    /// Per device.
    pub devices: Vec<DeviceImport>,
    /// The allocator settings string the warm-up was built for.
    pub conf: String,
    /// The device capacity the failed mallocs imply: (smallest, largest);
    /// `None` when no device malloc failed.
    pub capacity: Option<(u64, u64)>,
    /// Stream handles and their trace ids.
    pub streams: StreamMap,
    /// The snapshot's segments: the state the recording ended in.
    pub final_segments: Vec<PtSegment>,
    /// The memory fraction the trace replays under (given, or 1.0 of the
    /// inferred capacity when an out-of-memory shows that a limit, not the
    /// device, refused), and the device capacity it goes with.
    pub memory_limit: Option<(f64, u64)>,
    /// Allocations the recording made in private pools (trace entries'
    /// `pool_id`, torch 2.12 on): the trace has no pool routing for them
    /// and replays them in the default pools.
    pub private_pool_allocs: u64,
    /// The torch release the recording was made with, as its fields tell
    /// ([`recorded_with`]), and why: the header's `torch_version`, whose
    /// decisions replays take (`None`: not a torch recording, an RMM log).
    pub torch: Option<(cachealloc_core::TorchVersion, &'static str)>,
}

impl Imported {
    /// Write the trace to `path` (gzip when it ends in `.gz`).
    pub fn write(&self, path: &str) -> std::io::Result<()> {
        let mut w = crate::writer::TraceWriter::create(path, &self.header)?;
        for (e, warmup, t) in &self.events {
            w.event(e, *warmup, *t)?;
        }
        w.finish()
    }
}

/// Import the snapshot `bytes` (named `name` in the header). The allocator
/// settings are the snapshot's (`conf` overrides them; older PyTorch
/// recorded none, and then the default is used).
pub fn import(bytes: &[u8], name: &str, conf: Option<&str>) -> Result<Imported, String> {
    import_with_limit(bytes, name, conf, None)
}

/// [`import`] of a recording made under a memory fraction: `limit` gives
/// it exactly (the trace's header then carries it, and replays apply it);
/// without it, an `oom` entry whose device had room for the segment shows
/// a limit, and the trace replays under a fraction of 1.0 of the inferred
/// capacity. With `garbage_collection_threshold` in the settings and a
/// limit (given or shown), segment frees before a device malloc may be
/// garbage collection's, and are not read as failed mallocs.
pub fn import_with_limit(
    bytes: &[u8],
    name: &str,
    conf: Option<&str>,
    limit: Option<MemoryLimit>,
) -> Result<Imported, String> {
    let snap = read_snapshot(bytes)?;
    let torch = recorded_with(&snap);
    let conf = conf
        .map(str::to_string)
        .or_else(|| snap.allocator_settings.as_ref().map(|s| s.conf.clone()))
        .unwrap_or_default();
    let config = Config::parse_for(&conf, torch.0).map_err(|e| {
        format!(
            "allocator settings {conf:?}: {e} (read as torch {})",
            torch.0
        )
    })?;
    let streams = StreamMap::of(&snap);
    let mut next_id = 0u64;
    let mut next_pending = PENDING_STREAM_BASE;
    let mut events = Vec::new();
    let mut bodies = Vec::new();
    let mut devices = Vec::new();
    let empty = Vec::new();
    for d in device_list(&snap) {
        let entries = snap.device_traces.get(d as usize).unwrap_or(&empty);
        let segs: Vec<&PtSegment> = snap.segments.iter().filter(|s| s.device == d).collect();
        let expandable = segs.iter().any(|s| s.is_expandable)
            || entries
                .iter()
                .any(|e| e.action == "segment_map" || e.action == "segment_unmap");
        let initial = if expandable {
            expandable::cold_start(&segs, entries)
        } else {
            initial_state(&segs, entries, &config)
        }
        .map_err(|e| format!("device {d}: {e}"))?;
        let w = warmup::warmup(d, &initial, &streams, &config, &mut next_id).map_err(|e| {
            format!("device {d}: rebuilding the state the recording began from: {e}")
        })?;
        let usable = &entries[initial.first_usable..];
        // PyTorch collects garbage only under a memory fraction: given, or
        // shown by an out-of-memory whose device had room for the segment.
        let under_limit = limit.is_some()
            || usable.iter().any(|e| {
                e.action == "oom"
                    && e.device_free.is_some_and(|free| {
                        free >= policy::allocation_size(e.size).unwrap_or(e.size)
                    })
            });
        let mut body = body::Body::new(d, &streams, w.live, initial.reserved(), &mut next_pending)
            .with_garbage_collection(config.garbage_collection_threshold > 0.0 && under_limit)
            .with_config(config);
        for i in 0..usable.len() {
            body.entry(usable, i, &mut next_id)
                .map_err(|e| format!("device {d}: {e}"))?;
        }
        let mut facts = body.facts;
        let mut mallocs = w.mallocs;
        mallocs.append(&mut facts.mallocs);
        facts.mallocs = mallocs;
        bodies.push(body.events);
        devices.push(DeviceImport {
            device: d,
            entries: entries.len(),
            first_usable: initial.first_usable,
            cut_reason: initial.cut_reason.clone(),
            warmup_events: w.events.len(),
            initial,
            facts,
        });
        events.extend(w.events.into_iter().map(|e| (e, true, None)));
    }
    events.extend(merge(bodies));
    let capacity = capacity(&devices);
    let memory_limit = match limit {
        Some(l) => Some((l.fraction, l.device_total)),
        None if devices.iter().any(|d| d.facts.limit_refusals > 0) => capacity.map(|c| (1.0, c.0)),
        None => None,
    };
    let mut header = header(
        name,
        &conf,
        &devices,
        memory_limit.map_or(capacity.map(|c| c.0), |l| Some(l.1)),
        memory_limit.map(|l| l.0),
        &streams,
        events.len(),
    );
    let private_pool_allocs = snap
        .device_traces
        .iter()
        .flatten()
        .filter(|e| e.action == "alloc" && e.pool_id.is_some_and(|p| p != (0, 0)))
        .count() as u64;
    header["torch_version"] = serde_json::json!(torch.0.to_string());
    Ok(Imported {
        header,
        events,
        devices,
        conf,
        capacity,
        streams,
        final_segments: snap.segments,
        memory_limit,
        private_pool_allocs,
        torch: Some(torch),
    })
}

/// The devices with segments or entries, in increasing order.
fn device_list(snap: &PtSnapshot) -> Vec<u64> {
    let mut devices: Vec<u64> = snap.segments.iter().map(|s| s.device).collect();
    devices.extend(
        snap.device_traces
            .iter()
            .enumerate()
            .filter(|(_, t)| !t.is_empty())
            .map(|(d, _)| d as u64),
    );
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// The devices' events in one list: by time when every entry has one
/// (device order breaks ties), else device after device; times relative to
/// the first.
fn merge(bodies: Vec<Vec<body::Timed>>) -> Vec<(Event, bool, Option<u64>)> {
    let timed = bodies.iter().flatten().all(|t| t.time_us.is_some());
    let mut all: Vec<body::Timed> = bodies.into_iter().flatten().collect();
    if timed {
        all.sort_by_key(|t| t.time_us); // stable: each device keeps its order
    }
    let start = all.iter().filter_map(|t| t.time_us).min().unwrap_or(0);
    all.into_iter()
        .map(|t| {
            let rel = t.time_us.map(|us| us.saturating_sub(start).max(0) as u64);
            (t.event, false, rel)
        })
        .collect()
}

/// The capacity the failed device mallocs allow: at least the most any
/// device held, below every failed request.
fn capacity(devices: &[DeviceImport]) -> Option<(u64, u64)> {
    let below = devices
        .iter()
        .filter_map(|d| d.facts.capacity_below)
        .min()?;
    let least = devices
        .iter()
        .map(|d| d.facts.peak_reserved)
        .max()
        .unwrap_or(0);
    Some((least, below))
}

fn header(
    name: &str,
    conf: &str,
    devices: &[DeviceImport],
    capacity: Option<u64>,
    memory_fraction: Option<f64>,
    streams: &StreamMap,
    events: usize,
) -> serde_json::Value {
    let prefix: usize = devices.iter().map(|d| d.warmup_events).sum();
    let segments: usize = devices.iter().map(|d| d.initial.segments.len()).sum();
    let mallocs: serde_json::Map<String, serde_json::Value> = devices
        .iter()
        .map(|d| (d.device.to_string(), serde_json::json!(d.facts.mallocs)))
        .collect();
    let stream_map: serde_json::Map<String, serde_json::Value> = streams
        .pairs()
        .map(|(h, id)| (h.to_string(), id.into()))
        .collect();
    serde_json::json!({
        "format": "cachealloc-trace",
        "version": 1,
        "source": format!("imported from the PyTorch memory snapshot {name}: {events} events"),
        "device_capacity": capacity,
        "memory_fraction": memory_fraction,
        "prefix_events": prefix,
        "prefix_segments": segments,
        "malloc_addresses": mallocs,
        "conf": conf,
        "stream_map": stream_map,
        "note": "events with \"warmup\": true rebuild the allocator state the recording began from",
    })
}
