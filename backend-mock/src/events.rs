//! The simulated device's streams and events: work queued on a stream
//! finishes at the next sync of that stream (or of all streams); an event
//! completes at the first such sync after its record, or by a host wait.

use crate::MockError;
use std::collections::HashMap;

/// An event of the mock device.
#[derive(Debug, PartialEq, Eq)]
pub struct MockEvent(pub(crate) usize);

#[derive(Clone, Copy, Debug, Default)]
struct EventState {
    /// (stream, that stream's epoch, the global epoch) at the last record.
    recorded: Option<(u64, u64, u64)>,
    /// Completed by a host wait.
    done: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Streams {
    stream_epoch: HashMap<u64, u64>,
    global_epoch: u64,
    events: Vec<Option<EventState>>,
    free_events: Vec<usize>,
    pub(crate) live_events: usize,
}

impl Streams {
    /// The host waits for `stream` (every stream when `None`).
    pub(crate) fn sync(&mut self, stream: Option<u64>) {
        match stream {
            Some(s) => *self.stream_epoch.entry(s).or_insert(0) += 1,
            None => self.global_epoch += 1,
        }
    }

    fn state(&mut self, e: &MockEvent) -> Result<&mut EventState, MockError> {
        self.events
            .get_mut(e.0)
            .and_then(Option::as_mut)
            .ok_or(MockError::InvalidEvent)
    }

    pub(crate) fn create(&mut self) -> MockEvent {
        self.live_events += 1;
        let st = Some(EventState::default());
        if let Some(i) = self.free_events.pop() {
            self.events[i] = st;
            MockEvent(i)
        } else {
            self.events.push(st);
            MockEvent(self.events.len() - 1)
        }
    }

    pub(crate) fn record(&mut self, e: &MockEvent, stream: u64) -> Result<(), MockError> {
        let epoch = self.stream_epoch.get(&stream).copied().unwrap_or(0);
        let g = self.global_epoch;
        let st = self.state(e)?;
        st.recorded = Some((stream, epoch, g));
        st.done = false;
        Ok(())
    }

    pub(crate) fn is_done(&mut self, e: &MockEvent) -> Result<bool, MockError> {
        let st = *self.state(e)?;
        Ok(match st.recorded {
            None => true,
            Some((s, epoch, gepoch)) => {
                st.done
                    || self.stream_epoch.get(&s).copied().unwrap_or(0) != epoch
                    || self.global_epoch != gepoch
            }
        })
    }

    /// The stream `e` was last recorded on (`None`: never recorded).
    pub(crate) fn recorded_on(&mut self, e: &MockEvent) -> Result<Option<u64>, MockError> {
        Ok(self.state(e)?.recorded.map(|r| r.0))
    }

    pub(crate) fn wait(&mut self, e: &MockEvent) -> Result<(), MockError> {
        self.state(e)?.done = true;
        Ok(())
    }

    pub(crate) fn destroy(&mut self, e: &MockEvent) -> Result<(), MockError> {
        self.state(e)?;
        self.events[e.0] = None;
        self.free_events.push(e.0);
        self.live_events -= 1;
        Ok(())
    }
}
