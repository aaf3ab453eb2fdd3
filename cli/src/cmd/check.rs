//! `cachealloc check`: validate traces and print their statistics; with
//! `--against SNAPSHOT`, replay an imported trace and set it against the
//! PyTorch snapshot it came from.

use super::options;
use crate::progress::Progress;
use crate::render;
use cachealloc_core::TorchVersion;
use cachealloc_trace::import::read_snapshot;
use cachealloc_trace::{against, check, Options};
use clap::Args;

/// Validate traces and print their statistics.
#[derive(Args)]
pub struct CheckArgs {
    /// One JSON object per trace, per line.
    #[arg(long)]
    json: bool,
    /// Replay the trace (imported from this PyTorch snapshot) and compare:
    /// device mallocs and frees in order, peak reserved, the final segments
    /// block for block. Exit status 1 when they differ.
    #[arg(long, value_name = "SNAPSHOT")]
    against: Option<String>,
    /// With --against: allocator settings (default: the snapshot's own).
    #[arg(long)]
    conf: Option<String>,
    /// With --against: give the simulated device the recorded addresses.
    #[arg(long)]
    real_addresses: bool,
    /// The torch release whose decisions to take (2.11 to 2.15: the order of
    /// cached blocks of one size, the keys of the settings and statistics);
    /// default: the trace's `torch_version`, else the newest (2.15).
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<TorchVersion>,
    /// Trace files.
    #[arg(required = true)]
    traces: Vec<String>,
}

impl CheckArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        if let Some(snapshot) = &self.against {
            return self.run_against(snapshot);
        }
        let mut status = 0;
        for t in &self.traces {
            let mut progress = Progress::new(false, t);
            match check(t, &mut |a, b| progress.update(a, b)) {
                Ok(s) => {
                    drop(progress);
                    if self.json {
                        println!("{}", serde_json::to_string(&s).unwrap_or_default());
                    } else {
                        render::check_summary(t, &s);
                    }
                }
                Err(e) => {
                    eprintln!("{e}");
                    status = 2;
                }
            }
        }
        status
    }

    fn run_against(&self, snapshot: &str) -> u8 {
        let [trace] = self.traces.as_slice() else {
            eprintln!("--against compares one trace with its snapshot");
            return 2;
        };
        let bytes = match std::fs::read(snapshot) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{snapshot}: cannot read: {e}");
                return 2;
            }
        };
        let conf = match &self.conf {
            Some(c) => c.clone(),
            None => match read_snapshot(&bytes) {
                Ok(s) => s.allocator_settings.map(|s| s.conf).unwrap_or_default(),
                Err(e) => {
                    eprintln!("{snapshot}: {e}");
                    return 2;
                }
            },
        };
        let opts = match options(&conf, None, self.torch_version) {
            Ok(o) => Options {
                real_addresses: self.real_addresses,
                ..o
            },
            Err(status) => return status,
        };
        match against(trace, &bytes, snapshot, &opts) {
            Ok((devices, _)) => {
                render::against(trace, snapshot, &conf, &devices);
                if devices.iter().all(|d| d.matches()) {
                    0
                } else {
                    1
                }
            }
            Err(e) => {
                eprintln!("{e}");
                2
            }
        }
    }
}
