//! Manual aid: find the first op where the core and the model disagree for
//! one generated case (`CACHEALLOC_DEBUG_SEED`). Ignored by default.

use cachealloc_tests::{ops, oracle, stats_map, testdata_dir};

#[test]
#[ignore]
fn first_divergence() {
    let seed: u64 = std::env::var("CACHEALLOC_DEBUG_SEED")
        .unwrap()
        .parse()
        .unwrap();
    let case = ops::generate(seed);
    let scratch = std::env::temp_dir().join(format!("cachealloc-debug-{seed}"));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut jobs = Vec::new();
    for k in 1..=case.ops.len() {
        let mut c = case.clone();
        c.ops.truncate(k);
        let path = scratch.join(format!("prefix-{k}.jsonl"));
        ops::write_trace(&c, &path).unwrap();
        jobs.push(oracle::Job {
            path,
            conf: c.conf.clone(),
            capacity: None,
            memory_fraction: c.memory_fraction,
        });
    }
    let theirs = oracle::run_batch(&testdata_dir(), &jobs, &scratch).unwrap();
    for (k, t) in theirs.iter().enumerate() {
        let mut c = case.clone();
        c.ops.truncate(k + 1);
        let ours = ops::replay(&c).unwrap();
        let d = oracle::diff(&stats_map(ours.alloc().stats()), t.as_ref().unwrap());
        if !d.is_empty() {
            println!(
                "conf {:?} cap {:?} frac {:?}",
                case.conf, case.capacity, case.memory_fraction
            );
            for (j, op) in case.ops.iter().enumerate().take(k + 1) {
                println!("{j}: {op:?}");
            }
            println!("first divergence after op {k}:\n  {}", d.join("\n  "));
            return;
        }
    }
    println!("no divergence");
}
