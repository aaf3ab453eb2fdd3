//! `cachealloc`: replay, compare, plot and check allocation traces.

use cachealloc_cli::check::check;
use cachealloc_cli::human;
use cachealloc_cli::plot::{plot, PlotError};
use cachealloc_cli::replay::{self, Observer, Options, ReplayDevice, ReplayError, Report};
use cachealloc_core::Config;
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "cachealloc",
    version,
    about = "Replay GPU allocation traces through a PyTorch-exact caching allocator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// The simulated device (deterministic, any machine).
    Mock,
    /// An NVIDIA GPU through the CUDA driver (built with `--features cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
    /// An AMD GPU through HIP (built with `--features hip`).
    #[cfg(feature = "hip")]
    Hip,
}

#[derive(Subcommand)]
enum Command {
    /// Replay traces and report memory use, fragmentation and speed.
    Replay {
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
    },
    /// Replay traces under several configurations, side by side.
    Compare {
        /// A configuration (repeat: one column group per --conf; "" is the default).
        #[arg(long = "conf", required = true)]
        confs: Vec<String>,
        /// Device capacity (bytes, or with a unit).
        #[arg(long, value_parser = human::parse_bytes)]
        capacity: Option<u64>,
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
    },
    /// Draw live and reserved bytes and the segment map at the peak as SVG.
    Plot {
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
    },
    /// Validate traces and print their statistics.
    Check {
        /// One JSON object per trace, per line.
        #[arg(long)]
        json: bool,
        /// Trace files.
        #[arg(required = true)]
        traces: Vec<String>,
    },
}

/// A progress bar on stderr that appears only once a trace has taken more
/// than half a second, and never when stderr is not a terminal or with --quiet.
struct Progress {
    enabled: bool,
    start: Instant,
    label: String,
    bar: Option<ProgressBar>,
}

impl Progress {
    fn new(quiet: bool, label: &str) -> Progress {
        Progress {
            enabled: !quiet && std::io::stderr().is_terminal(),
            start: Instant::now(),
            label: label.to_string(),
            bar: None,
        }
    }
    fn update(&mut self, read: u64, total: u64) {
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

impl<B: ReplayDevice> Observer<B> for Progress {
    fn progress(&mut self, read: u64, total: u64) {
        self.update(read, total);
    }
}

fn config(conf: &str) -> Result<Config, String> {
    Config::parse(conf).map_err(|e| format!("--conf {conf:?}: {e}"))
}

/// Exit status of an error: 2 for bad input, 1 for the rest.
fn report_error(e: &ReplayError) -> u8 {
    eprintln!("{e}");
    match e {
        ReplayError::Input(_) => 2,
        ReplayError::Allocator(_) => 1,
    }
}

fn print_summary(r: &Report) {
    let s = r.stats();
    println!("{}", r.trace);
    if !r.source.is_empty() {
        println!("  source          {}", r.source);
    }
    println!(
        "  config          {}",
        if r.conf.is_empty() {
            "(default)"
        } else {
            &r.conf
        }
    );
    println!(
        "  capacity        {}",
        r.capacity.map_or("unlimited".to_string(), human::bytes)
    );
    println!(
        "  events          {} ({} allocations)",
        human::count(r.events),
        human::count(r.allocs)
    );
    println!("  peak live       {}", human::bytes(r.peak_live_bytes));
    println!(
        "  peak allocated  {}",
        human::bytes(s.allocated_bytes.all().peak as u64)
    );
    println!("  peak reserved   {}", human::bytes(r.peak_reserved_bytes));
    println!(
        "  fragmentation   {:.3}  (peak reserved / peak live)",
        r.fragmentation()
    );
    println!(
        "  device mallocs  {}   frees {}",
        human::count(s.num_device_alloc as u64),
        human::count(s.num_device_free as u64)
    );
    println!(
        "  retries         {}   OOMs {}",
        s.num_alloc_retries, r.ooms
    );
    println!(
        "  speed           {:.2} M events/s replayed ({:.1} ms); end to end {:.2} M events/s ({:.1} ms, of which reading and parsing {:.1} ms)",
        r.events_per_second() / 1e6,
        r.replay_seconds * 1e3,
        r.end_to_end_events_per_second() / 1e6,
        r.total_seconds * 1e3,
        r.parse_seconds * 1e3
    );
}

#[allow(clippy::too_many_arguments)]
fn cmd_replay(
    backend: Backend,
    json: bool,
    conf: String,
    capacity: Option<u64>,
    memory_fraction: Option<f64>,
    slots: usize,
    quiet: bool,
    traces: Vec<String>,
) -> u8 {
    let config = match config(&conf) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let opts = Options {
        config,
        conf,
        capacity,
        memory_fraction,
        slots,
    };
    let mut status = 0;
    for t in &traces {
        let mut progress = Progress::new(quiet, t);
        let result = match backend {
            Backend::Mock => replay::run(t, &opts, &mut progress).map(|(r, _)| r),
            #[cfg(feature = "cuda")]
            Backend::Cuda => {
                replay::run_on::<cachealloc_cuda::CudaBackend, _>(t, &opts, &mut progress)
                    .map(|(r, _)| r)
            }
            #[cfg(feature = "hip")]
            Backend::Hip => {
                replay::run_on::<cachealloc_hip::HipBackend, _>(t, &opts, &mut progress)
                    .map(|(r, _)| r)
            }
        };
        match result {
            Ok(r) => {
                drop(progress);
                if json {
                    println!("{}", r.to_json());
                } else {
                    print_summary(&r);
                }
            }
            Err(e) => status = status.max(report_error(&e)),
        }
    }
    status
}

fn cmd_compare(
    confs: Vec<String>,
    capacity: Option<u64>,
    find_min: bool,
    json: bool,
    quiet: bool,
    traces: Vec<String>,
) -> u8 {
    let mut configs = Vec::new();
    for c in &confs {
        match config(c) {
            Ok(cfg) => configs.push((c.clone(), cfg)),
            Err(e) => {
                eprintln!("{e}");
                return 2;
            }
        }
    }
    let mut status = 0;
    let mut rows = Vec::new();
    for t in &traces {
        for (conf, cfg) in &configs {
            let opts = Options {
                config: *cfg,
                conf: conf.clone(),
                capacity,
                ..Options::default()
            };
            let mut progress = Progress::new(quiet, &format!("{t} [{conf}]"));
            let r = match replay::run(t, &opts, &mut progress) {
                Ok((r, _)) => r,
                Err(e) => {
                    status = status.max(report_error(&e));
                    break;
                }
            };
            let min = if find_min {
                let unlimited = if capacity.is_none() {
                    None
                } else {
                    match replay::run(
                        t,
                        &Options {
                            capacity: Some(u64::MAX),
                            ..opts.clone()
                        },
                        &mut replay::Quiet,
                    ) {
                        Ok((u, _)) => Some(u),
                        Err(e) => {
                            status = status.max(report_error(&e));
                            break;
                        }
                    }
                };
                match replay::min_capacity(
                    t,
                    &Options {
                        capacity: None,
                        ..opts.clone()
                    },
                    unlimited.as_ref().unwrap_or(&r),
                ) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        status = status.max(report_error(&e));
                        break;
                    }
                }
            } else {
                None
            };
            drop(progress);
            if json {
                let mut v = r.to_json();
                v["min_capacity"] = min.into();
                println!("{v}");
            }
            rows.push((t.clone(), conf.clone(), r, min));
        }
    }
    if !json && !rows.is_empty() {
        let cap = capacity.map_or("unlimited".to_string(), human::bytes);
        println!(
            "{:<32} {:<44} {:>8} {:>12} {:>12} {:>8} {:>6}{}",
            "trace",
            "config",
            "frag",
            "peak live",
            "peak resv",
            "mallocs",
            "OOMs",
            if find_min { "  min capacity" } else { "" }
        );
        for (t, conf, r, min) in &rows {
            let name = std::path::Path::new(t)
                .file_name()
                .map_or(t.clone(), |f| f.to_string_lossy().into_owned());
            println!(
                "{:<32} {:<44} {:>8.3} {:>12} {:>12} {:>8} {:>6}{}",
                name,
                if conf.is_empty() { "(default)" } else { conf },
                r.fragmentation(),
                human::bytes(r.peak_live_bytes),
                human::bytes(r.peak_reserved_bytes),
                r.stats().num_device_alloc,
                r.ooms,
                min.map_or(String::new(), |m| format!("  {:>12}", human::bytes(m)))
            );
        }
        println!("(capacity: {cap}; frag = peak reserved / peak live)");
    }
    status
}

