//! `cachealloc replay`: replay traces and report memory use, fragmentation
//! and speed.

use super::{options, report_error};
use crate::backend::Backend;
use crate::progress::Progress;
use crate::render;
use cachealloc_cli::human;
use cachealloc_trace::{run_on, Options, Report, TraceError};
use clap::Args;

/// Replay traces and report memory use, fragmentation and speed.
#[derive(Args)]
pub struct ReplayArgs {
    /// One JSON object per trace, per line (the keys of torch.cuda.memory_stats() under "memory_stats").
    #[arg(long)]
    json: bool,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax.
    #[arg(long, default_value = "")]
    conf: String,
    /// Device capacity (bytes, or with a unit: 16GiB); default: the trace's, else unlimited.
    #[arg(long, value_parser = human::parse_bytes)]
    capacity: Option<u64>,
    /// set_per_process_memory_fraction on each device (needs a capacity).
    #[arg(long)]
    memory_fraction: Option<f64>,
    /// The device.
    #[arg(long, value_enum, default_value = "mock")]
    backend: Backend,
    /// Block metadata slots per device.
    #[arg(long, default_value_t = 1 << 17)]
    slots: usize,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Trace files (JSON Lines, optionally .gz).
    #[arg(required = true)]
    traces: Vec<String>,
}

impl ReplayArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let opts = match options(&self.conf, self.capacity) {
            Ok(o) => Options {
                memory_fraction: self.memory_fraction,
                slots: self.slots,
                ..o
            },
            Err(status) => return status,
        };
        let mut status = 0;
        for t in &self.traces {
            let mut progress = Progress::new(self.quiet, t);
            match replay_on(self.backend, t, &opts, &mut progress) {
                Ok(r) => {
                    drop(progress);
                    if self.json {
                        println!("{}", r.to_json());
                    } else {
                        render::replay_summary(&r);
                    }
                }
                Err(e) => status = status.max(report_error(&e)),
            }
        }
        status
    }
}

/// Replay `trace` on the chosen kind of device.
fn replay_on(
    backend: Backend,
    trace: &str,
    opts: &Options,
    progress: &mut Progress,
) -> Result<Report, TraceError> {
    match backend {
        Backend::Mock => {
            run_on::<cachealloc_mock::MockDevice, _>(trace, opts, progress).map(|(r, _)| r)
        }
        #[cfg(feature = "cuda")]
        Backend::Cuda => run_on::<crate::backend::Cuda, _>(trace, opts, progress).map(|(r, _)| r),
        #[cfg(feature = "hip")]
        Backend::Hip => run_on::<crate::backend::Hip, _>(trace, opts, progress).map(|(r, _)| r),
    }
}
