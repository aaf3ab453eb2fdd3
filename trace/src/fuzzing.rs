//! The logic of the `trace` fuzz target, shared by `fuzz/` and a stable test:
//! the trace reader, `check` and `replay` never panic on any bytes, plain or
//! gzip; they return a value or a `FILE:LINE` error.

use crate::check::check_reader;
use crate::reader::TraceReader;
use crate::run::{run_reader, Options, Quiet};

/// Run the reader, the checker and the replay on `data`.
pub fn trace(data: &[u8]) {
    let gzip = data.starts_with(&[0x1f, 0x8b]);
    for gz in [false, gzip] {
        if let Ok(r) = TraceReader::from_bytes("fuzz", data.to_vec(), gz) {
            if let Err(e) = check_reader(r, &mut |_, _| {}) {
                assert!(e.to_string().starts_with("fuzz"), "{e}");
            }
        }
        if let Ok(r) = TraceReader::from_bytes("fuzz", data.to_vec(), gz) {
            let opts = Options {
                slots: 256,
                ..Options::default()
            };
            if let Ok((report, replay)) = run_reader(r, &opts, &mut Quiet) {
                let _ = report.to_json();
                for d in &replay.devices {
                    if let Err(v) = d.alloc.check_invariants() {
                        panic!("invariants after replay: {v}");
                    }
                }
            }
        }
    }
}
