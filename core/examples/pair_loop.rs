//! A loop of cache-hit malloc+free pairs, for `valgrind --tool=callgrind`
//! (repeatable instruction counts): `cargo build --release -p cachealloc-core
//! --example pair_loop && valgrind --tool=callgrind target/release/examples/pair_loop 1000000 [CONF] [locked]`
//! (CONF: a config string, e.g. `policy:compact`; `locked`: through the
//! thread-safe `CachingAllocator`, its lock and failed-device check).

use cachealloc_core::SharedAllocator;
use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use std::hint::black_box;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let conf = std::env::args().nth(2).unwrap_or_default();
    let config = Config::parse(&conf).expect("a config string");
    let mut a: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64> = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 4096].into_boxed_slice(),
        config,
    );
    let _keep = a.malloc(4096, 0).expect("warm-up");
    if std::env::args().nth(3).as_deref() == Some("locked") {
        let a = CachingAllocator::new(a);
        for i in 0..n {
            let size = if i % 2 == 0 { 4096 } else { 8 << 20 };
            let x = a.malloc(black_box(size), 0).expect("malloc");
            a.free(x.handle.expect("handle")).expect("free");
        }
        black_box(a.stats().expect("stats").allocation.all().allocated);
        return;
    }
    for i in 0..n {
        let size = if i % 2 == 0 { 4096 } else { 8 << 20 };
        let x = a.malloc(black_box(size), 0).expect("malloc");
        a.free(x.handle.expect("handle")).expect("free");
    }
    black_box(a.stats().allocation.all().allocated);
}
