//! The fragmentation table of BENCHMARKS.md: per trace, peak live bytes,
//! peak reserved bytes under three configurations, the smallest device each
//! replays on without an OOM (bisection to 2 MiB), and the high-water mark
//! offset-allocator needs for the same alloc/free sequence.
//!
//! cargo run --release -p cachealloc-cli --example fragmentation [TRACE...]

#[path = "../benches/common/peers.rs"]
mod peers;

use cachealloc_cli::human::bytes;
use cachealloc_cli::replay::{self, Options, Quiet};
use cachealloc_core::Config;

fn main() {
    let mut traces: Vec<String> = std::env::args().skip(1).collect();
    if traces.is_empty() {
        traces = peers::shared_traces();
    }
    let confs = ["", "max_split_size_mb:128", "roundup_power2_divisions:4"];
    println!("| trace | peak live | peak reserved (default) | (max_split_size_mb:128) | (roundup_power2_divisions:4) | min capacity (default / mss 128 / rp2 4) | offset-allocator high-water |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for t in &traces {
        let mut reserved = Vec::new();
        let mut mins = Vec::new();
        let mut live = 0;
        for c in confs {
            let opts = Options {
                config: Config::parse(c).expect("config"),
                conf: c.to_string(),
                ..Options::default()
            };
            let (r, _) = replay::run(t, &opts, &mut Quiet).expect("replay");
            live = r.peak_live_bytes;
            reserved.push(format!(
                "{} ({:.3})",
                bytes(r.peak_reserved_bytes),
                r.fragmentation()
            ));
            mins.push(bytes(
                replay::min_capacity(t, &opts, &r).expect("bisection"),
            ));
        }
        let seq = peers::load(t);
        let mut off = peers::Offset::new(&seq);
        assert_eq!(off.run(&seq), 0);
        let hw = off.high_water * peers::UNIT;
        let name = std::path::Path::new(t)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} ({:.3}) |",
            bytes(live),
            reserved[0],
            reserved[1],
            reserved[2],
            mins.join(" / "),
            bytes(hw),
            hw as f64 / live as f64
        );
    }
}
