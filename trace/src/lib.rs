//! # cachealloc-trace
//!
//! Allocation traces (`docs/trace-format.md`: JSON Lines, plain or gzip) and
//! what the project does with them, for the `cachealloc` command, the tests
//! and the fuzz targets alike:
//!
//! - [`TraceReader`]: a streaming reader (never loads a trace whole); every
//!   error is a [`TraceError`] naming the file, the line and a typed [`Reason`].
//! - [`Liveness`]: the format's liveness rules, shared by [`check`] and
//!   [`Replay`].
//! - [`check`]: validate a trace and gather its statistics.
//! - [`run`]: replay a trace through the caching allocator, one per device,
//!   on the simulated device or any [`ReplayDevice`], into a [`Report`].
//! - [`min_capacity`]: the smallest device the trace fits without an
//!   out-of-memory error, by bisection.
//! - [`import`]: a PyTorch memory snapshot with its history as a trace;
//!   [`TraceWriter`] writes traces.
//!
//! ```
//! use cachealloc_trace::{run_reader, Options, Quiet, TraceReader};
//! let text = r#"{"format":"cachealloc-trace","version":1}
//! {"op":"alloc","id":1,"size":1000}
//! {"op":"free","id":1}
//! "#;
//! let reader = TraceReader::from_bytes("example", text.as_bytes().to_vec(), false)?;
//! let (report, _) = run_reader(reader, &Options::default(), &mut Quiet)?;
//! assert_eq!((report.events, report.peak_reserved_bytes), (2, 2 << 20));
//! # Ok::<(), cachealloc_trace::TraceError>(())
//! ```

pub mod advise;
mod against;
mod check;
mod device;
mod error;
mod event;
mod fast_parse;
pub mod fuzzing;
pub mod import;
mod liveness;
mod min_capacity;
mod parse;
mod peak;
mod pipeline;
mod pool_rules;
mod reader;
mod replay;
mod replay_pools;
mod report;
mod run;
mod snapshot;
pub mod synthetic;
mod writer;

pub use against::{against, DeviceAgainst, Side};
pub use cachealloc_snapshot::{
    add_device, parse_bytes, settings_dict, write_snapshot, AnnotationDict, BlockDict, Frame,
    SegmentDict, SettingsDict, SnapshotDict, SnapshotNames, TraceDict,
};
pub use check::{check, check_reader, TraceStats};
pub use device::ReplayDevice;
pub use error::{LivenessError, Op, Reason, TraceError};
pub use event::{Event, Header, MallocAddresses, PoolId, Streams};
pub use liveness::Liveness;
pub use min_capacity::min_capacity;
pub use parse::{parse_event, parse_header};
pub use peak::{peak_event, StopAt};
pub use pool_rules::PoolRules;
pub use reader::TraceReader;
pub use replay::{Alloc, Device, FirstOom, Replay, REPLAY_POOLS};
pub use report::Report;
pub use run::{run, run_on, run_reader, run_reader_on, Observer, Options, Quiet};
pub use snapshot::Dropped;
pub use writer::{event_json, TraceWriter};
