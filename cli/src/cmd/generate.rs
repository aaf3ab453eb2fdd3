//! `cachealloc generate`: write a synthetic trace.

use cachealloc_trace::synthetic;
use cachealloc_trace::TraceWriter;
use clap::{Args, ValueEnum};

/// Which workload.
#[derive(Clone, Copy, ValueEnum)]
pub enum Workload {
    /// A training loop with every step on a new stream (weights on stream 0).
    FreshStreams,
    /// --blocks small blocks (512 B to 64 KiB) all live, then freed in
    /// --order (the scale benchmark).
    Scale,
}

/// The order `scale` frees its blocks in.
#[derive(Clone, Copy, ValueEnum)]
pub enum Order {
    /// A random permutation.
    Random,
    /// Allocation order.
    Forward,
    /// Reverse allocation order.
    Reverse,
}

/// Write a synthetic trace.
#[derive(Args)]
pub struct GenerateArgs {
    /// The workload.
    #[arg(value_enum)]
    workload: Workload,
    /// The trace to write (gzip when it ends in .gz).
    out: String,
    /// Training steps.
    #[arg(long, default_value_t = 200)]
    steps: u64,
    /// Layers of the model.
    #[arg(long, default_value_t = 24)]
    layers: u64,
    /// Seed of the sizes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Blocks (scale).
    #[arg(long, default_value_t = 100_000)]
    blocks: u64,
    /// Free order (scale).
    #[arg(long, value_enum, default_value = "random")]
    order: Order,
}

impl GenerateArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let s = match self.workload {
            Workload::FreshStreams => synthetic::fresh_streams(self.steps, self.layers, self.seed),
            Workload::Scale => synthetic::scale(
                self.blocks,
                match self.order {
                    Order::Random => synthetic::FreeOrder::Random,
                    Order::Forward => synthetic::FreeOrder::Forward,
                    Order::Reverse => synthetic::FreeOrder::Reverse,
                },
                self.seed,
            ),
        };
        let written = TraceWriter::create(&self.out, &s.header).and_then(|mut w| {
            for e in &s.events {
                w.event(e, false, None)?;
            }
            w.finish()
        });
        match written {
            Ok(()) => {
                println!("{}: {} events", self.out, s.events.len());
                0
            }
            Err(e) => {
                eprintln!("{}: {e}", self.out);
                1
            }
        }
    }
}
