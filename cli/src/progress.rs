//! The progress bar on stderr: it appears only once a trace has taken more
//! than half a second, and never when stderr is not a terminal or with
//! `--quiet`.

use cachealloc_trace::{Observer, ReplayDevice};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress bar for one trace.
pub struct Progress {
    enabled: bool,
    start: Instant,
    label: String,
    bar: Option<ProgressBar>,
    /// Stop the replay after the event with this index.
    stop: Option<u64>,
}

impl Progress {
    /// A bar labelled `label` (never drawn when `quiet`).
    pub fn new(quiet: bool, label: &str) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            start: Instant::now(),
            label: label.to_string(),
            bar: None,
            stop: None,
        }
    }

    /// Also stop the replay after event `index` (from 0), if given.
    pub fn stopping_at(mut self, index: Option<u64>) -> Progress {
        self.stop = index;
        self
    }

    /// `read` of `total` bytes of the file are done.
    pub fn update(&mut self, read: u64, total: u64) {
        if !self.enabled
            || (self.bar.is_none() && self.start.elapsed() < Duration::from_millis(500))
        {
            return;
        }
        let label = &self.label;
        let bar = self.bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total);
            if let Ok(style) =
                ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
            {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_message(label.clone());
            b
        });
        bar.set_length(total.max(read));
        bar.set_position(read);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl<D: ReplayDevice> Observer<D> for Progress {
    fn progress(&mut self, read: u64, total: u64) {
        self.update(read, total);
    }
    fn stop_after(&self, index: u64) -> bool {
        self.stop.is_some_and(|s| index >= s)
    }
}
