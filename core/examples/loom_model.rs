//! Model-checking your own code with loom: a template to copy.
//!
//! Build with `--cfg loom` (and a loom 0.7 dependency of your own, the
//! version cachealloc-core uses: one loom for the whole program). Under that
//! cfg the allocator's lock is loom's, so the model explores every
//! interleaving of your threads inside the allocator too. Build the
//! allocator inside `loom::model` (loom's primitives belong to one
//! execution); a `static` allocator in your code becomes a
//! `loom::lazy_static!` under `cfg(loom)`.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 \
//!   cargo run --release -p cachealloc-core --example loom_model --target-dir target/loom
//! ```

#[cfg(loom)]
fn main() {
    use cachealloc_core::testing::TinyBackend;
    use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator, SharedAllocator};
    use loom::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static EXECUTIONS: AtomicUsize = AtomicUsize::new(0);
    loom::model(|| {
        EXECUTIONS.fetch_add(1, Ordering::Relaxed);
        // An allocator is tens of KiB, built on the stack and moved into
        // its `Arc`: run the body in a thread with a stack larger than
        // loom's default.
        loom::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(body)
            .expect("spawn")
            .join()
            .expect("the model panicked");
    });

    fn body() {
        let a = Arc::new(CachingAllocator::new(DeviceAllocator::new(
            TinyBackend::default(),
            vec![BlockSlot::VACANT; 16],
            Config::DEFAULT,
        )));
        // Your code: here, two threads that allocate and free.
        let t = {
            let a = a.clone();
            loom::thread::spawn(move || {
                let x = a.malloc(4096, 0).expect("malloc");
                a.free(x.handle.expect("handle")).expect("free");
            })
        };
        let y = a.malloc(1 << 20, 0).expect("malloc");
        a.free(y.handle.expect("handle")).expect("free");
        t.join().expect("join");
        // What must hold in every interleaving.
        a.check_invariants().expect("consistent");
        assert_eq!(a.stats().expect("stats").allocation.all().current, 0);
    }
    println!(
        "loom explored {} interleavings; the invariants held in each",
        EXECUTIONS.load(Ordering::Relaxed)
    );
}

#[cfg(not(loom))]
fn main() {
    eprintln!("build with RUSTFLAGS=\"--cfg loom\" to model-check (see the file's docs)");
}
