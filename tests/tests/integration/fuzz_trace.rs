//! The `trace` fuzz target's logic on stable: the committed corpus, random
//! bytes, and random mutations of a real trace's lines.

use cachealloc_tests::bundled_testdata;
use cachealloc_tests::ops::Rng;
use cachealloc_trace::fuzzing;
use std::io::Read;
use std::path::Path;

#[test]
fn trace_reader_never_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/trace");
    let mut corpus = 0;
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        fuzzing::trace(&std::fs::read(e.path()).unwrap());
        corpus += 1;
    }
    let seed = std::env::var("CACHEALLOC_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1234u64);
    let mut rng = Rng(seed);
    for _ in 0..2000 {
        let len = rng.range(0, 512);
        let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        fuzzing::trace(&data);
    }
    // Mutations of a real trace's first lines: flipped bytes, cut lines, swapped ops.
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(bundled_testdata().join("traces/resnet50-train.jsonl.gz")).unwrap(),
    )
    .read_to_string(&mut text)
    .unwrap();
    let head: Vec<u8> = text
        .lines()
        .take(200)
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes();
    let alphabet = b"{}[]\":,-.0123456789eE \nabcdefghijklmnopqrstuvwxyz";
    for _ in 0..2000 {
        let mut d = head.clone();
        for _ in 0..rng.range(1, 8) {
            let i = rng.range(0, d.len() as u64 - 1) as usize;
            match rng.range(0, 2) {
                0 => d[i] = *rng.pick(alphabet),
                1 => {
                    d.remove(i);
                }
                _ => d.insert(i, *rng.pick(alphabet)),
            }
        }
        fuzzing::trace(&d);
    }
    println!("trace: {corpus} corpus inputs, 2000 random, 2000 mutated (seed {seed}) passed");
}
