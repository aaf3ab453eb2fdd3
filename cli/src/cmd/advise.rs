//! `cachealloc advise`: replay a trace (or a PyTorch snapshot, imported on
//! the fly) under a grid of allocator settings, rank them, and say which
//! `PYTORCH_CUDA_ALLOC_CONF` to use and what it saves.

use cachealloc_cli::human;
use cachealloc_trace::advise::{advise, Advice, AdviseOptions, Outcome};
use cachealloc_trace::import::{import, import_rmm_log, is_rmm_log};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// Which allocator settings would have served a recording best.
#[derive(Args)]
pub struct AdviseArgs {
    /// Traces (.jsonl, .jsonl.gz), PyTorch memory snapshots (.pickle, or
    /// their JSON) or RMM memory event logs (CSV), imported on the fly.
    #[arg(required = true)]
    inputs: Vec<String>,
    /// The settings the recording ran with (default: a snapshot's own, else PyTorch's defaults).
    #[arg(long)]
    conf: Option<String>,
    /// A device (or limit) to fit: say for each setting whether the run fits.
    #[arg(long, value_parser = human::parse_bytes)]
    capacity: Option<u64>,
    /// Also find each setting's smallest device (to 2 MiB) and rank by it.
    #[arg(long)]
    min_capacity: bool,
    /// One JSON object per input (documented in docs/cli.md).
    #[arg(long)]
    json: bool,
    /// Draw the peak reserved bytes of every setting into this SVG file (one input).
    #[arg(long, value_name = "OUT.svg")]
    plot: Option<String>,
    /// Replays at once (default: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// The torch release whose decisions the replays take (2.11 to 2.15);
    /// default: the trace's `torch_version`, else the newest (2.15).
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<cachealloc_core::TorchVersion>,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
}

/// A trace to advise on: the file, and the settings it was recorded with.
struct Input {
    trace: String,
    recorded: String,
    /// The private directory of an imported recording's trace, removed
    /// (with the trace) when dropped.
    _dir: Option<PrivateDir>,
}

/// A directory of this process's own under the temporary directory: made
/// fresh (never an existing path, so nothing planted there is followed),
/// readable by its owner alone, removed with its contents when dropped.
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn new() -> std::io::Result<PrivateDir> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        loop {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = std::env::temp_dir().join(format!(
                "cachealloc-advise-{}-{}-{nanos}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            match builder.create(&path) {
                Ok(()) => return Ok(PrivateDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl AdviseArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        if self.plot.is_some() && self.inputs.len() != 1 {
            eprintln!("--plot draws one input: give one");
            return 2;
        }
        // A bad --conf is the option's fault, not the recording's.
        if let Some(conf) = &self.conf {
            if let Err(status) = super::parse_conf(conf, self.torch_version) {
                return status;
            }
        }
        let mut status = 0;
        for name in &self.inputs {
            let input = match self.input(name) {
                Ok(i) => i,
                Err((why, code)) => {
                    eprintln!("{name}: {why}");
                    status = status.max(code);
                    continue;
                }
            };
            status = status.max(self.one(name, &input));
        }
        status
    }

    /// `name` as a trace: itself, or its snapshot imported.
    fn input(&self, name: &str) -> Result<Input, (String, u8)> {
        if name.ends_with(".jsonl") || name.ends_with(".jsonl.gz") {
            return Ok(Input {
                trace: name.to_string(),
                recorded: self.conf.clone().unwrap_or_default(),
                _dir: None,
            });
        }
        let bytes = std::fs::read(name).map_err(|e| (format!("cannot read: {e}"), 2))?;
        let imported = if is_rmm_log(&bytes) {
            import_rmm_log(&String::from_utf8_lossy(&bytes), name)
                .map_err(|e| (format!("importing the RMM log: {e}"), 2))?
        } else {
            import(&bytes, name, self.conf.as_deref())
                .map_err(|e| (format!("importing the snapshot: {e}"), 2))?
        };
        // A directory of this run's own (not a predictable name in the
        // shared temporary directory), removed with everything in it when
        // `Input` is dropped, a failed write included.
        let dir = PrivateDir::new()
            .map_err(|e| (format!("a temporary directory for its trace: {e}"), 1))?;
        let trace = dir
            .0
            .join("imported.jsonl.gz")
            .to_string_lossy()
            .into_owned();
        imported
            .write(&trace)
            .map_err(|e| (format!("writing its trace: {e}"), 1))?;
        Ok(Input {
            trace,
            recorded: imported.conf.clone(),
            _dir: Some(dir),
        })
    }

    /// Advise on one input; the exit status.
    fn one(&self, name: &str, input: &Input) -> u8 {
        let opts = AdviseOptions {
            recorded: input.recorded.clone(),
            capacity: self.capacity,
            min_capacity: self.min_capacity,
            threads: self.threads,
            torch: self.torch_version,
        };
        let bar = (!self.quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(0);
            if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} settings")
            {
                b.set_style(style.progress_chars("=> "));
            }
            b.set_message(name.to_string());
            b
        });
        let advice = advise(&input.trace, &opts, &|done, total| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        });
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let mut advice = match advice {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{e}");
                return if e.is_bad_input() { 2 } else { 1 };
            }
        };
        advice.trace = name.to_string();
        if self.json {
            println!("{}", to_json(&advice));
        } else {
            print_table(&advice);
        }
        if let Some(out) = &self.plot {
            if let Err(e) = cachealloc_cli::plot::advice_chart(&advice, out) {
                eprintln!("{out}: {e}");
                return 1;
            }
            if !self.json {
                println!("{out}: the peak reserved bytes of each setting");
            }
        }
        0
    }
}