fn cmd_check(json: bool, traces: Vec<String>) -> u8 {
    let mut status = 0;
    for t in &traces {
        let mut progress = Progress::new(false, t);
        match check(t, &mut |a, b| progress.update(a, b)) {
            Ok(s) => {
                drop(progress);
                if json {
                    println!("{}", serde_json::to_string(&s).unwrap_or_default());
                } else {
                    println!("{t}: ok");
                    println!("  source        {}", s.source);
                    println!(
                        "  events        {} (alloc {}, free {}, record_stream {}, sync {}, empty_cache {})",
                        human::count(s.events),
                        human::count(s.allocs),
                        human::count(s.frees),
                        s.record_stream,
                        s.sync,
                        s.empty_cache
                    );
                    println!("  peak live     {}", human::bytes(s.peak_live_bytes));
                    println!(
                        "  total alloc'd {}",
                        human::bytes(s.total_bytes_allocated.min(u64::MAX as u128) as u64)
                    );
                    println!(
                        "  sizes         largest {}, smallest {}, zero-byte {}, <= 1 MiB {}, > 1 MiB {}",
                        human::bytes(s.largest_alloc),
                        human::bytes(s.smallest_alloc.unwrap_or(0)),
                        s.zero_byte_allocs,
                        human::count(s.small_allocs),
                        human::count(s.large_allocs)
                    );
                    println!(
                        "  live at end   {} ({})",
                        s.live_at_end,
                        human::bytes(s.live_bytes_at_end)
                    );
                    println!("  streams {:?}, devices {:?}", s.streams, s.devices);
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let status = match cli.command {
        Command::Replay {
            json,
            conf,
            capacity,
            memory_fraction,
            backend,
            slots,
            quiet,
            traces,
        } => cmd_replay(
            backend,
            json,
            conf,
            capacity,
            memory_fraction,
            slots,
            quiet,
            traces,
        ),
        Command::Compare {
            confs,
            capacity,
            min_capacity,
            json,
            quiet,
            traces,
        } => cmd_compare(confs, capacity, min_capacity, json, quiet, traces),
        Command::Plot {
            trace,
            output,
            conf,
            capacity,
        } => match config(&conf) {
            Err(e) => {
                eprintln!("{e}");
                2
            }
            Ok(config) => match plot(
                &trace,
                &Options {
                    config,
                    conf,
                    capacity,
                    ..Options::default()
                },
                &output,
            ) {
                Ok(msg) => {
                    println!("{msg}");
                    0
                }
                Err(PlotError::Replay(e)) => report_error(&e),
                Err(PlotError::Other(e)) => {
                    eprintln!("{e}");
                    1
                }
            },
        },
        Command::Check { json, traces } => cmd_check(json, traces),
    };
    ExitCode::from(status)
}
