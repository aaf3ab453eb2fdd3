//! Replay speed and peers, on the real traces of `tests/data/traces/`:
//! - `parse/<trace>`: reading + gunzip + JSON only;
//! - `replay/<trace>`: applying the parsed events to the allocator on the
//!   simulated device (bookkeeping only);
//! - first, untimed: the fragmentation table of BENCHMARKS.md;
//! - `peers/<trace>/<allocator>`: the trace's alloc/free sequence on ours,
//!   offset-allocator, rlsf and a BTreeMap best-fit baseline.
//!
//! cargo bench -p cachealloc-cli --bench replay

#[path = "common/peers.rs"]
mod peers;

use cachealloc_trace::{Event, Options, Replay, TraceReader};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use std::time::Duration;

fn parse_all(path: &str) -> Vec<Event> {
    let mut r = TraceReader::open(path).expect("open");
    let mut v = Vec::new();
    while let Some(e) = r.next_event() {
        v.push(e.expect("valid").1);
    }
    v
}

fn name(path: &str) -> String {
    std::path::Path::new(path)
        .file_name()
        .map(|f| f.to_string_lossy().replace(".jsonl.gz", ""))
        .unwrap_or_default()
}

fn replay(c: &mut Criterion) {
    for t in peers::data_traces() {
        let events = parse_all(&t);
        let mut g = c.benchmark_group(format!("replay/{}", name(&t)));
        g.throughput(Throughput::Elements(events.len() as u64));
        g.sample_size(20).measurement_time(Duration::from_secs(4));
        g.bench_function("parse", |b| b.iter(|| parse_all(&t).len()));
        g.bench_function("bookkeeping", |b| {
            b.iter_batched(
                || {
                    Replay::<cachealloc_mock::MockDevice>::new(
                        Options::default(),
                        &Default::default(),
                    )
                },
                |mut r| {
                    for e in &events {
                        if r.apply(*e).is_err() {
                            panic!("replay failed");
                        }
                    }
                    r.events
                },
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

fn peers_bench(c: &mut Criterion) {
    for t in peers::data_traces() {
        let seq = peers::load(&t);
        let pool = peers::Pool::new(&seq);
        let mut g = c.benchmark_group(format!("peers/{}", name(&t)));
        g.throughput(Throughput::Elements(seq.ops.len() as u64));
        g.sample_size(20).measurement_time(Duration::from_secs(4));
        g.bench_function("cachealloc", |b| {
            b.iter_batched(
                || peers::Ours::new(&seq),
                |mut a| a.run(&seq),
                BatchSize::PerIteration,
            )
        });
        g.bench_function("offset-allocator", |b| {
            b.iter_batched(
                || peers::Offset::new(&seq),
                |mut a| a.run(&seq),
                BatchSize::PerIteration,
            )
        });
        g.bench_function("rlsf", |b| {
            b.iter_batched(
                || peers::Rlsf::new(&seq, &pool),
                |mut a| a.run(&seq),
                BatchSize::PerIteration,
            )
        });
        g.bench_function("btreemap-best-fit", |b| {
            b.iter_batched(
                || peers::BTreeBestFit::new(&seq),
                |mut a| a.run(&seq),
                BatchSize::PerIteration,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, replay, peers_bench);

fn main() {
    // The fragmentation table is not timed: it is printed once, first.
    println!("fragmentation (peak reserved / peak live; min capacity by bisection to 2 MiB):");
    peers::print_fragmentation_table(&peers::data_traces());
    benches();
    Criterion::default().configure_from_args().final_summary();
}
