//! The fragmentation table of BENCHMARKS.md: per trace, peak live bytes,
//! peak reserved bytes under three configurations, the smallest device each
//! replays on without an OOM (bisection to 2 MiB), and the high-water mark
//! offset-allocator needs for the same alloc/free sequence.
//!
//! cargo run --release -p cachealloc-cli --example fragmentation [TRACE...]

#[path = "../benches/common/peers.rs"]
mod peers;

fn main() {
    let mut traces: Vec<String> = std::env::args().skip(1).collect();
    if traces.is_empty() {
        traces = peers::data_traces();
    }
    peers::print_fragmentation_table(&traces);
}
