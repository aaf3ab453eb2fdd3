//! Differential test against the reference model of PyTorch's policy:
//! random multi-stream op sequences (alloc, free, record_stream, sync,
//! empty_cache; with and without a capacity, a memory fraction, several
//! config strings) are written as traces, replayed by
//! the test data's `oracle/pytorch_sim.py` and by the core, and every
//! `memory_stats` key must agree.
//!
//! `CACHEALLOC_DIFF_SEED` fixes the seed (printed on every run and on
//! failure); `CACHEALLOC_DIFF_CASES` sets the number of sequences (1000).

use cachealloc_tests::{ops, oracle, stats_map, testdata_dir, testdata_part};
use std::time::{SystemTime, UNIX_EPOCH};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn core_agrees_with_the_reference_model_on_random_sequences() {
    let seed = env_u64("CACHEALLOC_DIFF_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let n = env_u64("CACHEALLOC_DIFF_CASES").unwrap_or(1000);
    eprintln!("differential: seed {seed} ({n} cases); rerun with CACHEALLOC_DIFF_SEED={seed}");
    if testdata_part("oracle/pytorch_sim.py").is_none() {
        return;
    }
    let data = testdata_dir();
    let scratch =
        std::env::temp_dir().join(format!("cachealloc-diff-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();

    let cases: Vec<ops::Case> = (0..n)
        .map(|k| ops::generate(seed.wrapping_add(k.wrapping_mul(0x9E37_79B9))))
        .collect();
    let mut jobs = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        let path = scratch.join(format!("case-{k}.jsonl"));
        ops::write_trace(c, &path).unwrap();
        jobs.push(oracle::Job {
            path,
            conf: c.conf.clone(),
            capacity: None,
            memory_fraction: c.memory_fraction,
        });
    }
    let theirs = oracle::run_batch(&data, &jobs, &scratch).expect("run the reference model");

    let (mut multi, mut capped, mut with_oom, mut with_events, mut ops_total) = (0, 0, 0, 0, 0);
    let (mut expandable, mut stopped) = (0, 0);
    let mut failures = Vec::new();
    for ((c, job), model) in cases.iter().zip(&jobs).zip(&theirs) {
        expandable += c.conf.contains("expandable_segments:True") as u32;
        let model = match model {
            Ok(m) => m,
            Err(e) if oracle::model_stopped_on_known_bug(e) => {
                stopped += 1;
                continue;
            }
            Err(e) => {
                failures.push(format!(
                    "case seed {} ({}): the model failed: {e}",
                    c.seed,
                    job.path.display()
                ));
                continue;
            }
        };
        let ours = match ops::replay(c) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!(
                    "case seed {} ({}): {e}",
                    c.seed,
                    job.path.display()
                ));
                continue;
            }
        };
        let d = oracle::diff(&stats_map(ours.alloc().stats()), model);
        if !d.is_empty() {
            failures.push(format!(
                "case seed {} ({}, conf {:?}, capacity {:?}, fraction {:?}):\n    {}",
                c.seed,
                job.path.display(),
                c.conf,
                c.capacity,
                c.memory_fraction,
                d.join("\n    ")
            ));
        }
        ops_total += c.ops.len();
        multi += c
            .ops
            .iter()
            .any(|o| matches!(o, ops::Op::Alloc { stream: 1.., .. })) as u32;
        capped += c.capacity.is_some() as u32;
        with_oom += (ours.report.ooms > 0) as u32;
        with_events += c
            .ops
            .iter()
            .any(|o| matches!(o, ops::Op::RecordStream { .. })) as u32;
    }
    eprintln!(
        "differential: {n} cases, {ops_total} ops; {multi} multi-stream, {capped} with a capacity, {with_oom} with OOMs, {with_events} with record_stream, {expandable} with expandable segments ({stopped} left out: the model stops on pytorch#119452)"
    );
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {n} cases differ:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    if n >= 1000 {
        assert!(
            multi >= n as u32 / 4
                && capped >= n as u32 / 4
                && with_oom >= n as u32 / 20
                && expandable >= n as u32 / 5,
            "generator lost coverage"
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The batch driver and the model's own command line agree (the batch calls
/// the same `replay` function, in one process).
#[test]
fn batch_driver_matches_the_models_command_line() {
    if testdata_part("oracle/pytorch_sim.py").is_none() {
        return;
    }
    let data = testdata_dir();
    let scratch = std::env::temp_dir().join(format!("cachealloc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut jobs = Vec::new();
    for seed in [7u64, 8, 9] {
        let mut c = ops::generate(seed);
        c.memory_fraction = None;
        let path = scratch.join(format!("cli-{seed}.jsonl"));
        ops::write_trace(&c, &path).unwrap();
        jobs.push(oracle::Job {
            path,
            conf: c.conf,
            capacity: None,
            memory_fraction: None,
        });
    }
    let batch = oracle::run_batch(&data, &jobs, &scratch).unwrap();
    for (job, b) in jobs.iter().zip(batch) {
        let cli = oracle::run_cli(&data, &job.path, &job.conf).unwrap();
        assert_eq!(b.unwrap(), cli);
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The same agreement under the other releases' decisions, on fewer cases:
/// torch 2.12 numbers every block (its order differs from the others' on
/// any sequence that splits), 2.11 orders by address.
#[test]
fn core_agrees_with_the_reference_model_under_each_release() {
    if testdata_part("oracle/pytorch_sim.py").is_none() {
        return;
    }
    let seed = env_u64("CACHEALLOC_DIFF_SEED").unwrap_or(36);
    let n = env_u64("CACHEALLOC_DIFF_RELEASE_CASES").unwrap_or(150);
    let data = testdata_dir();
    for (name, version) in [
        ("2.12", cachealloc_core::TorchVersion::V2_12),
        ("2.11", cachealloc_core::TorchVersion::V2_11),
    ] {
        let scratch = std::env::temp_dir().join(format!(
            "cachealloc-diff-{}-{seed}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&scratch).unwrap();
        let cases: Vec<ops::Case> = (0..n)
            .map(|k| ops::generate(seed.wrapping_add(k.wrapping_mul(0x9E37_79B9))))
            .collect();
        let jobs: Vec<oracle::Job> = cases
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let path = scratch.join(format!("case-{k}.jsonl"));
                ops::write_trace(c, &path).unwrap();
                oracle::Job {
                    path,
                    conf: c.conf.clone(),
                    capacity: None,
                    memory_fraction: c.memory_fraction,
                }
            })
            .collect();
        let theirs = oracle::run_batch_as(&data, &jobs, &scratch, Some(name)).unwrap();
        let mut failures = Vec::new();
        for (c, model) in cases.iter().zip(&theirs) {
            let Ok(model) = model else { continue };
            match ops::replay_as(c, 1, 0, Some(version)) {
                Ok(ours) => {
                    let d = oracle::diff(
                        &cachealloc_tests::stats_map_of(ours.alloc().stats(), version),
                        model,
                    );
                    if !d.is_empty() {
                        failures.push(format!(
                            "torch {name}, case seed {}: {}",
                            c.seed,
                            d.join("; ")
                        ));
                    }
                }
                Err(e) => failures.push(format!("torch {name}, case seed {}: {e}", c.seed)),
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        assert!(
            failures.is_empty(),
            "{} of {n} cases differ:\n{}",
            failures.len(),
            failures[..failures.len().min(5)].join("\n")
        );
    }
}
