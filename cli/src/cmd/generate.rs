//! `cachealloc generate`: write a synthetic trace.

use cachealloc_trace::synthetic;
use cachealloc_trace::TraceWriter;
use clap::{Args, ValueEnum};

/// Which workload.
#[derive(Clone, Copy, ValueEnum)]
pub enum Workload {
    /// A training loop with every step on a new stream (weights on stream 0).
    FreshStreams,
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
}

impl GenerateArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let s = match self.workload {
            Workload::FreshStreams => synthetic::fresh_streams(self.steps, self.layers, self.seed),
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
