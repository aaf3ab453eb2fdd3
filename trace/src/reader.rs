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
use std::time::Instant;

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

/// The event on one line of a trace, without its line end; `None` for a
/// blank line. `version` is the header's.
pub(crate) fn event_of_line(line: &[u8], version: u64) -> Option<Result<Event, Reason>> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(match parse_event(line) {
        Ok(e) if e.is_pool_op() && version < 2 => Err(Reason::Event(
            "private-pool ops need a version 2 trace (the header says version 1)".to_string(),
        )),
        other => other,
    })
}

/// A failed read: a gzip file the decoder cannot read to its end (cut
/// short, or damaged) says so, with the decoder's words in parentheses;
/// an error of the system (a disk, a permission) is given as it is.
fn read_failure(gzip: bool, e: &io::Error) -> Reason {
    if gzip && e.raw_os_error().is_none() {
        Reason::Io(format!("cannot read: truncated or corrupt gzip file ({e})"))
    } else {
        Reason::Io(format!("cannot read: {e}"))
    }
}

/// Lines of a trace, read but not parsed (see [`TraceReader::read_lines`]).
pub(crate) struct RawLines {
    /// The number of the first line.
    pub(crate) first: u64,
    /// The lines, each ended by a line feed.
    pub(crate) bytes: Vec<u8>,
    /// The header's version.
    pub(crate) version: u64,
    /// Seconds spent reading them.
    pub(crate) seconds: f64,
    /// Bytes of the file read so far, and its size.
    pub(crate) read: (u64, u64),
    /// The read error that came after them.
    pub(crate) error: Option<TraceError>,
    /// Whether nothing comes after them.
    pub(crate) last: bool,
}

/// A trace opened for streaming (`Send`: a replay parses on a second
/// thread).
pub struct TraceReader {
    path: String,
    reader: Box<dyn BufRead + Send>,
    line: u64,
    /// Bytes of the reader's buffer the last line took, not yet consumed.
    pending: usize,
    /// A line that straddled the end of the reader's buffer.
    buf: Vec<u8>,
    bytes: Arc<AtomicU64>,
    file_len: u64,
    /// Whether the file is read through the gzip decoder.
    gzip: bool,
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

