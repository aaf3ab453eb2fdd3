//! Reading and parsing a trace in chunks, for a replay: on a second thread
//! when the trace is a file large enough to gain from it (the replay applies
//! one chunk while the next is read, decompressed and parsed), else on the
//! replay's own thread. Either way the replay sees the same chunks in the
//! same order; a bad line ends its chunk, carrying the error.

use crate::error::TraceError;
use crate::event::Event;
use crate::reader::TraceReader;
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

/// Give `consume` every chunk of `reader`'s events, in order, until it
/// returns `Ok(true)` (stop), an error, or the chunks run out.
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
    // Two chunks in flight; the consumer hands emptied buffers back.
    let (full_tx, full_rx) = mpsc::sync_channel::<Parsed>(2);
    let (empty_tx, empty_rx) = mpsc::channel::<Vec<(u64, Event)>>();
    std::thread::scope(|s| {
        s.spawn(move || loop {
            let buf = empty_rx
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
            let p = parse_chunk(&mut reader, buf);
            let last = p.last;
            // A consumer that stopped has dropped its end: stop too.
            if full_tx.send(p).is_err() || last {
                return;
            }
        });
        // Owned here, so that a consumer that stops drops it before the
        // scope waits for the parser (whose next send then fails).
        let full_rx = full_rx;
        // The parser only stops after a last chunk, which ends this loop.
        while let Ok(p) = full_rx.recv() {
            if consume(&p)? || p.last {
                return Ok(());
            }
            let _ = empty_tx.send(p.events);
        }
        Ok(())
    })
}
