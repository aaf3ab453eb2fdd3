//! [`TraceError`]: where (file, line) and what ([`Reason`]). Every error of
//! this crate is one; [`TraceError::is_bad_input`] separates a malformed
//! trace (the CLI exits 2) from a failure of the allocator or the device
//! (exit 1).

use std::fmt;

/// An operation of the trace format, as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `alloc`
    Alloc,
    /// `free`
    Free,
    /// `record_stream`
    RecordStream,
}

impl Op {
    /// The op's name in the trace format.
    pub const fn as_str(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
            Op::RecordStream => "record_stream",
        }
    }
}

/// An event that breaks the liveness rules of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LivenessError {
    /// The op.
    pub op: Op,
    /// The allocation id.
    pub id: u64,
}

impl fmt::Display for LivenessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Op::Alloc => write!(f, "alloc of id {}, which is already live", self.id),
            op => write!(f, "{} of id {}, which is not live", op.as_str(), self.id),
        }
    }
}

/// What is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The file cannot be opened or read.
    Io(String),
    /// The header is missing or wrong.
    Header(String),
    /// A line is not valid JSON, or not an event of the format (op, fields).
    Event(String),
    /// An event breaks the liveness rules (alloc of a live id; free or
    /// record_stream of an id that is not live).
    Liveness(LivenessError),
    /// A private-pool op breaks the pool rules (routing twice, ending a
    /// routing that is not there, releasing a pool without users).
    Pool(String),
    /// A replay option that does not fit the trace.
    Option(String),
    /// The allocator failed for a reason other than out of memory.
    Allocator(String),
    /// The device could not be opened or driven.
    Device(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Io(s)
            | Reason::Header(s)
            | Reason::Event(s)
            | Reason::Pool(s)
            | Reason::Option(s)
            | Reason::Allocator(s)
            | Reason::Device(s) => f.write_str(s),
            Reason::Liveness(e) => e.fmt(f),
        }
    }
}

impl From<LivenessError> for Reason {
    fn from(e: LivenessError) -> Reason {
        Reason::Liveness(e)
    }
}

/// A problem with a trace or its replay: `FILE:LINE: reason` (line 0: the
/// file as a whole).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceError {
    /// The trace file.
    pub path: String,
    /// The 1-based line, 0 for the file as a whole.
    pub line: u64,
    /// What is wrong.
    pub reason: Reason,
}

impl TraceError {
    /// Whether the trace (or an option given for it) is at fault, rather
    /// than the allocator or the device.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self.reason, Reason::Allocator(_) | Reason::Device(_))
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path, self.reason)
        } else {
            write!(f, "{}:{}: {}", self.path, self.line, self.reason)
        }
    }
}

impl std::error::Error for TraceError {}
