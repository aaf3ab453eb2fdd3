//! [`TraceWriter`]: writes a trace (`docs/trace-format.md`): the header,
//! then one event per line; gzip when the path ends in `.gz`.

use crate::event::{Event, Streams};
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
        let mut line = event_json(e);
        line.pop(); // the closing brace
        if warmup {
            line.push_str(r#","warmup":true"#);
        }
        if let Some(t) = t {
            line.push_str(&format!(r#","t":{t}"#));
        }
        line.push_str("}\n");
        self.out.write_all(line.as_bytes())
    }

    /// Flush and close (and end the gzip stream).
    pub fn finish(mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One event as a JSON object (the stream and the device when not 0).
pub fn event_json(e: &Event) -> String {
    match *e {
        Event::Alloc {
            id,
            size,
            stream,
            device,
        } => {
            let mut s = format!(r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream}"#);
            if device != 0 {
                s.push_str(&format!(r#","device":{device}"#));
            }
            s.push('}');
            s
        }
        Event::Free { id } => format!(r#"{{"op":"free","id":{id}}}"#),
        Event::RecordStream { id, stream } => {
            format!(r#"{{"op":"record_stream","id":{id},"stream":{stream}}}"#)
        }
        Event::Sync { stream: Some(s) } => format!(r#"{{"op":"sync","stream":{s}}}"#),
        Event::Sync { stream: None } => r#"{"op":"sync"}"#.to_string(),
        Event::EmptyCache => r#"{"op":"empty_cache"}"#.to_string(),
        Event::PoolCreate {
            pool,
            device,
            use_on_oom,
            no_split,
        } => format!(
            r#"{{"op":"pool_create","pool":[{},{}]{}{}{}}}"#,
            pool.0,
            pool.1,
            device_key(device),
            if use_on_oom {
                r#","use_on_oom":true"#
            } else {
                ""
            },
            if no_split { r#","no_split":true"# } else { "" }
        ),
        Event::PoolBegin {
            pool,
            device,
            streams,
            capture,
        } => {
            let streams = match streams {
                Streams::All => r#""all""#.to_string(),
                s => format!("{:?}", s.as_slice()).replace(' ', ""),
            };
            format!(
                r#"{{"op":"{}","pool":[{},{}],"streams":{streams}{}}}"#,
                if capture {
                    "capture_begin"
                } else {
                    "pool_begin"
                },
                pool.0,
                pool.1,
                device_key(device)
            )
        }
        Event::PoolEnd {
            pool,
            device,
            capture,
        } => format!(
            r#"{{"op":"{}","pool":[{},{}]{}}}"#,
            if capture { "capture_end" } else { "pool_end" },
            pool.0,
            pool.1,
            device_key(device)
        ),
        Event::PoolRelease { pool, device } => format!(
            r#"{{"op":"pool_release","pool":[{},{}]{}}}"#,
            pool.0,
            pool.1,
            device_key(device)
        ),
        Event::PoolEmptyCache { pool, device } => format!(
            r#"{{"op":"pool_empty_cache","pool":[{},{}]{}}}"#,
            pool.0,
            pool.1,
            device_key(device)
        ),
    }
}

/// `,"device":N` unless the device is 0.
fn device_key(device: u64) -> String {
    if device == 0 {
        String::new()
    } else {
        format!(r#","device":{device}"#)
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
    }
}
