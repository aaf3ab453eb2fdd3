//! What releasing many segments costs, and whether it stalls another
//! device: device 0 caches 16,384 segments (12 MiB blocks, a segment each,
//! freed), then
//! `cachealloc_empty_cache(0)` gives them all back, while another thread
//! runs cache-hit pairs on device 1 (4 KiB, freed with device -1, as
//! torch's `raw_delete` does: the owner is looked up in the process's
//! segment registry, which the release is writing).
//!
//! Prints the release's time and the slowest pair on device 1 while it ran
//! (the best of 3 rounds each). On a machine with fewer than 2 cores the
//! two threads also take turns on the core.
//!
//! ```sh
//! cargo run --release -p cachealloc-capi --example release_stall [SEGMENTS]
//! ```

use cachealloc::{cachealloc_alloc, cachealloc_empty_cache, cachealloc_free};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds; each figure is its best round.
const ROUNDS: usize = 3;

/// One round: the release's time and the slowest pair during it.
fn round(segments: usize) -> (Duration, Duration, u64) {
    let ptrs: Vec<_> = (0..segments)
        .map(|_| {
            let p = cachealloc_alloc(12 << 20, 0, std::ptr::null_mut());
            assert!(!p.is_null(), "cachealloc_alloc failed");
            p
        })
        .collect();
    for p in ptrs {
        cachealloc_free(p, 0, 0, std::ptr::null_mut());
    }
    let running = Arc::new(AtomicBool::new(true));
    let started = Arc::new(AtomicBool::new(false));
    let pairs = {
        let (running, started) = (Arc::clone(&running), Arc::clone(&started));
        std::thread::spawn(move || {
            let (mut worst, mut n) = (Duration::ZERO, 0u64);
            started.store(true, Ordering::Release);
            while running.load(Ordering::Acquire) {
                let t0 = Instant::now();
                let p = cachealloc_alloc(4096, 1, std::ptr::null_mut());
                assert!(!p.is_null(), "cachealloc_alloc failed");
                cachealloc_free(p, 0, -1, std::ptr::null_mut());
                worst = worst.max(t0.elapsed());
                n += 1;
            }
            (worst, n)
        })
    };
    while !started.load(Ordering::Acquire) {
        std::hint::spin_loop();
    }
    let t0 = Instant::now();
    assert_eq!(
        cachealloc_empty_cache(0),
        0,
        "cachealloc_empty_cache failed"
    );
    let release = t0.elapsed();
    running.store(false, Ordering::Release);
    let (worst, n) = pairs.join().expect("the pairs' thread");
    (release, worst, n)
}

fn main() {
    let segments: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16_384);
    // SAFETY: nothing else runs yet; the library reads its settings at
    // its first call, below.
    unsafe { std::env::set_var("CACHEALLOC_BACKEND", "mock") };
    // Device 1 made, and its pair cached, before timing.
    let p = cachealloc_alloc(4096, 1, std::ptr::null_mut());
    cachealloc_free(p, 0, -1, std::ptr::null_mut());
    let (mut release, mut worst, mut pairs) = (Duration::MAX, Duration::MAX, 0);
    for _ in 0..ROUNDS {
        let (r, w, n) = round(segments);
        release = release.min(r);
        worst = worst.min(w);
        pairs = pairs.max(n);
    }
    println!("segments released:          {segments}");
    println!(
        "release (empty_cache):      {:.1} ms",
        release.as_secs_f64() * 1e3
    );
    println!(
        "slowest pair on device 1:   {:.3} ms ({pairs} pairs during the release)",
        worst.as_secs_f64() * 1e3
    );
}
