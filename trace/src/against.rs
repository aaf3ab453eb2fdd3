//! A replay set against the recording it was imported from (`cachealloc
//! check --against SNAPSHOT`): what the real allocator did (the snapshot's
//! `segment_alloc` / `segment_free` entries and final segments) beside what
//! the replay did after its warm-up, device by device.

use crate::import::{import, Imported, PtSegment, StreamMap};
use crate::reader::TraceReader;
use crate::replay::Device;
use crate::run::{run, Options, Quiet};
use cachealloc_core::TraceAction;
use cachealloc_mock::RealAddressUse;

/// One side of the comparison, for one device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// Sizes of the device mallocs, in order (the recorded part only).
    pub mallocs: Vec<u64>,
    /// Sizes of the device frees, in order.
    pub frees: Vec<u64>,
    /// Most bytes reserved at once.
    pub peak_reserved: u64,
    /// Segments at the end.
    pub segments: usize,
}

/// One device, recorded and replayed.
#[derive(Clone, Debug)]
pub struct DeviceAgainst {
    /// The device.
    pub device: u64,
    /// What the real allocator did.
    pub recorded: Side,
    /// What the replay did.
    pub replayed: Side,
    /// The replay's peak of allocated bytes in the recorded part.
    pub replayed_peak_allocated: u64,
    /// The first difference between the final segments and blocks
    /// (address, size, stream, each block's offset, size and state);
    /// `None`: equal, block for block.
    pub state_difference: Option<String>,
    /// How the recorded addresses were used (with `real_addresses`).
    pub real_addresses: Option<RealAddressUse>,
}

impl DeviceAgainst {
    /// Whether every figure agrees.
    pub fn matches(&self) -> bool {
        self.recorded == self.replayed && self.state_difference.is_none()
    }
}

