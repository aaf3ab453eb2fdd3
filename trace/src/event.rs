//! The contents of a trace: its [`Header`] and its [`Event`]s
//! (`docs/trace-format.md`, version 1).

/// The device mallocs of a recorded run, per device (in increasing device
/// order): (device, [(address, size), ...] in malloc order).
pub type MallocAddresses = Vec<(u64, Vec<(u64, u64)>)>;

/// The header line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Header {
    /// The format version (1, or 2 with private-pool ops).
    pub version: u64,
    /// What produced the trace.
    pub source: String,
    /// Device memory the workload ran with, if known.
    pub device_capacity: Option<u64>,
    /// `set_per_process_memory_fraction` the workload ran under, if any
    /// (`memory_fraction`; it needs `device_capacity`).
    pub memory_fraction: Option<f64>,
    /// How many events at the start rebuild the state the recording began
    /// from (`prefix_events`; 0 for a trace recorded from a cold start).
    pub prefix_events: u64,
    /// The device mallocs of the recorded run, per device, in order:
    /// (address, size) (`malloc_addresses`; empty when not recorded).
    pub malloc_addresses: MallocAddresses,
    /// The torch release the trace was recorded with, when known
    /// (`torch_version`): a replay takes its decisions unless told
    /// otherwise.
    pub torch_version: Option<cachealloc_core::TorchVersion>,
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

/// A private pool's id (PyTorch's `MempoolId_t`: a pair, `[0, 0]` never).
pub type PoolId = (u64, u64);

/// The streams a routing to a pool takes: every stream, or up to four.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Streams {
    /// `"all"`.
    All,
    /// These (the first `len` of `list`).
    List {
        /// The streams.
        list: [u64; 4],
        /// How many.
        len: u8,
    },
}

impl Streams {
    /// The listed streams (empty for `All`).
    pub fn as_slice(&self) -> &[u64] {
        match self {
            Streams::All => &[],
            Streams::List { list, len } => &list[..*len as usize],
        }
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
    /// `pool_create` (version 2): `torch.cuda.MemPool(use_on_oom, no_split)`.
    PoolCreate {
        /// The pool.
        pool: PoolId,
        /// Its device.
        device: u64,
        /// `use_on_oom`.
        use_on_oom: bool,
        /// `no_split`.
        no_split: bool,
    },
    /// `pool_begin` / `capture_begin` (version 2): route the streams to the
    /// pool (and, for a capture, apply the capture rules).
    PoolBegin {
        /// The pool.
        pool: PoolId,
        /// Its device.
        device: u64,
        /// The streams routed.
        streams: Streams,
        /// `capture_begin`.
        capture: bool,
    },
    /// `pool_end` / `capture_end` (version 2).
    PoolEnd {
        /// The pool.
        pool: PoolId,
        /// Its device.
        device: u64,
        /// `capture_end`.
        capture: bool,
    },
    /// `pool_release` (version 2): one user of the pool less.
    PoolRelease {
        /// The pool.
        pool: PoolId,
        /// Its device.
        device: u64,
    },
    /// `pool_empty_cache` (version 2): `emptyCache(pool)`.
    PoolEmptyCache {
        /// The pool.
        pool: PoolId,
        /// Its device.
        device: u64,
    },
}

impl Event {
    /// Whether the event is one of the private-pool ops of version 2.
    pub fn is_pool_op(&self) -> bool {
        matches!(
            self,
            Event::PoolCreate { .. }
                | Event::PoolBegin { .. }
                | Event::PoolEnd { .. }
                | Event::PoolRelease { .. }
                | Event::PoolEmptyCache { .. }
        )
    }
}
