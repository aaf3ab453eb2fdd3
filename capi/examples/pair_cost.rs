//! The cost of a cache-hit pair through the C library against the core's,
//! in one run on one machine: `cachealloc_alloc` + `cachealloc_free` on the
//! simulated device (one device, alternating 4 KiB and 8 MiB, as the core's
//! `pair_loop` example does), from the main thread and from a thread
//! started later, beside the same loop on a bare `DeviceAllocator` and on
//! the thread-safe `CachingAllocator`. Nanoseconds per pair: each round
//! times every loop once, N pairs each, one after the other (so a machine
//! that slows down or speeds up during the run shifts them all alike); the
//! best of 9 rounds per loop.
//!
//! ```sh
//! cargo run --release -p cachealloc-capi --example pair_cost [N]
//! ```

use cachealloc::{cachealloc_alloc, cachealloc_free};
use cachealloc_core::{
    BlockSlot, CachingAllocator, Config, DeviceAllocator, SharedAllocator, TraceEntry,
};
use cachealloc_mock::MockDevice;
use std::hint::black_box;
use std::time::Instant;

/// The size of pair `i`: 4 KiB and 8 MiB in turn.
fn size(i: u64) -> u64 {
    if i.is_multiple_of(2) {
        4096
    } else {
        8 << 20
    }
}

/// Nanoseconds per pair of `run(n)`, once.
fn time(n: u64, run: impl FnOnce(u64)) -> f64 {
    let t = Instant::now();
    run(n);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Rounds; each loop's figure is its best round.
const ROUNDS: usize = 9;

/// Pairs through the C functions.
fn c_pairs(n: u64) {
    for i in 0..n {
        let p = cachealloc_alloc(black_box(size(i)) as usize, 0, std::ptr::null_mut());
        assert!(!p.is_null(), "cachealloc_alloc failed");
        cachealloc_free(p, 0, 0, std::ptr::null_mut());
    }
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    // SAFETY: nothing else runs yet; the library reads its settings at
    // its first call, below.
    unsafe { std::env::set_var("CACHEALLOC_BACKEND", "mock") };
    // `c`: only the C library's pairs, once (for an instruction count).
    if std::env::args().nth(2).as_deref() == Some("c") {
        let _keep = cachealloc_alloc(4096, 0, std::ptr::null_mut());
        c_pairs(n);
        return;
    }

    let mut bare: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64> = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 4096].into_boxed_slice(),
        Config::DEFAULT,
    );
    let _keep = bare.malloc(4096, 0).expect("warm-up");
    // The same allocator behind the lock, reached through SharedAllocator.
    let mut inner: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64> = DeviceAllocator::new(
        MockDevice::unlimited(),
        vec![BlockSlot::VACANT; 4096].into_boxed_slice(),
        Config::DEFAULT,
    );
    let _keep = inner.malloc(4096, 0).expect("warm-up");
    let shared = CachingAllocator::new(inner);
    // The C library's configuration (1,024 events, 64 private pools, a
    // history buffer, slots that grow), free by pointer.
    let mut like: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 1024, Box<[TraceEntry]>, 64> =
        DeviceAllocator::with_events_and_history(
            MockDevice::unlimited(),
            vec![BlockSlot::VACANT; 65536].into_boxed_slice(),
            vec![TraceEntry::EMPTY; 0].into_boxed_slice(),
            Config::DEFAULT,
        );
    let _keep = like.malloc(4096, 0).expect("warm-up");
    let like = CachingAllocator::new(like)
        .with_storage_growth(|n| vec![BlockSlot::VACANT; 2 * n as usize].into_boxed_slice());
    // The C library: its device 0 made by the first call, a block kept
    // live as above.
    let keep = cachealloc_alloc(4096, 0, std::ptr::null_mut());

    let mut best = [f64::INFINITY; 6];
    for _ in 0..ROUNDS {
        let mut took = [0.0; 6];
        // `pair_loop`'s loop: free by handle.
        took[0] = time(n, |n| {
            for i in 0..n {
                let x = bare.malloc(black_box(size(i)), 0).expect("malloc");
                bare.free(x.handle.expect("handle")).expect("free");
            }
        });
        // Free by pointer, as the C library does (a lookup in the live index).
        took[1] = time(n, |n| {
            for i in 0..n {
                let x = bare.malloc(black_box(size(i)), 0).expect("malloc");
                bare.free_ptr(x.ptr).expect("free");
            }
        });
        took[2] = time(n, |n| {
            for i in 0..n {
                let x = shared.malloc(black_box(size(i)), 0).expect("malloc");
                shared.free_ptr(x.ptr).expect("free");
            }
        });
        took[3] = time(n, |n| {
            for i in 0..n {
                let x = like.malloc(black_box(size(i)), 0).expect("malloc");
                like.free_ptr(x.ptr).expect("free");
            }
        });
        took[4] = time(n, c_pairs);
        took[5] = std::thread::spawn(move || time(n, c_pairs))
            .join()
            .expect("the thread");
        for (b, t) in best.iter_mut().zip(took) {
            *b = b.min(t);
        }
    }
    cachealloc_free(keep, 0, 0, std::ptr::null_mut());
    let [core, by_ptr, caching, as_c, c_main, c_thread] = best;

    println!("ns per cache-hit pair (best of {ROUNDS} interleaved rounds of {n}, 4 KiB and 8 MiB in turn):");
    println!("  core DeviceAllocator (pair_loop)         {core:6.1}");
    println!("  core DeviceAllocator, free by pointer    {by_ptr:6.1}");
    println!("  core CachingAllocator (SharedAllocator)  {caching:6.1}");
    println!("  core CachingAllocator as the C library's {as_c:6.1}");
    println!(
        "  C library, main thread                   {c_main:6.1}  (+{:.1} over the core)",
        c_main - core
    );
    println!(
        "  C library, a thread started later        {c_thread:6.1}  (+{:.1} over the core)",
        c_thread - core
    );
}
