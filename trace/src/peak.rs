//! Where a replay peaks: [`peak_event`] finds the first event at which the
//! reserved bytes reach their maximum, and [`StopAt`] stops a replay after
//! an event (to look at the allocator there).

use crate::device::ReplayDevice;
use crate::error::TraceError;
use crate::replay::Replay;
use crate::run::{run, Observer, Options};

/// Stops a replay after the event with this index (from 0).
pub struct StopAt(pub u64);

impl<D: ReplayDevice> Observer<D> for StopAt {
    fn stop_after(&self, index: u64) -> bool {
        index >= self.0
    }
}

struct Peak {
    bytes: u64,
    at: u64,
}

impl Observer for Peak {
    fn after_event(&mut self, index: u64, r: &Replay) {
        let reserved = r.reserved();
        if reserved > self.bytes {
            self.bytes = reserved;
            self.at = index;
        }
    }
}

/// The index of the first event after which the reserved bytes (summed
/// over devices) are at their peak, and the peak; one replay of `path`.
pub fn peak_event(path: &str, opts: &Options) -> Result<(u64, u64), TraceError> {
    let mut p = Peak { bytes: 0, at: 0 };
    run(path, opts, &mut p)?;
    Ok((p.at, p.bytes))
}
