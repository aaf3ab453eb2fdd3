//! cachealloc's settings parser against torch's own, release by release:
//! every string of `tests/data/torch_parser/strings.txt` (valid, edge, odd
//! and malformed ones, each key of each release; a line of several
//! tab-separated strings is a string and its later strings) as torch
//! 2.11 to 2.15 read it (`torch-<release>.jsonl`, written by
//! `scripts/torch-parser.sh` from each release's wheel), and as
//! `Config::parse_for` and `followed_by` read it: accepted or refused
//! alike, and where both accept, the same values.

use cachealloc_core::{Config, TorchVersion};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn data(name: &str) -> String {
    let path = format!("{}/data/torch_parser/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// cachealloc's reading of a line: each string in turn, as later strings.
fn ours(line: &str, version: TorchVersion) -> Result<Config, String> {
    let mut config: Option<Config> = None;
    for s in line.split('\t') {
        config = Some(match config {
            None => Config::parse_for(s, version).map_err(|e| e.to_string())?,
            Some(c) => c.followed_by(c.parse_later(s, &mut |_| {}).map_err(|e| e.to_string())?),
        });
    }
    config.ok_or_else(|| "no string".to_string())
}

/// What differs between torch's values (`t`) and cachealloc's.
fn differences(t: &Value, c: &Config) -> Vec<String> {
    let mut out = Vec::new();
    // Numbers alike whichever way they are written (torch's 0, our 0.0).
    let alike = |a: &Value, b: &Value| {
        a == b || ((a.is_f64() || b.is_f64()) && a.as_f64().is_some() && a.as_f64() == b.as_f64())
    };
    let mut same = |key: &str, ours: Value| {
        if let Some(theirs) = t.get(key) {
            if !alike(theirs, &ours) {
                out.push(format!("{key}: torch {theirs}, cachealloc {ours}"));
            }
        }
    };
    same("large_segment_size", c.large_segment_size.into());
    same("max_split_size", c.max_split_size.into());
    same(
        "max_non_split_rounding_size",
        c.max_non_split_rounding.into(),
    );
    same(
        "roundup_power2_divisions",
        c.roundup_power2_divisions.to_vec().into(),
    );
    same("expandable_segments", c.expandable_segments.into());
    same(
        "release_lock_on_cudamalloc",
        c.release_lock_on_malloc.into(),
    );
    same(
        "graph_capture_record_stream_reuse",
        c.graph_capture_record_stream_reuse.into(),
    );
    same("throw_on_cudamalloc_oom", c.throw_on_cudamalloc_oom.into());
    let h = &c.host;
    same(
        "pinned_use_cuda_host_register",
        h.pinned_use_host_register.into(),
    );
    same(
        "pinned_num_register_threads",
        h.pinned_num_register_threads.into(),
    );
    same(
        "pinned_use_background_threads",
        h.pinned_use_background_threads.into(),
    );
    same(
        "pinned_reserve_segment_size_mb",
        h.pinned_reserve_segment_size_mb.into(),
    );
    same("pinned_free_catch_all", h.pinned_free_catch_all.into());
    // torch keeps bytes, SIZE_MAX when unset; cachealloc MiB, 0 when unset.
    let bytes = |mb: u64| {
        if mb == 0 {
            u64::MAX
        } else {
            mb.wrapping_mul(MIB)
        }
    };
    same(
        "pinned_max_round_threshold",
        bytes(h.pinned_max_round_threshold_mb).into(),
    );
    same(
        "pinned_max_cached_size",
        bytes(h.pinned_max_cached_size_mb).into(),
    );
    same(
        "garbage_collection_threshold",
        c.garbage_collection_threshold.into(),
    );
    same(
        "per_process_memory_fraction",
        c.per_process_memory_fraction.into(),
    );
    out
}

#[test]
fn the_settings_parser_agrees_with_torchs_on_every_string_of_every_release() {
    let strings = data("strings.txt");
    let lines: Vec<&str> = strings.lines().collect();
    assert!(lines.len() >= 92, "{} strings", lines.len());
    let mut disagreements = Vec::new();
    let mut compared = 0;
    for minor in 11..=15 {
        let version = TorchVersion::new(2, minor);
        let answers = data(&format!("torch-2.{minor}.jsonl"));
        let answers: Vec<Value> = answers
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        assert_eq!(
            answers.len(),
            lines.len(),
            "torch 2.{minor}: one answer per string"
        );
        for (line, torch) in lines.iter().zip(&answers) {
            assert_eq!(torch["string"].as_str(), Some(*line), "the answers' order");
            compared += 1;
            let torch_ok = torch["ok"].as_bool().expect("ok");
            match (torch_ok, ours(line, version)) {
                (true, Ok(c)) => {
                    for d in differences(torch, &c) {
                        disagreements.push(format!("2.{minor} {line:?}: {d}"));
                    }
                }
                (false, Err(_)) => {}
                (true, Err(e)) => disagreements.push(format!(
                    "2.{minor} {line:?}: torch accepts, cachealloc: {e}"
                )),
                (false, Ok(_)) => disagreements.push(format!(
                    "2.{minor} {line:?}: cachealloc accepts, torch: {}",
                    torch["error"]
                )),
            }
        }
    }
    assert!(
        disagreements.is_empty(),
        "{} of {compared} disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}