/// A setting's name in tables: its string, or "(default)".
fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "(default)"
    } else {
        conf
    }
}

/// The table, and the recommendation.
fn print_table(a: &Advice) {
    let rec = &a.ranked[a.recorded];
    println!(
        "{}: recorded with {} it peaks at {} reserved, {} device mallocs{}",
        a.trace,
        shown(&rec.candidate.conf),
        human::bytes(rec.peak_reserved_bytes),
        human::count(rec.num_device_alloc),
        match a.capacity {
            Some(c) if rec.ooms > 0 => format!(
                "; under {} it runs out of memory {} times (first: {})",
                human::bytes(c),
                rec.ooms,
                rec.first_oom_class.map_or("?", |c| c.as_str())
            ),
            _ => String::new(),
        }
    );
    let fits = a.capacity.is_some();
    let min = a.ranked.iter().any(|o| o.min_capacity.is_some());
    println!(
        "{:>4}  {:<58} {:>12} {:>9} {:>6}{}{}",
        "rank",
        "setting",
        "peak resv",
        "dev calls",
        "OOMs",
        if fits { "  fits" } else { "" },
        if min { "  min capacity" } else { "" }
    );
    for (i, o) in a.ranked.iter().enumerate() {
        println!(
            "{:>4}  {:<58} {:>12} {:>9} {:>6}{}{}",
            i + 1,
            label(o),
            human::bytes(o.peak_reserved_bytes),
            human::count(o.num_device_alloc + o.num_device_free),
            o.ooms,
            match o.fits {
                Some(true) => "   yes",
                Some(false) => "    no",
                None => "",
            },
            o.min_capacity
                .map_or(String::new(), |m| format!("  {:>12}", human::bytes(m)))
        );
    }
    println!("{}", recommendation(a));
}

/// A setting's row label: its string, and what it tries unless that is
/// plain from the string.
fn label(o: &Outcome) -> String {
    let mut s = shown(&o.candidate.conf).to_string();
    if o.candidate.what == "recorded" {
        s.push_str("  (recorded)");
    } else if !o.candidate.pytorch {
        s.push_str("  (cachealloc only)");
    } else if o.candidate.memory_fraction.is_some() {
        s.push_str("  (+ memory fraction 1.0)");
    }
    s
}

