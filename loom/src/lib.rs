//! The loom models of cachealloc's thread-safe front end are this crate's
//! test `tests/loom.rs` (it has no library of its own). Under `--cfg loom`
//! the core's lock is loom's, so every interleaving of the models' threads
//! inside the allocator is explored:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2 \
//!   cargo test --release -p cachealloc-loom --test loom --target-dir target/loom
//! ```
//!
//! It depends on the core, the simulated device and loom only, so that the
//! models build quickly in their own target folder.