/// A segment's final layout, in recorded addresses: (address, size, stream
/// handle, blocks as (offset, size, state)).
type Layout = (u64, u64, u64, Vec<(u64, u64, &'static str)>);

fn recorded_layout(segs: &[PtSegment], device: u64) -> Vec<Layout> {
    let mut out: Vec<Layout> = segs
        .iter()
        .filter(|s| s.device == device)
        .map(|s| {
            let mut off = 0;
            let blocks = s
                .blocks
                .iter()
                .map(|b| {
                    let state = match b.state.as_str() {
                        "active_allocated" => "active_allocated",
                        "inactive" => "inactive",
                        _ => "active_pending_free",
                    };
                    let r = (off, b.size, state);
                    off += b.size;
                    r
                })
                .collect();
            (s.address, s.total_size, s.stream as u64, blocks)
        })
        .collect();
    out.sort_by_key(|l| l.0);
    out
}

/// The replay's final layout, its addresses translated to the recorded
/// ones through the malloc order (the k-th device malloc of both).
fn replayed_layout(
    d: &Device,
    recorded_mallocs: &[(u64, u64)],
    streams: &StreamMap,
) -> Vec<Layout> {
    let log = d.alloc.backend().malloc_log();
    let handles: Vec<u64> = streams.pairs().map(|(h, _)| h).collect();
    let mut out: Vec<Layout> = d
        .alloc
        .segments()
        .map(|s| {
            let base = s.address.0;
            let translated = log
                .iter()
                .rposition(|(p, n)| p.0 == base && *n == s.total_size)
                .and_then(|k| recorded_mallocs.get(k))
                .map_or(base, |&(a, _)| a);
            let mut off = 0;
            let blocks = s
                .blocks()
                .map(|b| {
                    let r = (off, b.size, b.state.as_str());
                    off += b.size;
                    r
                })
                .collect();
            let handle = handles.get(s.stream as usize).copied().unwrap_or(s.stream);
            (translated, s.total_size, handle, blocks)
        })
        .collect();
    out.sort_by_key(|l| l.0);
    out
}

fn first_difference(recorded: &[Layout], replayed: &[Layout]) -> Option<String> {
    for (k, (a, b)) in recorded.iter().zip(replayed).enumerate() {
        if a.0 != b.0 || a.1 != b.1 {
            return Some(format!(
                "segment {k}: recorded {:#x} ({} bytes), replayed {:#x} ({} bytes)",
                a.0, a.1, b.0, b.1
            ));
        }
        if a.2 != b.2 {
            return Some(format!(
                "segment {k} at {:#x}: stream {} recorded, {} replayed",
                a.0, a.2, b.2
            ));
        }
        if let Some(j) = (0..a.3.len().max(b.3.len())).find(|&j| a.3.get(j) != b.3.get(j)) {
            return Some(format!(
                "segment {k} at {:#x}, block {j}: recorded {:?}, replayed {:?}",
                a.0,
                a.3.get(j),
                b.3.get(j)
            ));
        }
    }
    (recorded.len() != replayed.len()).then(|| {
        format!(
            "{} segments recorded, {} replayed",
            recorded.len(),
            replayed.len()
        )
    })
}

/// Replay the imported `trace` with `opts` (its warm-up first, then the
/// recorded part with history on) and set it against `snapshot`, the
/// recording it came from.
pub fn against(
    trace: &str,
    snapshot: &[u8],
    snapshot_name: &str,
    opts: &Options,
) -> Result<(Vec<DeviceAgainst>, Imported), String> {
    let imported = import(snapshot, snapshot_name, Some(&opts.conf))?;
    let reader = TraceReader::open(trace).map_err(|e| e.to_string())?;
    let prefix = reader.header.prefix_events;
    let events = reader.count_rest().map_err(|e| e.to_string())?;
    let opts = Options {
        history: (3 * events + 16) as usize,
        recorded_from: Some(prefix),
        ..opts.clone()
    };
    let (_, replay) = run(trace, &opts, &mut Quiet).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for di in &imported.devices {
        let d = replay.devices.iter().find(|d| d.index == di.device);
        let warm = di.initial.segments.len();
        let recorded = Side {
            mallocs: di.facts.mallocs[warm..].iter().map(|m| m.1).collect(),
            frees: di.facts.segment_frees.clone(),
            peak_reserved: di.facts.peak_reserved,
            segments: imported
                .final_segments
                .iter()
                .filter(|s| s.device == di.device)
                .count(),
        };
        let Some(d) = d else {
            out.push(DeviceAgainst {
                device: di.device,
                recorded,
                replayed: Side::default(),
                replayed_peak_allocated: 0,
                state_difference: Some("the replay never used this device".to_string()),
                real_addresses: None,
            });
            continue;
        };
        let of = |a: TraceAction| -> Vec<u64> {
            d.alloc
                .history()
                .entries()
                .filter(|e| e.action == a)
                .map(|e| e.size)
                .collect()
        };
        let stats = d.alloc.stats();
        // Expandable segments: the device's mallocs and frees are page maps
        // and unmaps (as the import reads the recording).
        let expandable = d.alloc.config().maps_pages();
        let (malloc, free) = if expandable {
            (TraceAction::SegmentMap, TraceAction::SegmentUnmap)
        } else {
            (TraceAction::SegmentAlloc, TraceAction::SegmentFree)
        };
        let replayed = Side {
            mallocs: of(malloc),
            frees: of(free),
            peak_reserved: stats.reserved_bytes.all().peak as u64,
            segments: d.alloc.segments().count(),
        };
        let (mut recorded_runs, mut replayed_runs) = (
            recorded_layout(&imported.final_segments, di.device),
            // Expandable segments: the mock's log holds reservations, the
            // recording's mallocs are maps: no address to translate.
            replayed_layout(
                d,
                if expandable { &[] } else { &di.facts.mallocs },
                &imported.streams,
            ),
        );
        if expandable {
            // A reservation's place is the driver's: compare the runs in
            // address order, each by its rank.
            for layout in [&mut recorded_runs, &mut replayed_runs] {
                for (k, l) in layout.iter_mut().enumerate() {
                    l.0 = k as u64;
                }
            }
        }
        let state_difference = first_difference(&recorded_runs, &replayed_runs);
        out.push(DeviceAgainst {
            device: di.device,
            recorded,
            replayed,
            replayed_peak_allocated: stats.allocated_bytes.all().peak as u64,
            state_difference,
            real_addresses: opts
                .real_addresses
                .then(|| d.alloc.backend().real_address_use()),
        });
    }
    Ok((out, imported))
}
