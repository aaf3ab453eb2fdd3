//! [`min_capacity`]: the smallest device a trace replays on without an
//! out-of-memory error.

use crate::error::TraceError;
use crate::report::Report;
use crate::run::{run, Options, Quiet};

/// The smallest capacity (a multiple of 2 MiB; of every device, with
/// several) at which the trace replays without an OOM, by bisection between
/// the largest peak of live bytes of a device (which must fail below) and
/// the largest peak reserved of a device in the unlimited run (which
/// succeeds); the trace is streamed again for every probe.
pub fn min_capacity(trace: &str, opts: &Options, unlimited: &Report) -> Result<u64, TraceError> {
    const STEP: u64 = 2 << 20;
    let reserved = unlimited
        .devices
        .iter()
        .map(|d| d.1.reserved_bytes.all().peak as u64)
        .max()
        .unwrap_or(unlimited.peak_reserved_bytes);
    let live = unlimited
        .device_peak_live
        .iter()
        .copied()
        .max()
        .unwrap_or(unlimited.peak_live_bytes);
    let mut hi = reserved.div_ceil(STEP).max(1);
    let mut lo = (live / STEP).saturating_sub(1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let o = Options {
            capacity: Some(mid * STEP),
            ..opts.clone()
        };
        let (r, _) = run(trace, &o, &mut Quiet)?;
        if r.ooms == 0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(hi * STEP)
}
