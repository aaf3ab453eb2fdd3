//! Reading and parsing a trace in chunks, for a replay: on other threads
//! when the trace is a file large enough to gain from it (one reads and
//! decompresses, one parses, while the replay applies the chunk before),
//! else on the replay's own thread. Either way the replay sees the events
//! in the file's order, and a bad line ends its chunk, carrying the error.

use crate::error::TraceError;
use crate::event::Event;
use crate::reader::{event_of_line, RawLines, TraceReader};
use std::sync::mpsc;
use std::time::Instant;

/// Events per chunk.
pub(crate) const CHUNK: usize = 4096;

/// Traces smaller than this (bytes of the file) are parsed on the replay's
/// thread: a second thread would cost more than it saves.
const PIPELINE_FROM: u64 = 1 << 16;

/// A chunk of parsed events.
pub(crate) struct Parsed {
    /// Its events with their lines.
    pub(crate) events: Vec<(u64, Event)>,
    /// Seconds spent reading, decompressing and parsing it.
    pub(crate) seconds: f64,
    /// Bytes of the file read so far, and its size.
    pub(crate) read: (u64, u64),
    /// The bad line that ended it (its events come before that line).
    pub(crate) error: Option<TraceError>,
    /// Whether it is the last.
    pub(crate) last: bool,
}

/// Read the next chunk into `events` (cleared first).
fn parse_chunk(reader: &mut TraceReader, mut events: Vec<(u64, Event)>) -> Parsed {
    let t = Instant::now();
    events.clear();
    let (mut error, mut last) = (None, false);
    while events.len() < CHUNK {
        match reader.next_event() {
            None => {
                last = true;
                break;
            }
            Some(Ok(e)) => events.push(e),
            Some(Err(e)) => {
                error = Some(e);
                last = true;
                break;
            }
        }
    }
    Parsed {
        events,
        seconds: t.elapsed().as_secs_f64(),
        read: reader.progress(),
        error,
        last,
    }
}

/// Parse lines read by [`TraceReader::read_lines`] into a chunk of events.
/// `path` names the file in errors.
fn parse_lines(raw: RawLines, path: &str, mut events: Vec<(u64, Event)>) -> Parsed {
    let t = Instant::now();
    events.clear();
    let mut error = None;
    let mut start = 0;
    for (k, end) in memchr::memchr_iter(b'\n', &raw.bytes).enumerate() {
        let no = raw.first + k as u64;
        let line = &raw.bytes[start..end];
        start = end + 1;
        match event_of_line(line.strip_suffix(b"\r").unwrap_or(line), raw.version) {
            None => {}
            Some(Ok(e)) => events.push((no, e)),
            Some(Err(reason)) => {
                error = Some(TraceError {
                    path: path.to_string(),
                    line: no,
                    reason,
                });
                break;
            }
        }
    }
    let last = raw.last || error.is_some();
    Parsed {
        events,
        seconds: raw.seconds + t.elapsed().as_secs_f64(),
        read: raw.read,
        error: error.or(raw.error),
        last,
    }
}

/// Parser threads beside the reading thread on a machine of `threads`: one
/// on two cores, since the plain lines are parsed by hand
/// (`fast_parse.rs`) faster than the reading thread decompresses them and a
/// second only takes a core from the replay; two where there are more
/// cores.
fn parsers(threads: usize) -> usize {
    if threads > 2 {
        2
    } else {
        1
    }
}

