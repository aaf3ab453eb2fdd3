//! What threads cost through the C library: cache-hit pairs
//! (`cachealloc_alloc` + `cachealloc_free`, 4 KiB and 8 MiB in turn) on the
//! simulated device, from 1, 2 and 4 threads at once.
//!
//! - **own device**: each thread on a device of its own, freeing with its
//!   device named, then with device -1 (torch's `raw_delete`, which knows
//!   no device: the owner is looked up by pointer). With nothing shared
//!   between the devices, a thread's pair should cost what it costs alone;
//!   the difference between the two rows is what the lookup costs, and
//!   whether it shares anything between threads.
//! - **one device**: every thread on device 0. One lock serialises the
//!   pairs: the bound is N times one thread's pair, per thread.
//!
//! Nanoseconds per pair per thread (each thread's wall time over its
//! pairs, the slowest thread's), the best of 5 rounds. On a machine with
//! fewer cores than threads the threads also take turns on the cores.
//!
//! ```sh
//! cargo run --release -p cachealloc-capi --example threads_cost [N]
//! ```

use cachealloc::{cachealloc_alloc, cachealloc_free};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Rounds; each figure is its best round.
const ROUNDS: usize = 5;

/// `n` pairs on `device`, freed with `free_device` (the device, or -1).
fn pairs(n: u64, device: i32, free_device: i32) {
    for i in 0..n {
        let size = if i.is_multiple_of(2) { 4096 } else { 8 << 20 };
        let p = cachealloc_alloc(black_box(size), device, std::ptr::null_mut());
        assert!(!p.is_null(), "cachealloc_alloc failed");
        cachealloc_free(p, 0, free_device, std::ptr::null_mut());
    }
}

/// Nanoseconds per pair per thread of `threads` threads running `n` pairs
/// at once, thread `t` on `device(t)`, freeing with device -1 when `by_ptr`.
fn run(threads: usize, n: u64, device: fn(usize) -> i32, by_ptr: bool) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let start = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let start = Arc::clone(&start);
                std::thread::spawn(move || {
                    let d = device(t);
                    start.wait();
                    let t0 = Instant::now();
                    pairs(n, d, if by_ptr { -1 } else { d });
                    t0.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        let slowest = handles
            .into_iter()
            .map(|h| h.join().expect("a thread"))
            .fold(0.0, f64::max);
        best = best.min(slowest);
    }
    best
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    // SAFETY: nothing else runs yet; the library reads its settings at
    // its first call, below.
    unsafe { std::env::set_var("CACHEALLOC_BACKEND", "mock") };
    // Every device made, and a block kept live on each, before timing.
    let keep: Vec<_> = (0..4)
        .map(|d| cachealloc_alloc(4096, d, std::ptr::null_mut()))
        .collect();
    pairs(1000, 0, 0);

    // `one T`: only T threads on one device (for perf and callgrind).
    if std::env::args().nth(2).as_deref() == Some("one") {
        let threads = std::env::args()
            .nth(3)
            .and_then(|a| a.parse().ok())
            .unwrap_or(2);
        println!("{:.1}", run(threads, n, |_| 0, false));
        return;
    }
    println!("ns per cache-hit pair per thread (best of {ROUNDS} rounds of {n} pairs a thread):");
    println!("  threads  own device, free on it  own device, free by pointer (-1)  one device");
    for threads in [1, 2, 4] {
        let own = run(threads, n, |t| t as i32, false);
        let own_by_ptr = run(threads, n, |t| t as i32, true);
        let one = run(threads, n, |_| 0, false);
        println!("  {threads:7}  {own:22.1}  {own_by_ptr:32.1}  {one:10.1}");
    }
    for (d, p) in keep.into_iter().enumerate() {
        cachealloc_free(p, 0, d as i32, std::ptr::null_mut());
    }
}
