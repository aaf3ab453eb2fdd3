//! `cachealloc plot`: live and reserved bytes and the segment map at the
//! peak, as SVG.

use super::{options, report_error};
use cachealloc_cli::human;
use cachealloc_cli::plot::{plot, PlotError};
use cachealloc_core::TorchVersion;
use clap::Args;

/// Draw live and reserved bytes and the segment map at the peak as SVG.
#[derive(Args)]
pub struct PlotArgs {
    /// The trace.
    trace: String,
    /// The SVG file to write.
    #[arg(short, long)]
    output: String,
    /// Allocator settings.
    #[arg(long, default_value = "")]
    conf: String,
    /// Device capacity.
    #[arg(long, value_parser = human::parse_bytes)]
    capacity: Option<u64>,
    /// The torch release whose decisions to take (2.11 to 2.15: the order of
    /// cached blocks of one size, the keys of the settings and statistics);
    /// default: the trace's `torch_version`, else the newest (2.15).
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<TorchVersion>,
}

impl PlotArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let opts = match options(&self.conf, self.capacity, self.torch_version) {
            Ok(o) => o,
            Err(status) => return status,
        };
        match plot(&self.trace, &opts, &self.output) {
            Ok(msg) => {
                println!("{msg}");
                0
            }
            Err(PlotError::Replay(e)) => report_error(&e),
            Err(PlotError::Other(e)) => {
                eprintln!("{e}");
                1
            }
        }
    }
}