/// The closing sentence: what to set and what it saves.
pub fn recommendation(a: &Advice) -> String {
    let rec = &a.ranked[a.recorded];
    let Some(best) = a.recommended.map(|i| &a.ranked[i]) else {
        return match a.capacity {
            Some(c) => format!(
                "none: no setting tried runs within {} without running out of memory",
                human::bytes(c)
            ),
            None => format!(
                "keep the recorded settings ({}): no setting tried does better",
                shown(&rec.candidate.conf)
            ),
        };
    };
    let line = format!("PYTORCH_CUDA_ALLOC_CONF={}", best.candidate.conf);
    let fraction = if best.candidate.memory_fraction.is_some() {
        " with torch.cuda.set_per_process_memory_fraction(1.0)"
    } else {
        ""
    };
    if std::ptr::eq(best, rec) {
        return format!(
            "recommended: keep the recorded settings ({}): they fit, and peak at {} reserved",
            shown(&rec.candidate.conf),
            human::bytes(rec.peak_reserved_bytes)
        );
    }
    let saves = rec
        .peak_reserved_bytes
        .saturating_sub(best.peak_reserved_bytes);
    let (calls, rec_calls) = (
        best.num_device_alloc + best.num_device_free,
        rec.num_device_alloc + rec.num_device_free,
    );
    let less = if saves > 0 {
        format!(
            " ({} less, {:.1}%)",
            human::bytes(saves),
            100.0 * saves as f64 / rec.peak_reserved_bytes.max(1) as f64
        )
    } else if calls < rec_calls {
        format!(" with {calls} device calls instead of {rec_calls}")
    } else {
        String::new()
    };
    let mut s = format!("recommended: {line}{fraction}\n");
    match a.capacity {
        Some(c) if rec.fits == Some(false) => s.push_str(&format!(
            "the recorded settings run out of memory {} times within {} (first: {}); with {} it runs without one, peaking at {} reserved",
            rec.ooms,
            human::bytes(c),
            rec.first_oom_class.map_or("?", |k| k.as_str()),
            shown(&best.candidate.conf),
            human::bytes(best.peak_reserved_bytes)
        )),
        Some(c) => s.push_str(&format!(
            "this run peaked at {} reserved within the {} limit; with {} it would peak at {}{less}",
            human::bytes(rec.peak_reserved_bytes),
            human::bytes(c),
            shown(&best.candidate.conf),
            human::bytes(best.peak_reserved_bytes)
        )),
        None => s.push_str(&format!(
            "this run peaked at {} reserved; with {} it would peak at {}{less}",
            human::bytes(rec.peak_reserved_bytes),
            shown(&best.candidate.conf),
            human::bytes(best.peak_reserved_bytes)
        )),
    }
    if let Some(m) = best.min_capacity {
        s.push_str(&format!(" and fit a {} device", human::bytes(m)));
        if let Some(r) = rec.min_capacity.filter(|&r| r > m) {
            s.push_str(&format!(
                " ({} smaller than the recorded settings need)",
                human::bytes(r - m)
            ));
        }
    }
    s
}

/// One outcome as JSON.
fn outcome_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "conf": o.candidate.conf,
        "what": o.candidate.what,
        "pytorch": o.candidate.pytorch,
        "memory_fraction": o.candidate.memory_fraction,
        "peak_reserved_bytes": o.peak_reserved_bytes,
        "num_device_alloc": o.num_device_alloc,
        "num_device_free": o.num_device_free,
        "ooms": o.ooms,
        "first_oom_class": o.first_oom_class.map(|c| c.as_str()),
        "fits": o.fits,
        "min_capacity": o.min_capacity,
    })
}

/// The advice as the JSON object docs/cli.md documents.
pub fn to_json(a: &Advice) -> serde_json::Value {
    let rec = &a.ranked[a.recorded];
    serde_json::json!({
        "trace": a.trace,
        "capacity": a.capacity,
        "recorded": outcome_json(rec),
        "settings": a.ranked.iter().map(outcome_json).collect::<Vec<_>>(),
        "any_fits": a.any_fits,
        "recommended": a.recommended.map(|i| {
            let b = &a.ranked[i];
            serde_json::json!({
                "conf": b.candidate.conf,
                "pytorch_cuda_alloc_conf": format!("PYTORCH_CUDA_ALLOC_CONF={}", b.candidate.conf),
                "memory_fraction": b.candidate.memory_fraction,
                "peak_reserved_bytes": b.peak_reserved_bytes,
                "saves_bytes": rec.peak_reserved_bytes.saturating_sub(b.peak_reserved_bytes),
            })
        }),
        "summary": recommendation(a),
    })
}
