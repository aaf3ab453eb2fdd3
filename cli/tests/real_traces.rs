//! Every trace of `../shared/traces/` and the bundled one, through the CLI's
//! reader and replay engine, under three configurations: every
//! `memory_stats` key equals the reference model's.

use cachealloc_cli::replay::{self, Options, Quiet};
use cachealloc_core::Config;
use cachealloc_tests::{oracle, shared_dir};
use std::path::Path;

#[test]
fn every_real_trace_matches_the_reference_model() {
    let shared = shared_dir();
    let mut traces: Vec<_> = std::fs::read_dir(shared.join("traces"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 4, "expected the shared traces");
    traces.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/resnet50-train.jsonl.gz"));
    let confs = [
        "",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4,garbage_collection_threshold:0.7",
    ];
    let scratch = std::env::temp_dir().join(format!("cachealloc-real-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
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
    let model = oracle::run_batch(&shared, &jobs, &scratch).unwrap();
    let mut failures = Vec::new();
    for (job, m) in jobs.iter().zip(model) {
        let opts = Options {
            config: Config::parse(&job.conf).unwrap(),
            conf: job.conf.clone(),
            ..Options::default()
        };
        let (report, r) = replay::run(job.path.to_str().unwrap(), &opts, &mut Quiet).unwrap();
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
    assert!(failures.is_empty(), "{failures:#?}");
}
