//! `check`: validate a trace (every rule of the format) and gather its
//! statistics.

use crate::error::{Reason, TraceError};
use crate::event::Event;
use crate::liveness::Liveness;
use crate::pool_rules::PoolRules;
use crate::reader::TraceReader;
use std::collections::BTreeSet;

/// Statistics of a valid trace.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[non_exhaustive]
pub struct TraceStats {
    /// The file.
    pub trace: String,
    /// The header's `source`.
    pub source: String,
    /// The header's `device_capacity`.
    pub device_capacity: Option<u64>,
    /// Events (non-blank lines after the header).
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// `free` events.
    pub frees: u64,
    /// `record_stream` events.
    pub record_stream: u64,
    /// `sync` events.
    pub sync: u64,
    /// `empty_cache` events.
    pub empty_cache: u64,
    /// Private-pool ops (version 2).
    pub pool_ops: u64,
    /// Private pools used.
    pub pools: u64,
    /// Allocations of 0 bytes.
    pub zero_byte_allocs: u64,
    /// Peak of the sum of live allocation sizes.
    pub peak_live_bytes: u64,
    /// Sum of all allocation sizes.
    pub total_bytes_allocated: u128,
    /// The largest allocation.
    pub largest_alloc: u64,
    /// The smallest allocation.
    pub smallest_alloc: Option<u64>,
    /// Allocations of at most 1 MiB (PyTorch's small pool).
    pub small_allocs: u64,
    /// Allocations above 1 MiB.
    pub large_allocs: u64,
    /// Allocations still live at the end.
    pub live_at_end: u64,
    /// Their bytes.
    pub live_bytes_at_end: u64,
    /// Streams used.
    pub streams: BTreeSet<u64>,
    /// Devices used.
    pub devices: BTreeSet<u64>,
}

/// Validate the trace at `path` (every rule of the format; the first error
/// is returned) and count.
pub fn check(path: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<TraceStats, TraceError> {
    check_reader(TraceReader::open(path)?, progress)
}

/// [`check`] on an opened trace.
pub fn check_reader(
    mut r: TraceReader,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<TraceStats, TraceError> {
    let path = r.path().to_string();
    let mut s = TraceStats {
        trace: path,
        source: r.header.source.clone(),
        device_capacity: r.header.device_capacity,
        ..TraceStats::default()
    };
    let mut live: Liveness<u64> = Liveness::new();
    let mut pools = PoolRules::new();
    let mut live_bytes = 0u64;
    while let Some(ev) = r.next_event() {
        let (line, ev) = ev?;
        s.events += 1;
        if s.events.is_multiple_of(65536) {
            let (a, b) = r.progress();
            progress(a, b);
        }
        match ev {
            Event::Alloc {
                id,
                size,
                stream,
                device,
            } => {
                live.alloc(id, size)
                    .map_err(|e| r.error(line, Reason::Liveness(e)))?;
                s.allocs += 1;
                s.zero_byte_allocs += (size == 0) as u64;
                live_bytes += size;
                s.peak_live_bytes = s.peak_live_bytes.max(live_bytes);
                s.total_bytes_allocated += size as u128;
                s.largest_alloc = s.largest_alloc.max(size);
                s.smallest_alloc = Some(s.smallest_alloc.map_or(size, |m| m.min(size)));
                if size <= 1 << 20 {
                    s.small_allocs += 1;
                } else {
                    s.large_allocs += 1;
                }
                s.streams.insert(stream);
                s.devices.insert(device);
            }
            Event::Free { id } => {
                let size = live
                    .free(id)
                    .map_err(|e| r.error(line, Reason::Liveness(e)))?;
                live_bytes -= size;
                s.frees += 1;
            }
            Event::RecordStream { id, stream } => {
                live.record_stream(id)
                    .map_err(|e| r.error(line, Reason::Liveness(e)))?;
                s.record_stream += 1;
                s.streams.insert(stream);
            }
            Event::Sync { stream } => {
                s.sync += 1;
                s.streams.extend(stream);
            }
            Event::EmptyCache => s.empty_cache += 1,
            pool_op => {
                pools
                    .apply(&pool_op)
                    .map_err(|e| r.error(line, Reason::Pool(e)))?;
                s.pool_ops += 1;
                if let Event::PoolBegin { streams, .. } = pool_op {
                    s.streams.extend(streams.as_slice());
                }
            }
        }
    }
    s.pools = pools.len() as u64;
    s.live_at_end = live.len() as u64;
    s.live_bytes_at_end = live_bytes;
    Ok(s)
}
