//! The cache-hit malloc+free pair on the mock device, small and large pool,
//! one stream and four streams. Figures go in the closing notes and
//! BENCHMARKS.md, never in asserts.

use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;

type Alloc = DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64>;

fn allocator() -> Alloc {
    DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 1 << 16].into_boxed_slice(),
        Config::DEFAULT,
    )
}

fn pair(c: &mut Criterion) {
    let mut g = c.benchmark_group("cache_hit_pair");
    g.throughput(Throughput::Elements(1));
    for (name, size) in [("small_4KiB", 4096u64), ("large_8MiB", 8 << 20)] {
        for streams in [1u64, 4] {
            let mut a = allocator();
            // Warm the cache: one segment per stream, plus live neighbours so
            // the pair splits and merges inside a segment as real workloads do.
            let mut keep = Vec::new();
            for s in 0..streams {
                keep.push(a.malloc(size, s).unwrap());
                let x = a.malloc(size, s).unwrap();
                a.free(x.handle.unwrap()).unwrap();
            }
            let mut s = 0u64;
            g.bench_function(BenchmarkId::new(name, format!("{streams}_streams")), |b| {
                b.iter(|| {
                    let x = a.malloc(black_box(size), s).unwrap();
                    a.free(x.handle.unwrap()).unwrap();
                    s = (s + 1) % streams;
                })
            });
            assert_eq!(
                a.stats().num_device_alloc,
                streams as i64,
                "the pair must hit the cache"
            );
            drop(keep);
        }
    }
    g.finish();
}

/// The same pair with N cached blocks of assorted sizes already in the free
/// index (fragmented: every cached block sits between two live ones), so the
/// best-fit search walks a tree of N nodes.
fn scaling(c: &mut Criterion) {
    let mut g = c.benchmark_group("scaling");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    for n in [1_000usize, 10_000, 100_000, 1_000_000] {
        let mut a: Alloc = DeviceAllocator::new(
            MockDevice::unlimited(),
            vec![BlockSlot::VACANT; 2 * n + 4096].into_boxed_slice(),
            Config::DEFAULT,
        );
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut holes = Vec::with_capacity(n);
        let mut keep = Vec::with_capacity(n);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Sizes from 512 B to 32 KiB, never exactly the pair's 4 KiB.
            let size = 512 * (1 + x % 64);
            let size = if size == 4096 { 4608 } else { size };
            holes.push(a.malloc(size, 0).unwrap());
            keep.push(a.malloc(512, 0).unwrap());
        }
        for h in holes {
            a.free(h.handle.unwrap()).unwrap();
        }
        let cached = a.cache_info();
        assert!(cached.cached_bytes > 0);
        g.bench_function(BenchmarkId::new("pair_4KiB_with_free_blocks", n), |b| {
            b.iter(|| {
                let x = a.malloc(black_box(4096), 0).unwrap();
                a.free(x.handle.unwrap()).unwrap();
            })
        });
        drop(keep);
    }
    g.finish();
}

criterion_group!(benches, pair, scaling);
criterion_main!(benches);