/// Give `consume` every chunk of `reader`'s events, in order, until it
/// returns `Ok(true)` (stop), an error, or the chunks run out.
///
/// For a large file on a machine with two cores or more, one thread reads
/// and decompresses chunks of lines and deals them in turn to the parser
/// threads; the caller takes the parsed chunks in the same turn, so the
/// order is the file's. A consumer that stops drops its ends of the
/// channels, and every thread then stops at its next send.
pub(crate) fn for_each_chunk(
    mut reader: TraceReader,
    mut consume: impl FnMut(&Parsed) -> Result<bool, TraceError>,
) -> Result<(), TraceError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if reader.progress().1 < PIPELINE_FROM || threads < 2 {
        let mut buf = Vec::with_capacity(CHUNK);
        loop {
            let p = parse_chunk(&mut reader, buf);
            if consume(&p)? || p.last {
                return Ok(());
            }
            buf = p.events;
        }
    }
    let path = reader.path().to_string();
    std::thread::scope(|s| {
        let parsers = parsers(threads);
        let mut to_parsers = Vec::with_capacity(parsers);
        let mut from_parsers = Vec::with_capacity(parsers);
        for _ in 0..parsers {
            let (raw_tx, raw_rx) = mpsc::sync_channel::<RawLines>(1);
            let (out_tx, out_rx) = mpsc::sync_channel::<Parsed>(1);
            let path = path.as_str();
            s.spawn(move || {
                while let Ok(raw) = raw_rx.recv() {
                    let p = parse_lines(raw, path, Vec::with_capacity(CHUNK));
                    let last = p.last;
                    if out_tx.send(p).is_err() || last {
                        return;
                    }
                }
            });
            to_parsers.push(raw_tx);
            from_parsers.push(out_rx);
        }
        s.spawn(move || {
            for k in 0.. {
                let raw = reader.read_lines(CHUNK, Vec::with_capacity(CHUNK * 64));
                let last = raw.last;
                if to_parsers[k % parsers].send(raw).is_err() || last {
                    return;
                }
            }
        });
        // Owned here, so that a consumer that stops drops them before the
        // scope waits for the threads (whose next send then fails).
        let from_parsers = from_parsers;
        for k in 0.. {
            let Ok(p) = from_parsers[k % parsers].recv() else {
                break;
            };
            if consume(&p)? || p.last {
                break;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A trace of `n` events, with blank lines, CRLF line ends and no line
    /// feed after the last line; `bad`: the line that is malformed.
    fn trace(n: u64, bad: Option<u64>) -> Vec<u8> {
        let mut s = String::from("{\"format\":\"cachealloc-trace\",\"version\":1}\n");
        let mut line = 1;
        for i in 0..n {
            line += 1;
            if Some(line) == bad {
                s.push_str("{\"op\":\"alloc\",\"id\":1,\"size\":-5,\"stream\":0}\n");
                continue;
            }
            if i % 2 == 0 {
                s.push_str(&format!(
                    "{{\"op\":\"alloc\",\"id\":{i},\"size\":{},\"stream\":0}}",
                    512 * (i % 97 + 1)
                ));
            } else {
                s.push_str(&format!("{{\"op\":\"free\",\"id\":{}}}", i - 1));
            }
            s.push_str(if i % 7 == 0 { "\r\n" } else { "\n" });
            if i % 1000 == 999 {
                s.push_str("   \n");
                line += 1;
            }
        }
        s.pop(); // no line feed at the end
        s.into_bytes()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Every event with its line, one by one on this thread.
    fn one_by_one(data: &[u8], gz: bool) -> (Vec<(u64, Event)>, Option<TraceError>) {
        let mut r = TraceReader::from_bytes("t", data.to_vec(), gz).unwrap();
        let mut out = Vec::new();
        while let Some(e) = r.next_event() {
            match e {
                Ok(e) => out.push(e),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    /// Every event with its line, through `for_each_chunk`.
    fn chunked(data: &[u8], gz: bool) -> (Vec<(u64, Event)>, Option<TraceError>) {
        let r = TraceReader::from_bytes("t", data.to_vec(), gz).unwrap();
        let mut out = Vec::new();
        let mut error = None;
        let res = for_each_chunk(r, |p| {
            out.extend_from_slice(&p.events);
            if let Some(e) = &p.error {
                return Err(e.clone());
            }
            Ok(false)
        });
        if let Err(e) = res {
            error = Some(e);
        }
        (out, error)
    }

    #[test]
    fn threads_give_the_events_of_the_file_in_order() {
        for gz in [false, true] {
            let data = trace(30_000, None);
            let data = if gz { gzip(&data) } else { data };
            assert!(
                data.len() as u64 >= PIPELINE_FROM,
                "large enough for threads"
            );
            let (want, e) = one_by_one(&data, gz);
            assert!(e.is_none());
            assert_eq!(want.len(), 30_000);
            let (got, e) = chunked(&data, gz);
            assert!(e.is_none(), "{e:?}");
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_bad_line_deep_in_a_large_file_names_its_line() {
        for gz in [false, true] {
            let data = trace(30_000, Some(20_001));
            let data = if gz { gzip(&data) } else { data };
            let (want, we) = one_by_one(&data, gz);
            let (got, ge) = chunked(&data, gz);
            let (we, ge) = (we.unwrap(), ge.unwrap());
            assert_eq!(we.line, 20_001);
            assert_eq!((ge.line, ge.to_string()), (we.line, we.to_string()));
            assert_eq!(got, want, "the events before the bad line, all of them");
        }
    }

    #[test]
    fn a_consumer_that_stops_early_ends_every_thread() {
        let data = trace(100_000, None);
        let r = TraceReader::from_bytes("t", data, false).unwrap();
        let mut chunks = 0;
        for_each_chunk(r, |_| {
            chunks += 1;
            Ok(chunks == 2)
        })
        .unwrap();
        assert_eq!(chunks, 2);
    }
}
