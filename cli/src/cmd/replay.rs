//! `cachealloc replay`: replay traces and report memory use, fragmentation
//! and speed.

use super::{options, report_error};
use crate::backend::Backend;
use crate::progress::Progress;
use crate::render;
use cachealloc_cli::human;
use cachealloc_core::TorchVersion;
use cachealloc_trace::{
    peak_event, run_on, write_snapshot, Options, Report, TraceError, TraceReader,
};
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
    /// The torch release whose decisions to take (2.11 to 2.15: the order of
    /// cached blocks of one size, the keys of the settings and statistics);
    /// default: the trace's `torch_version`, else the newest (2.15).
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<TorchVersion>,
    /// set_per_process_memory_fraction on each device (needs a capacity).
    #[arg(long)]
    memory_fraction: Option<f64>,
    /// The device.
    #[arg(long, value_enum, default_value = "mock")]
    backend: Backend,
    /// Block metadata slots per device, fixed (88 bytes each). Without it the
    /// replay starts with 8192 and doubles them whenever they run out.
    #[arg(long)]
    slots: Option<usize>,
    /// Write PyTorch's memory snapshot of the replay (its final state and its
    /// whole history) for pytorch.org/memory_viz: a pickle, or JSON if the
    /// name ends in .json. One trace at a time.
    #[arg(long, value_name = "OUT")]
    snapshot: Option<String>,
    /// Take the snapshot after this event (counted from 0) or at the peak of
    /// reserved bytes (`peak`) instead of at the end.
    #[arg(long, value_name = "EVENT|peak", requires = "snapshot")]
    snapshot_at: Option<SnapshotAt>,
    /// Give the simulated device the device addresses of the recorded run
    /// (traces made by `cachealloc import` carry them), so best-fit ties
    /// break as they did there.
    #[arg(long)]
    real_addresses: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Trace files (JSON Lines, optionally .gz).
    #[arg(required = true)]
    traces: Vec<String>,
}

/// Where `--snapshot-at` takes the snapshot.
#[derive(Clone, Copy, Debug)]
pub enum SnapshotAt {
    /// After this event.
    Event(u64),
    /// At the peak of reserved bytes.
    Peak,
}

impl std::str::FromStr for SnapshotAt {
    type Err = String;
    fn from_str(s: &str) -> Result<SnapshotAt, String> {
        if s == "peak" {
            return Ok(SnapshotAt::Peak);
        }
        s.parse()
            .map(SnapshotAt::Event)
            .map_err(|_| format!("{s:?}: an event index (from 0) or `peak`"))
    }
}

impl ReplayArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let opts = match options(&self.conf, self.capacity, self.torch_version) {
            Ok(o) => Options {
                memory_fraction: self.memory_fraction,
                slots: self.slots.unwrap_or(o.slots),
                grow_slots: self.slots.is_none(),
                real_addresses: self.real_addresses,
                ..o
            },
            Err(status) => return status,
        };
        if self.snapshot.is_some() && self.traces.len() > 1 {
            eprintln!("--snapshot: one trace at a time");
            return 2;
        }
        let mut status = 0;
        for t in &self.traces {
            let (opts, stop) = match self.snapshot_options(t, &opts) {
                Ok(x) => x,
                Err(e) => {
                    status = status.max(report_error(&e));
                    continue;
                }
            };
            let mut progress = Progress::new(self.quiet, t).stopping_at(stop);
            match replay_on(self.backend, t, &opts, &mut progress) {
                Ok(r) => {
                    drop(progress);
                    if let Err(s) = self.write_snapshot(&r) {
                        status = status.max(s);
                        continue;
                    }
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

    /// With `--snapshot`: history for every entry the trace can make, and
    /// where to stop.
    fn snapshot_options(
        &self,
        trace: &str,
        opts: &Options,
    ) -> Result<(Options, Option<u64>), TraceError> {
        if self.snapshot.is_none() {
            return Ok((opts.clone(), None));
        }
        // Each event records at most three entries (an allocation can add a
        // device malloc and release a segment; a free, two).
        let events = TraceReader::open(trace)?.count_rest()?;
        let opts = Options {
            history: (3 * events + 16) as usize,
            snapshot: true,
            ..opts.clone()
        };
        let stop = match self.snapshot_at {
            None => None,
            Some(SnapshotAt::Event(n)) => Some(n),
            Some(SnapshotAt::Peak) => Some(
                peak_event(
                    trace,
                    &Options {
                        history: 0,
                        snapshot: false,
                        ..opts.clone()
                    },
                )?
                .0,
            ),
        };
        Ok((opts, stop))
    }

    /// Write the report's snapshot where `--snapshot` says.
    fn write_snapshot(&self, r: &Report) -> Result<(), u8> {
        let (Some(out), Some((dict, dropped))) = (&self.snapshot, &r.snapshot) else {
            return Ok(());
        };
        if let Err(e) = write_snapshot(out, dict) {
            eprintln!("{e}");
            return Err(1);
        }
        let entries: usize = dict.device_traces.iter().map(Vec::len).sum();
        let lost: u64 = dropped.iter().map(|d| d.1).sum();
        eprintln!(
            "{out}: {} segments, {entries} trace entries{}",
            dict.segments.len(),
            if lost > 0 {
                format!(" ({lost} dropped by the ring buffer)")
            } else {
                String::new()
            }
        );
        Ok(())
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
