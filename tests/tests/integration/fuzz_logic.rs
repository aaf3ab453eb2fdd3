//! The fuzz targets' logic on stable: the committed seed corpus of each
//! target (`fuzz/seeds/<target>/`) and fresh seeded random inputs
//! (`CACHEALLOC_FUZZ_SEED`, `CACHEALLOC_FUZZ_CASES`; the seed is printed).

use cachealloc_tests::fuzz::{self, Coverage};
use cachealloc_tests::ops::Rng;
use std::path::Path;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn drive(target: &str, f: fn(&[u8]) -> Coverage, default_cases: u64, max_len: u64) -> Coverage {
    let mut cov = Coverage::default();
    let seed = std::env::var("CACHEALLOC_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    let cases = std::env::var("CACHEALLOC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    let seeds = corpus(target);
    for (k, input) in seeds.iter().enumerate() {
        match std::panic::catch_unwind(|| f(input)) {
            Ok(c) => cov.add(c),
            Err(e) => std::panic::resume_unwind(Box::new(format!(
                "{target}: corpus input {k} failed: {e:?}"
            ))),
        }
    }
    let mut rng = Rng(seed);
    for k in 0..cases {
        let len = rng.range(0, max_len);
        let input: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match std::panic::catch_unwind(|| f(&input)) {
            Ok(c) => cov.add(c),
            Err(_) => {
                let path =
                    std::env::temp_dir().join(format!("cachealloc-fuzz-{target}-{seed}-{k}.bin"));
                let _ = std::fs::write(&path, &input);
                panic!("{target}: random input {k} failed (CACHEALLOC_FUZZ_SEED={seed}); input saved to {}", path.display());
            }
        }
    }
    println!(
        "{target}: {} corpus inputs and {cases} random inputs (seed {seed}) passed: {cov:?}",
        seeds.len()
    );
    cov
}

#[test]
fn fuzz_ops_logic() {
    let c = drive("ops", fuzz::ops, 3000, 2048);
    assert!(
        c.allocs > 0
            && c.frees > 0
            && c.ooms > 0
            && c.injected > 0
            && c.exhausted > 0
            && c.bad_frees > 0
            && c.while_pending > 0
            && c.shares > 0
            && c.held_frees > 0
            && c.aligned > 0
            && c.bad_alignments > 0
            && c.at_address > 0
            && c.source_allocs > 0,
        "{c:?}"
    );
}

#[test]
fn fuzz_no_false_oom_logic() {
    let c = drive("no_false_oom", fuzz::no_false_oom, 3000, 2048);
    assert!(c.allocs > 0 && c.ooms > 0, "{c:?}");
}

#[test]
fn fuzz_conf_logic() {
    drive("conf", fuzz::conf, 20000, 64);
    // Random bytes rarely spell a valid option: also mutate valid strings.
    let mut rng = Rng(99);
    for s in cachealloc_tests::ops::CONFIGS {
        for _ in 0..500 {
            let mut b = s.as_bytes().to_vec();
            for _ in 0..rng.range(0, 3) {
                if !b.is_empty() {
                    let i = rng.range(0, b.len() as u64 - 1) as usize;
                    b[i] = *rng.pick(b"0123456789:,[]>.-_ eaxTF");
                }
            }
            let _ = fuzz::conf(&b);
        }
    }
}
