//! [`TraceReader`]: a trace opened for streaming, plain or gzip JSON Lines,
//! read line by line and never loaded whole. Every error names the file and
//! the line.

use crate::error::{Reason, TraceError};
use crate::event::{Event, Header};
use crate::parse::{parse_event, parse_header};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counts the bytes read from the file (compressed bytes for `.gz`).
struct Counting<R: ?Sized> {
    count: Arc<AtomicU64>,
    inner: R,
}

impl<R: Read + ?Sized> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A trace opened for streaming (`Send`: a replay parses on a second
/// thread).
pub struct TraceReader {
    path: String,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    buf: Vec<u8>,
    bytes: Arc<AtomicU64>,
    file_len: u64,
    /// The header.
    pub header: Header,
}

impl TraceReader {
    /// Open `path` (gzip when it ends in `.gz`) and read its header.
    pub fn open(path: &str) -> Result<TraceReader, TraceError> {
        let file = File::open(path).map_err(|e| TraceError {
            path: path.to_string(),
            line: 0,
            reason: Reason::Io(format!("cannot open: {e}")),
        })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        TraceReader::from_read(path, Box::new(file), path.ends_with(".gz"), len)
    }

    /// Read a trace held in memory (`gzip`: it is compressed); `name` stands
    /// for the file in messages.
    pub fn from_bytes(name: &str, data: Vec<u8>, gzip: bool) -> Result<TraceReader, TraceError> {
        let len = data.len() as u64;
        TraceReader::from_read(name, Box::new(io::Cursor::new(data)), gzip, len)
    }

    fn from_read(
        path: &str,
        inner: Box<dyn Read + Send>,
        gzip: bool,
        file_len: u64,
    ) -> Result<TraceReader, TraceError> {
        let err = |line, reason: Reason| TraceError {
            path: path.to_string(),
            line,
            reason,
        };
        let bytes = Arc::new(AtomicU64::new(0));
        let counting = Counting {
            inner,
            count: bytes.clone(),
        };
        // Large buffers for files; small ones for small inputs (a 256 KiB
        // buffer is an mmap of its own).
        let (outer, raw) = if file_len < 1 << 16 {
            (1 << 13, 1 << 12)
        } else {
            (1 << 18, 1 << 16)
        };
        let reader: Box<dyn BufRead + Send> = if gzip {
            Box::new(BufReader::with_capacity(
                outer,
                flate2::read::MultiGzDecoder::new(BufReader::with_capacity(raw, counting)),
            ))
        } else {
            Box::new(BufReader::with_capacity(outer, counting))
        };
        let mut r = TraceReader {
            path: path.to_string(),
            reader,
            line: 0,
            buf: Vec::with_capacity(256),
            bytes,
            file_len,
            header: Header::default(),
        };
        loop {
            match r.next_line()? {
                None => {
                    return Err(err(
                        0,
                        Reason::Header("missing header: the trace is empty".to_string()),
                    ))
                }
                Some(line) if line.iter().all(u8::is_ascii_whitespace) => continue,
                Some(_) => break,
            }
        }
        let line = r.line;
        r.header = parse_header(&r.buf).map_err(|e| err(line, e))?;
        Ok(r)
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Bytes of the file read so far, and its size.
    pub fn progress(&self) -> (u64, u64) {
        (self.bytes.load(Ordering::Relaxed), self.file_len)
    }

    fn next_line(&mut self) -> Result<Option<&[u8]>, TraceError> {
        self.buf.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| TraceError {
                path: self.path.clone(),
                line: self.line + 1,
                reason: Reason::Io(format!("cannot read: {e}")),
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        while self.buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            self.buf.pop();
        }
        Ok(Some(&self.buf))
    }

    /// The next event and its line number; `None` at the end.
    pub fn next_event(&mut self) -> Option<Result<(u64, Event), TraceError>> {
        let parsed = loop {
            match self.next_line() {
                Err(e) => return Some(Err(e)),
                Ok(None) => return None,
                Ok(Some(l)) if l.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Some(l)) => break parse_event(l),
            }
        };
        let parsed = match parsed {
            Ok(e) if e.is_pool_op() && self.header.version < 2 => Err(Reason::Event(
                "private-pool ops need a version 2 trace (the header says version 1)".to_string(),
            )),
            other => other,
        };
        Some(parsed.map(|e| (self.line, e)).map_err(|reason| TraceError {
            path: self.path.clone(),
            line: self.line,
            reason,
        }))
    }

    /// Count the events left without parsing them (lines that are not
    /// blank): sizes a history before a replay.
    pub fn count_rest(mut self) -> Result<u64, TraceError> {
        let mut n = 0;
        while let Some(l) = self.next_line()? {
            if !l.iter().all(u8::is_ascii_whitespace) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// An error at `line` of this trace.
    pub fn error(&self, line: u64, reason: Reason) -> TraceError {
        TraceError {
            path: self.path.clone(),
            line,
            reason,
        }
    }
}
