//! The contents of a trace: its [`Header`] and its [`Event`]s
//! (`docs/trace-format.md`, version 1).

/// The header line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// What produced the trace.
    pub source: String,
    /// Device memory the workload ran with, if known.
    pub device_capacity: Option<u64>,
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
