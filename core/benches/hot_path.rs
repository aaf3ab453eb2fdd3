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
                a.free(x.id.unwrap()).unwrap();
            }
            let mut s = 0u64;
            g.bench_function(BenchmarkId::new(name, format!("{streams}_streams")), |b| {
                b.iter(|| {
                    let x = a.malloc(black_box(size), s).unwrap();
                    a.free(x.id.unwrap()).unwrap();
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

criterion_group!(benches, pair);
criterion_main!(benches);
