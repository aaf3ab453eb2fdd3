//! The integration tests, in one binary (one link): PyTorch-parity
//! scenarios, the backend conformance suite on the mock, the differential
//! test against the reference model, the real traces, bad input and error
//! paths, fault injection, and the fuzz targets' logic on stable.
//! (`no_heap` is a binary of its own: a global allocator. The loom models
//! are the crate `loom/`.)

mod aligned;
mod backend_conformance;
mod capture;
mod checkpoint;
mod compact;
mod conformance;
mod debug_prefix;
mod differential;
mod dropped;
mod errors;
mod expandable;
mod fault_injection;
mod front_ends;
mod fuzz_logic;
mod fuzz_trace;
mod history;
mod ipc;
mod oom_classes;
mod real_traces;
mod shared_allocator;
#[path = "../common/shared_space.rs"]
mod shared_space;
mod snapshots;
mod tf_allocator;
mod torch_parser;
