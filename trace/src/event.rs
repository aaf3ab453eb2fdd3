//! The contents of a trace: its [`Header`] and its [`Event`]s
//! (`docs/trace-format.md`, version 1).

/// The device mallocs of a recorded run, per device (in increasing device
/// order): (device, [(address, size), ...] in malloc order).
pub type MallocAddresses = Vec<(u64, Vec<(u64, u64)>)>;

/// The header line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// What produced the trace.
    pub source: String,
    /// Device memory the workload ran with, if known.
    pub device_capacity: Option<u64>,
    /// How many events at the start rebuild the state the recording began
    /// from (`prefix_events`; 0 for a trace recorded from a cold start).
    pub prefix_events: u64,
    /// The device mallocs of the recorded run, per device, in order:
    /// (address, size) (`malloc_addresses`; empty when not recorded).
    pub malloc_addresses: MallocAddresses,
}

impl Header {
    /// The recorded mallocs of device `device` (empty if none).
    pub fn mallocs_of(&self, device: u64) -> &[(u64, u64)] {
        self.malloc_addresses
            .iter()
            .find(|(d, _)| *d == device)
            .map_or(&[], |(_, m)| m.as_slice())
    }
}

/// One event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `alloc`
    Alloc {
        /// Allocation id.
        id: u64,
        /// Bytes.
        size: u64,
        /// Stream (0 when absent).
        stream: u64,
        /// Device (0 when absent).
        device: u64,
    },
    /// `free`
    Free {
        /// Allocation id.
        id: u64,
    },
    /// `record_stream`
    RecordStream {
        /// Allocation id.
        id: u64,
        /// The other stream.
        stream: u64,
    },
    /// `sync` (all streams when `None`)
    Sync {
        /// The stream.
        stream: Option<u64>,
    },
    /// `empty_cache`
    EmptyCache,
}
