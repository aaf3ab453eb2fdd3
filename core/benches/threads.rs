//! `CachingAllocator` (one device behind one lock) shared by 1, 2 and 4
//! threads, each running cache-hit malloc+free pairs of assorted small and
//! large sizes on its own stream. Criterion reports the time of one pair per
//! thread (the wall time of a round divided by the pairs each thread ran):
//! with one lock, T threads can at best keep the total rate, so the
//! per-thread figure grows with T. Run with `--features std` for
//! `std::sync::Mutex`; the default lock is `spin::Mutex`.
//! Figures go in BENCHMARKS.md, never in asserts.

use cachealloc_core::SharedAllocator;
use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};

type Shared = CachingAllocator<MockDevice, Box<[BlockSlot]>, 64>;

const SIZES: [u64; 4] = [4096, 64 << 10, 1 << 20, 8 << 20];

fn shared() -> Shared {
    let a = CachingAllocator::new(DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 1 << 16].into_boxed_slice(),
        Config::DEFAULT,
    ));
    // Warm the cache of every stream a thread will use.
    for s in 0..4u64 {
        let held: Vec<_> = SIZES.iter().map(|&z| a.malloc(z, s).unwrap()).collect();
        for x in held {
            a.free(x.handle.unwrap()).unwrap();
        }
    }
    a
}

/// `pairs` malloc+free pairs on `stream`.
fn run(a: &Shared, stream: u64, pairs: u64) {
    for k in 0..pairs {
        let x = a
            .malloc(black_box(SIZES[(k % 4) as usize]), stream)
            .unwrap();
        a.free(x.handle.unwrap()).unwrap();
    }
}

fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    g.throughput(Throughput::Elements(1));
    for t in [1u64, 2, 4] {
        let a = shared();
        let warm = a.stats().expect("stats").num_device_alloc;
        g.bench_function(BenchmarkId::new("pair_per_thread", t), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for k in 0..t {
                        let a = &a;
                        s.spawn(move || run(a, k, iters));
                    }
                });
                let d: Duration = start.elapsed();
                d
            })
        });
        assert_eq!(
            a.stats().expect("stats").num_device_alloc,
            warm,
            "every pair must hit the cache"
        );
    }
    g.finish();
}

criterion_group!(benches, threads);
criterion_main!(benches);
