//! `cachealloc compare`: replay traces under several configurations, side
//! by side, and optionally find the smallest device each fits.

use super::{options, report_error};
use crate::progress::Progress;
use crate::render::{self, CompareRow};
use cachealloc_cli::human;
use cachealloc_core::TorchVersion;
use cachealloc_trace::{min_capacity, run, Options, Quiet, Report, TraceError};
use clap::Args;

/// Replay traces under several configurations, side by side.
#[derive(Args)]
pub struct CompareArgs {
    /// A configuration (repeat: one column group per --conf; "" is the default).
    #[arg(long = "conf", required = true)]
    confs: Vec<String>,
    /// Device capacity (bytes, or with a unit).
    #[arg(long, value_parser = human::parse_bytes)]
    capacity: Option<u64>,
    /// The torch release whose decisions to take (2.11 to 2.15: the order of
    /// cached blocks of one size, the keys of the settings and statistics);
    /// default: the trace's `torch_version`, else the newest (2.15).
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<TorchVersion>,
    /// Also find the smallest capacity (to 2 MiB) that replays without an OOM, by bisection.
    #[arg(long)]
    min_capacity: bool,
    /// One JSON object per trace and configuration, per line.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Trace files.
    #[arg(required = true)]
    traces: Vec<String>,
}

impl CompareArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let mut configs = Vec::new();
        for c in &self.confs {
            match options(c, self.capacity, self.torch_version) {
                Ok(o) => configs.push(o),
                Err(status) => return status,
            }
        }
        let mut status = 0;
        let mut rows = Vec::new();
        for t in &self.traces {
            for opts in &configs {
                let mut progress = Progress::new(self.quiet, &format!("{t} [{}]", opts.conf));
                let row = self.row(t, opts, &mut progress);
                drop(progress);
                match row {
                    Ok(row) => {
                        if self.json {
                            let mut v = row.report.to_json();
                            v["min_capacity"] = row.min_capacity.into();
                            println!("{v}");
                        }
                        rows.push(row);
                    }
                    Err(e) => {
                        status = status.max(report_error(&e));
                        break;
                    }
                }
            }
        }
        if !self.json && !rows.is_empty() {
            render::compare_table(&rows, self.capacity, self.min_capacity);
        }
        status
    }

    /// One trace under one configuration.
    fn row(
        &self,
        t: &str,
        opts: &Options,
        progress: &mut Progress,
    ) -> Result<CompareRow, TraceError> {
        let (report, _) = run(t, opts, progress)?;
        let min = if self.min_capacity {
            Some(self.find_min(t, opts, &report)?)
        } else {
            None
        };
        Ok(CompareRow {
            trace: t.to_string(),
            conf: opts.conf.clone(),
            report,
            min_capacity: min,
        })
    }

    /// The smallest capacity, bisecting up to the unlimited run's peak.
    fn find_min(&self, t: &str, opts: &Options, report: &Report) -> Result<u64, TraceError> {
        let unlimited_opts = Options {
            capacity: None,
            ..opts.clone()
        };
        if self.capacity.is_none() {
            return min_capacity(t, &unlimited_opts, report);
        }
        let unlimited = Options {
            capacity: Some(u64::MAX),
            ..opts.clone()
        };
        let (u, _) = run(t, &unlimited, &mut Quiet)?;
        min_capacity(t, &unlimited_opts, &u)
    }
}
