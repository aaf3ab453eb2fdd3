//! The real traces of `../shared/traces/` (and the one bundled in
//! `traces/`): the core on the mock and the reference model agree on every
//! `memory_stats` key, with the default config and two others.

use cachealloc_tests::{ops, oracle, shared_dir, stats_map};

#[test]
fn real_traces_match_the_reference_model() {
    let shared = shared_dir();
    let mut traces: Vec<_> = std::fs::read_dir(shared.join("traces"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
        .collect();
    traces.sort();
    traces.push(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/resnet50-train.jsonl.gz"),
    );
    assert!(traces.len() >= 5, "expected the shared traces");
    let confs = [
        "",
        "max_split_size_mb:128",
        "roundup_power2_divisions:4,garbage_collection_threshold:0.7",
    ];
    let scratch = std::env::temp_dir().join(format!("cachealloc-real-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut jobs = Vec::new();
    for t in &traces {
        for conf in confs {
            jobs.push(oracle::Job {
                path: t.clone(),
                conf: conf.to_string(),
                capacity: None,
                memory_fraction: None,
            });
        }
    }
    let theirs = oracle::run_batch(&shared, &jobs, &scratch).unwrap();
    let mut failures = Vec::new();
    for (job, model) in jobs.iter().zip(theirs) {
        let case = ops::read_trace(&job.path, &job.conf).unwrap();
        let ours = ops::replay_checked(&case, 500).unwrap();
        let d = oracle::diff(&stats_map(&ours.alloc), &model.unwrap());
        println!(
            "{} {:?}: {} keys differ; peak reserved {}",
            job.path.file_name().unwrap().to_string_lossy(),
            job.conf,
            d.len(),
            ours.alloc.stats().reserved_bytes.all().peak
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
