//! [`TraceWriter`]: writes a trace (`docs/trace-format.md`): the header,
//! then one event per line; gzip when the path ends in `.gz`.

use crate::event::Event;
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
        ] {
            assert_eq!(parse_event(event_json(&e).as_bytes()), Ok(e));
        }
    }
}
