//! RMM's memory event log as a trace, so RMM users can ask what PyTorch's
//! policy (or another setting) would have done with their program. The
//! format is the CSV of RMM's `logging_resource_adaptor`
//! (`rmm::mr::logging_resource_adaptor`, Python `LoggingResourceAdaptor`,
//! documented in RMM's `docs/user_guide/logging.md`, "CSV Log Format"): a
//! header `Thread,Time,Action,Pointer,Size,Stream`, then one line per
//! allocation (`allocate`) or deallocation (`deallocate`; older RMM wrote
//! `free`), the pointer and the stream as hexadecimal handles, the size in
//! bytes. `allocate failure` lines (an upstream that refused) are counted
//! and skipped; so are allocations of 0 bytes. The thread and the time are
//! not used.

use super::{Imported, StreamMap};
use crate::event::Event;
use std::collections::HashMap;

/// Whether `bytes` look like an RMM log (its header line).
pub fn is_rmm_log(bytes: &[u8]) -> bool {
    let text = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    text.starts_with(b"Thread,") || text.starts_with(b"thread,")
}

/// A handle: hexadecimal with `0x`, else decimal.
fn handle(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Import the RMM log `text` (named `name` in the header) as a trace of one
/// device. Errors name the line.
pub fn import_rmm_log(text: &str, name: &str) -> Result<Imported, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.lines().enumerate();
    let (_, header) = lines.next().ok_or("an empty RMM log")?;
    let columns: Vec<String> = header
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let col = |name: &str| {
        columns.iter().position(|c| c == name).ok_or(format!(
            "line 1: the RMM log's header has no {name} column: {header:?}"
        ))
    };
    let (action, pointer, size, stream) = (
        col("action")?,
        col("pointer")?,
        col("size")?,
        col("stream")?,
    );
    // First pass: the rows, and the stream handles (trace streams are their
    // rank, so the default stream 0 stays 0).
    let mut rows = Vec::new();
    let mut handles = Vec::new();
    for (k, line) in lines {
        let n = k + 1;
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let field = |i: usize, what: &str| {
            f.get(i)
                .map(|s| s.trim())
                .ok_or(format!("line {n}: no {what} field: {line:?}"))
        };
        let act = field(action, "Action")?.to_ascii_lowercase();
        let ptr = handle(field(pointer, "Pointer")?)
            .ok_or(format!("line {n}: the pointer is not a number: {line:?}"))?;
        let bytes: u64 = field(size, "Size")?
            .parse()
            .map_err(|_| format!("line {n}: the size is not a number of bytes: {line:?}"))?;
        let s = handle(field(stream, "Stream")?)
            .ok_or(format!("line {n}: the stream is not a handle: {line:?}"))?;
        handles.push(s);
        rows.push((n, act, ptr, bytes, s));
    }
    handles.sort_unstable();
    handles.dedup();
    let streams = StreamMap { handles };
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut events = Vec::new();
    let (mut next_id, mut failures, mut empty) = (0u64, 0u64, 0u64);
    for (n, act, ptr, bytes, s) in rows {
        match act.as_str() {
            "allocate" if bytes == 0 || ptr == 0 => empty += 1,
            "allocate" => {
                if live.insert(ptr, next_id).is_some() {
                    return Err(format!(
                        "line {n}: {ptr:#x} is allocated again while it is live"
                    ));
                }
                events.push((
                    Event::Alloc {
                        id: next_id,
                        size: bytes,
                        stream: streams.id(s as i64),
                        device: 0,
                    },
                    false,
                    None,
                ));
                next_id += 1;
            }
            "deallocate" | "free" if bytes == 0 || ptr == 0 => {}
            "deallocate" | "free" => {
                let id = live.remove(&ptr).ok_or(format!(
                    "line {n}: deallocate of {ptr:#x}, which no earlier line allocated"
                ))?;
                events.push((Event::Free { id }, false, None));
            }
            "allocate failure" => failures += 1,
            other => {
                return Err(format!(
                    "line {n}: unknown action {other:?} (RMM writes allocate, deallocate, allocate failure)"
                ))
            }
        }
    }
    let header = serde_json::json!({
        "format": "cachealloc-trace",
        "version": 1,
        "source": format!("rmm log {name} ({failures} allocate failures and {empty} empty allocations left out)"),
        "device_capacity": null,
    });
    Ok(Imported {
        header,
        events,
        devices: Vec::new(),
        conf: String::new(),
        capacity: None,
        streams,
        final_segments: Vec::new(),
        memory_limit: None,
        private_pool_allocs: 0,
        torch: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_become_events_and_bad_rows_name_their_line() {
        let log = "Thread,Time,Action,Pointer,Size,Stream\n\
                   1,1.0,allocate,0x7f0000000000,1024,0x0\n\
                   1,1.1,allocate,0x7f0000000400,4096,0x55aa\n\
                   1,1.2,allocate failure,0x0,1099511627776,0x0\n\
                   1,1.3,deallocate,0x7f0000000000,1024,0x0\n";
        let i = import_rmm_log(log, "t.csv").unwrap();
        assert_eq!(i.events.len(), 3);
        assert!(matches!(
            i.events[1].0,
            Event::Alloc {
                stream: 1,
                size: 4096,
                ..
            }
        ));
        assert!(matches!(i.events[2].0, Event::Free { id: 0 }));
        assert!(i.header["source"]
            .as_str()
            .unwrap()
            .contains("1 allocate failures"));
        assert!(is_rmm_log(log.as_bytes()));
        let bad = "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,deallocate,0x10,4,0x0\n";
        assert_eq!(
            import_rmm_log(bad, "b").err().unwrap(),
            "line 2: deallocate of 0x10, which no earlier line allocated"
        );
        let bad = "Thread,Time,Action,Pointer,Size,Stream\n1,1.0,allocate,0x10,many,0x0\n";
        assert!(import_rmm_log(bad, "b")
            .err()
            .unwrap()
            .starts_with("line 2: the size"));
        assert!(import_rmm_log("a,b\n", "b")
            .err()
            .unwrap()
            .contains("no action column"));
    }
}