    /// Read a trace decompressed once and shared (say, by every replay of
    /// `advise`): no copy and no decompression per reader.
    pub fn from_shared(name: &str, data: Arc<Vec<u8>>) -> Result<TraceReader, TraceError> {
        /// The shared bytes, as a cursor reads them.
        struct Shared(Arc<Vec<u8>>);
        impl AsRef<[u8]> for Shared {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        let len = data.len() as u64;
        TraceReader::from_read(name, Box::new(io::Cursor::new(Shared(data))), false, len)
    }

    /// The trace at `path` whole, decompressed (for [`from_shared`](Self::from_shared)).
    pub fn read_whole(path: &str) -> Result<Arc<Vec<u8>>, TraceError> {
        let err = |reason| TraceError {
            path: path.to_string(),
            line: 0,
            reason,
        };
        let file = File::open(path).map_err(|e| err(Reason::Io(format!("cannot open: {e}"))))?;
        let gzip = path.ends_with(".gz");
        let mut data = Vec::new();
        let read = if gzip {
            flate2::read::GzDecoder::new(BufReader::new(file)).read_to_end(&mut data)
        } else {
            BufReader::new(file).read_to_end(&mut data)
        };
        read.map_err(|e| err(read_failure(gzip, &e)))?;
        Ok(Arc::new(data))
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
            pending: 0,
            buf: Vec::with_capacity(256),
            bytes,
            file_len,
            gzip,
            header: Header::default(),
        };
        let header = loop {
            match r.next_line()? {
                None => {
                    return Err(err(
                        0,
                        Reason::Header("missing header: the trace is empty".to_string()),
                    ))
                }
                Some(line) if line.iter().all(u8::is_ascii_whitespace) => continue,
                Some(line) => break parse_header(line),
            }
        };
        let line = r.line;
        r.header = header.map_err(|e| err(line, e))?;
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

    /// The next line, without its line end. A line that lies whole in the
    /// reader's buffer is handed out from there (consumed at the next call);
    /// only one that straddles the buffer's end is copied.
    fn next_line(&mut self) -> Result<Option<&[u8]>, TraceError> {
        if self.pending > 0 {
            self.reader.consume(self.pending);
            self.pending = 0;
        }
        let (gzip, line_no) = (self.gzip, self.line);
        let io_error = |line: u64, e: io::Error| TraceError {
            path: self.path.clone(),
            line: line + 1,
            reason: read_failure(gzip, &e),
        };
        let found = {
            let avail = self.reader.fill_buf().map_err(|e| io_error(line_no, e))?;
            if avail.is_empty() {
                return Ok(None);
            }
            memchr::memchr(b'\n', avail)
        };
        let line = match found {
            Some(end) => {
                self.pending = end + 1;
                // The same buffer again: nothing is read.
                let avail = self.reader.fill_buf().map_err(|e| io_error(line_no, e))?;
                &avail[..end]
            }
            None => {
                self.buf.clear();
                self.reader
                    .read_until(b'\n', &mut self.buf)
                    .map_err(|e| io_error(line_no, e))?;
                if self.buf.last() == Some(&b'\n') {
                    self.buf.pop();
                }
                &self.buf[..]
            }
        };
        self.line += 1;
        Ok(Some(line.strip_suffix(b"\r").unwrap_or(line)))
    }

    /// The next event and its line number; `None` at the end.
    pub fn next_event(&mut self) -> Option<Result<(u64, Event), TraceError>> {
        loop {
            let version = self.header.version;
            let line = match self.next_line() {
                Err(e) => return Some(Err(e)),
                Ok(None) => return None,
                Ok(Some(l)) => l,
            };
            let parsed = event_of_line(line, version);
            let no = self.line;
            if let Some(p) = parsed {
                return Some(p.map(|e| (no, e)).map_err(|reason| self.error(no, reason)));
            }
        }
    }

    /// Read up to `max` more lines (blank ones too) into `bytes` (cleared
    /// first), unparsed, each ended by a line feed: a chunk for a parser
    /// thread. Whole runs of lines are copied from the reader's buffer at
    /// once.
    pub(crate) fn read_lines(&mut self, max: usize, mut bytes: Vec<u8>) -> RawLines {
        let t = Instant::now();
        bytes.clear();
        let first = self.line + 1;
        let (mut error, mut last) = (None, false);
        if self.pending > 0 {
            self.reader.consume(self.pending);
            self.pending = 0;
        }
        let mut n = 0;
        while n < max {
            let avail = match self.reader.fill_buf() {
                Ok(a) => a,
                Err(e) => {
                    let at = first + n as u64;
                    error = Some(self.error(at, read_failure(self.gzip, &e)));
                    last = true;
                    break;
                }
            };
            if avail.is_empty() {
                last = true;
                break;
            }
            let mut end = 0;
            for pos in memchr::memchr_iter(b'\n', avail).take(max - n) {
                end = pos + 1;
                n += 1;
            }
            if end > 0 {
                bytes.extend_from_slice(&avail[..end]);
                self.reader.consume(end);
                continue;
            }
            // A line that straddles the buffer's end.
            let keep = bytes.len();
            match self.reader.read_until(b'\n', &mut bytes) {
                Ok(_) => {
                    if bytes.last() != Some(&b'\n') {
                        bytes.push(b'\n');
                    }
                    n += 1;
                }
                Err(e) => {
                    bytes.truncate(keep);
                    let at = first + n as u64;
                    error = Some(self.error(at, read_failure(self.gzip, &e)));
                    last = true;
                    break;
                }
            }
        }
        self.line = first - 1 + n as u64;
        RawLines {
            first,
            bytes,
            version: self.header.version,
            seconds: t.elapsed().as_secs_f64(),
            read: self.progress(),
            error,
            last,
        }
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
