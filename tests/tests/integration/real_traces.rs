//! Every trace of the test data's `traces/`, through the trace crate's
//! reader and replay engine, under four configurations (the default,
//! `max_split_size`, roundup divisions with garbage collection, expandable
//! segments): every `memory_stats` key equals the reference model's.

use cachealloc_core::Config;
use cachealloc_tests::{oracle, shared_part, testdata_dir, testdata_part};
use cachealloc_trace::{run, Options, Quiet};
use std::path::Path;

#[test]
fn every_real_trace_matches_the_reference_model() {
    let (Some(dir), Some(_)) = (
        testdata_part("traces"),
        testdata_part("oracle/pytorch_sim.py"),
    ) else {
        return;
    };
    compare_with_the_model(
        "real-bundled",
        &dir,
        &[
            "",
            "max_split_size_mb:128",
            "roundup_power2_divisions:4,garbage_collection_threshold:0.7",
            "expandable_segments:True",
        ],
    );
}

/// The recordings of other people's GPUs (`../shared/real-traces`, when
/// present) under expandable segments: every key equals the model's.
#[test]
fn third_party_recordings_match_the_model_with_expandable_segments() {
    let (Some(dir), Some(_)) = (
        shared_part("real-traces"),
        testdata_part("oracle/pytorch_sim.py"),
    ) else {
        println!(
            "third-party recordings: 0 checked (../shared/real-traces is not beside the checkout)"
        );
        return;
    };
    compare_with_the_model("real-shared", &dir, &["expandable_segments:True"]);
}

/// Every `.jsonl.gz` trace of `dir` under every config of `confs`, through
/// the trace crate and through the model: the `memory_stats` must agree
/// (`name`: the scratch folder's).
fn compare_with_the_model(name: &str, dir: &Path, confs: &[&str]) {
    let mut traces: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
        .collect();
    traces.sort();
    assert!(!traces.is_empty(), "no traces in {}", dir.display());
    let scratch = cachealloc_tests::scratch(name);
    let jobs: Vec<oracle::Job> = traces
        .iter()
        .flat_map(|t| {
            confs.iter().map(move |c| oracle::Job {
                path: t.clone(),
                conf: c.to_string(),
                capacity: None,
                memory_fraction: None,
            })
        })
        .collect();
    let model = oracle::run_batch(&testdata_dir(), &jobs, &scratch).unwrap();
    let mut failures = Vec::new();
    for (job, m) in jobs.iter().zip(model) {
        let opts = Options {
            config: Config::parse(&job.conf).unwrap(),
            conf: job.conf.clone(),
            ..Options::default()
        };
        let (report, r) = run(job.path.to_str().unwrap(), &opts, &mut Quiet).unwrap();
        for d in &r.devices {
            d.alloc.check_invariants().unwrap();
        }
        let v = report.to_json();
        let d = oracle::diff(v["memory_stats"].as_object().unwrap(), &m.unwrap());
        println!(
            "{} {:?}: {} keys differ, peak reserved {}",
            job.path.display(),
            job.conf,
            d.len(),
            report.peak_reserved_bytes
        );
        if !d.is_empty() {
            failures.push(format!(
                "{} {:?}: {}",
                job.path.display(),
                job.conf,
                d.join("; ")
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "{name}: {} traces checked under {} configurations ({} replays), {} differ",
        traces.len(),
        confs.len(),
        jobs.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
