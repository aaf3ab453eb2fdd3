//! Streaming reader of allocation traces (`shared/trace-format.md`, version
//! 1): plain or gzip JSON Lines, read line by line, never loaded whole.
//! Every error names the file and the line.

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;

/// A problem with a trace: `FILE:LINE: reason` (line 0: the file as a whole).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The trace file.
    pub path: String,
    /// The 1-based line, 0 for the file as a whole.
    pub line: u64,
    /// What is wrong.
    pub reason: String,
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

/// An integer field as found: a non-negative integer, or why not.
enum Int {
    Ok(u64),
    Bad(&'static str),
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int::Ok(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(if v >= 0 {
                    Int::Ok(v as u64)
                } else {
                    Int::Bad("is negative")
                })
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Int, E> {
                Ok(Int::Bad("is not an integer"))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Int, E> {
                Ok(Int::Bad("is a boolean, not an integer"))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Int, E> {
                Ok(Int::Bad("is a string, not an integer"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Int, E> {
                Ok(Int::Bad("is null, not an integer"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Int, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Int::Bad("is an object, not an integer"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Int, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Int::Bad("is a list, not an integer"))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(borrow)]
    op: Option<Cow<'a, str>>,
    id: Option<Int>,
    size: Option<Int>,
    stream: Option<Int>,
    device: Option<Int>,
}

fn field(v: Option<Int>, key: &str, required: bool) -> Result<Option<u64>, String> {
    match v {
        Some(Int::Ok(x)) => Ok(Some(x)),
        Some(Int::Bad(why)) => Err(format!("`{key}` {why}; it must be a non-negative integer")),
        None if required => Err(format!("missing `{key}`")),
        None => Ok(None),
    }
}

/// Parse one event line (not the header).
pub fn parse_event(line: &[u8]) -> Result<Event, String> {
    let raw: RawEvent<'_> = serde_json::from_slice(line).map_err(|e| {
        if e.is_data() {
            format!("not an event object ({e})")
        } else {
            format!("invalid JSON ({e})")
        }
    })?;
    let Some(op) = raw.op else {
        return Err("missing `op`".to_string());
    };
    let req = |v, k| field(v, k, true).map(|x| x.unwrap_or(0));
    Ok(match op.as_ref() {
        "alloc" => Event::Alloc {
            id: req(raw.id, "id")?,
            size: req(raw.size, "size")?,
            stream: field(raw.stream, "stream", false)?.unwrap_or(0),
            device: field(raw.device, "device", false)?.unwrap_or(0),
        },
        "free" => Event::Free {
            id: req(raw.id, "id")?,
        },
        "record_stream" => Event::RecordStream {
            id: req(raw.id, "id")?,
            stream: req(raw.stream, "stream")?,
        },
        "sync" => Event::Sync {
            stream: field(raw.stream, "stream", false)?,
        },
        "empty_cache" => Event::EmptyCache,
        other => return Err(format!("unknown op {other:?}")),
    })
}

/// Parse the header line.
pub fn parse_header(line: &[u8]) -> Result<Header, String> {
    let v: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| format!("invalid JSON ({e})"))?;
    let Some(obj) = v.as_object() else {
        return Err("missing header: the first line must be a JSON object".to_string());
    };
    match obj.get("format") {
        None => return Err("missing header: the first line has no `format`".to_string()),
        Some(f) if f != "cachealloc-trace" => {
            return Err(format!("unknown format {f}, expected \"cachealloc-trace\""))
        }
        _ => {}
    }
    match obj.get("version") {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(v) => {
            return Err(format!(
                "unsupported version {v}; this reader supports version 1"
            ))
        }
        None => return Err("header has no `version`".to_string()),
    }
    let device_capacity = match obj.get("device_capacity") {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .ok_or("`device_capacity` must be a non-negative integer or null")?,
        ),
    };
    let source = obj
        .get("source")
        .and_then(|s| s.as_str())
        .unwrap_or("")
        .to_string();
    Ok(Header {
        source,
        device_capacity,
    })
}

/// Counts the bytes read from the file (compressed bytes for `.gz`).
struct Counting<R: ?Sized> {
    count: Rc<Cell<u64>>,
    inner: R,
}

impl<R: Read + ?Sized> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}

/// A trace opened for streaming.
pub struct TraceReader {
    path: String,
    reader: Box<dyn BufRead>,
    line: u64,
    buf: Vec<u8>,
    bytes: Rc<Cell<u64>>,
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
            reason: format!("cannot open: {e}"),
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
        inner: Box<dyn Read>,
        gzip: bool,
        file_len: u64,
    ) -> Result<TraceReader, TraceError> {
        let err = |line, reason: String| TraceError {
            path: path.to_string(),
            line,
            reason,
        };
        let bytes = Rc::new(Cell::new(0));
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
        let reader: Box<dyn BufRead> = if gzip {
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
                None => return Err(err(0, "missing header: the trace is empty".to_string())),
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
        (self.bytes.get(), self.file_len)
    }

    fn next_line(&mut self) -> Result<Option<&[u8]>, TraceError> {
        self.buf.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| TraceError {
                path: self.path.clone(),
                line: self.line + 1,
                reason: format!("cannot read: {e}"),
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
        loop {
            match self.next_line() {
                Err(e) => return Some(Err(e)),
                Ok(None) => return None,
                Ok(Some(l)) if l.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Some(l)) => {
                    return Some(parse_event(l).map(|e| (self.line, e)).map_err(|reason| {
                        TraceError {
                            path: self.path.clone(),
                            line: self.line,
                            reason,
                        }
                    }))
                }
            }
        }
    }

    /// An error at `line` of this trace.
    pub fn error(&self, line: u64, reason: String) -> TraceError {
        TraceError {
            path: self.path.clone(),
            line,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse_and_bad_fields_are_named() {
        assert_eq!(
            parse_event(br#"{"op":"alloc","id":3,"size":512,"t":1.5,"note":"x"}"#),
            Ok(Event::Alloc {
                id: 3,
                size: 512,
                stream: 0,
                device: 0
            })
        );
        assert_eq!(
            parse_event(br#"{"op":"sync"}"#),
            Ok(Event::Sync { stream: None })
        );
        for (line, want) in [
            (
                &br#"{"op":"alloc","id":-1,"size":5}"#[..],
                "`id` is negative",
            ),
            (
                br#"{"op":"alloc","id":1,"size":1.5}"#,
                "`size` is not an integer",
            ),
            (
                br#"{"op":"alloc","id":1,"size":true}"#,
                "`size` is a boolean",
            ),
            (br#"{"op":"alloc","id":1,"size":"5"}"#, "`size` is a string"),
            (br#"{"op":"alloc","id":1}"#, "missing `size`"),
            (br#"{"op":"explode"}"#, "unknown op"),
            (br#"{"id":1}"#, "missing `op`"),
            (br#"{"op":"free","id":1"#, "invalid JSON"),
            (br#"[1,2]"#, "not an event object"),
        ] {
            let e = parse_event(line).unwrap_err();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
