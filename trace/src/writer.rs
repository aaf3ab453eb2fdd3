//! [`TraceWriter`]: writes a trace (`docs/trace-format.md`): the header,
//! then one event per line; gzip when the path ends in `.gz`.

use crate::event::{Event, Streams};
use serde::Serialize;
use std::fs::File;
use std::io::{self, BufWriter, Write};

/// A trace being written.
pub struct TraceWriter {
    out: Box<dyn Write>,
}

impl TraceWriter {
    /// Create `path` and write `header` (a JSON object) as its first line.
    pub fn create(path: &str, header: &serde_json::Value) -> io::Result<TraceWriter> {
        let file = BufWriter::new(File::create(path)?);
        let out: Box<dyn Write> = if path.ends_with(".gz") {
            Box::new(flate2::write::GzEncoder::new(
                file,
                flate2::Compression::default(),
            ))
        } else {
            Box::new(file)
        };
        let mut w = TraceWriter { out };
        serde_json::to_writer(&mut w.out, header)?;
        w.out.write_all(b"\n")?;
        Ok(w)
    }

    /// Write one event; `warmup` marks events that rebuild a starting
    /// state, `t` is the informational time in microseconds.
    pub fn event(&mut self, e: &Event, warmup: bool, t: Option<u64>) -> io::Result<()> {
        let mut line = Line::of(e);
        line.warmup = warmup;
        line.t = t;
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")
    }

    /// Flush and close (and end the gzip stream).
    pub fn finish(mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One event as a JSON object (the stream and the device when not 0).
pub fn event_json(e: &Event) -> String {
    // Serializing a struct of numbers, strings and bools cannot fail.
    serde_json::to_string(&Line::of(e)).unwrap_or_default()
}

/// A trace line: the keys of `docs/trace-format.md`, each written when the
/// event has it (`device` when not 0, `use_on_oom` / `no_split` /
/// `warmup` when true).
#[derive(Serialize, Default)]
struct Line<'a> {
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<(u64, u64)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    streams: Option<StreamList<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    device: u64,
    #[serde(skip_serializing_if = "is_false")]
    use_on_oom: bool,
    #[serde(skip_serializing_if = "is_false")]
    no_split: bool,
    #[serde(skip_serializing_if = "is_false")]
    warmup: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    t: Option<u64>,
}

/// A pool's streams: `"all"` or a list.
#[derive(Serialize)]
#[serde(untagged)]
enum StreamList<'a> {
    All(&'static str),
    List(&'a [u64]),
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl<'a> Line<'a> {
    fn of(e: &'a Event) -> Line<'a> {
        let op = |op| Line {
            op,
            ..Line::default()
        };
        match e {
            &Event::Alloc {
                id,
                size,
                stream,
                device,
            } => Line {
                id: Some(id),
                size: Some(size),
                stream: Some(stream),
                device,
                ..op("alloc")
            },
            &Event::Free { id } => Line {
                id: Some(id),
                ..op("free")
            },
            &Event::RecordStream { id, stream } => Line {
                id: Some(id),
                stream: Some(stream),
                ..op("record_stream")
            },
            &Event::Sync { stream } => Line {
                stream,
                ..op("sync")
            },
            Event::EmptyCache => op("empty_cache"),
            &Event::PoolCreate {
                pool,
                device,
                use_on_oom,
                no_split,
            } => Line {
                pool: Some(pool),
                device,
                use_on_oom,
                no_split,
                ..op("pool_create")
            },
            Event::PoolBegin {
                pool,
                device,
                streams,
                capture,
            } => Line {
                pool: Some(*pool),
                streams: Some(match streams {
                    Streams::All => StreamList::All("all"),
                    s => StreamList::List(s.as_slice()),
                }),
                device: *device,
                ..op(if *capture {
                    "capture_begin"
                } else {
                    "pool_begin"
                })
            },
            &Event::PoolEnd {
                pool,
                device,
                capture,
            } => Line {
                pool: Some(pool),
                device,
                ..op(if capture { "capture_end" } else { "pool_end" })
            },
            &Event::PoolRelease { pool, device } => Line {
                pool: Some(pool),
                device,
                ..op("pool_release")
            },
            &Event::PoolEmptyCache { pool, device } => Line {
                pool: Some(pool),
                device,
                ..op("pool_empty_cache")
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::parse_event;

    #[test]
    fn every_event_reads_back() {
        for e in [
            Event::Alloc {
                id: 1,
                size: 5,
                stream: 2,
                device: 3,
            },
            Event::Alloc {
                id: 1,
                size: 5,
                stream: 0,
                device: 0,
            },
            Event::Free { id: 7 },
            Event::RecordStream { id: 7, stream: 9 },
            Event::Sync { stream: Some(4) },
            Event::Sync { stream: None },
            Event::EmptyCache,
            Event::PoolCreate {
                pool: (0, 1),
                device: 0,
                use_on_oom: true,
                no_split: false,
            },
            Event::PoolBegin {
                pool: (3, 0),
                device: 1,
                streams: Streams::List {
                    list: [1, 3, 0, 0],
                    len: 2,
                },
                capture: true,
            },
            Event::PoolBegin {
                pool: (0, 2),
                device: 0,
                streams: Streams::All,
                capture: false,
            },
            Event::PoolEnd {
                pool: (3, 0),
                device: 1,
                capture: true,
            },
            Event::PoolRelease {
                pool: (0, 1),
                device: 0,
            },
            Event::PoolEmptyCache {
                pool: (0, 1),
                device: 2,
            },
        ] {
            assert_eq!(parse_event(event_json(&e).as_bytes()), Ok(e));
        }
        // The keys as the format writes them.
        let alloc = Event::Alloc {
            id: 1,
            size: 5,
            stream: 0,
            device: 0,
        };
        assert_eq!(
            event_json(&alloc),
            r#"{"op":"alloc","id":1,"size":5,"stream":0}"#
        );
    }
}
