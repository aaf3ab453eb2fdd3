//! `cachealloc check`: validate traces and print their statistics.

use crate::progress::Progress;
use crate::render;
use cachealloc_trace::check;
use clap::Args;

/// Validate traces and print their statistics.
#[derive(Args)]
pub struct CheckArgs {
    /// One JSON object per trace, per line.
    #[arg(long)]
    json: bool,
    /// Trace files.
    #[arg(required = true)]
    traces: Vec<String>,
}

impl CheckArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
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
}
