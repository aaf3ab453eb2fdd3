//! `cachealloc import`: a PyTorch memory snapshot (recorded with
//! `torch.cuda.memory._record_memory_history`) as a trace.

use cachealloc_cli::human;
use cachealloc_core::TorchVersion;
use cachealloc_trace::import::{
    import_rmm_log, import_with_limit, is_rmm_log, Imported, MemoryLimit,
};
use clap::Args;

/// Turn a PyTorch memory snapshot with its history into a trace.
#[derive(Args)]
pub struct ImportArgs {
    /// The snapshot (`torch.cuda.memory._dump_snapshot`: a pickle, or the same dict as JSON), or
    /// an RMM memory event log (the CSV of `logging_resource_adaptor`).
    snapshot: String,
    /// The trace to write (gzip when it ends in .gz).
    #[arg(short, long)]
    output: String,
    /// Allocator settings the recording ran with (default: the snapshot's own, else PyTorch's defaults).
    #[arg(long)]
    conf: Option<String>,
    /// The recording ran under torch.cuda.set_per_process_memory_fraction(F) (with --capacity):
    /// the trace replays under it. Without it, an out-of-memory that a limit refused while the
    /// device had room makes the trace replay under a fraction of 1.0 of the inferred capacity.
    #[arg(long, requires = "capacity")]
    memory_fraction: Option<f64>,
    /// The device's memory (bytes, or with a unit), for --memory-fraction.
    #[arg(long, value_parser = human::parse_bytes, requires = "memory_fraction")]
    capacity: Option<u64>,
    /// The torch release the recording was made with: written to the trace's
    /// header (`torch_version`), so that replays take its decisions. Default:
    /// the release the snapshot's fields tell (`pool_id` on trace entries:
    /// 2.12 on; none: 2.11 or older; ...), said in the summary.
    #[arg(long, value_name = "VERSION", value_parser = super::torch_version)]
    torch_version: Option<TorchVersion>,
}

impl ImportArgs {
    /// Run; the exit status.
    pub fn run(self) -> u8 {
        let bytes = match std::fs::read(&self.snapshot) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("{}: cannot read: {e}", self.snapshot);
                return 2;
            }
        };
        let name = std::path::Path::new(&self.snapshot)
            .file_name()
            .map_or(self.snapshot.clone(), |n| n.to_string_lossy().into_owned());
        let imported = if is_rmm_log(&bytes) {
            import_rmm_log(&String::from_utf8_lossy(&bytes), &name)
        } else {
            let limit = self
                .memory_fraction
                .zip(self.capacity)
                .map(|(fraction, device_total)| MemoryLimit {
                    fraction,
                    device_total,
                });
            if let Some(f) = self.memory_fraction.filter(|f| !(*f > 0.0 && *f <= 1.0)) {
                eprintln!("--memory-fraction {f}: expected a number in (0, 1]");
                return 2;
            }
            import_with_limit(&bytes, &name, self.conf.as_deref(), limit)
        };
        let imported = match imported {
            Ok(mut i) => {
                if let Some(v) = self.torch_version {
                    i.header["torch_version"] = serde_json::json!(v.to_string());
                    i.torch = Some((v, "given (--torch-version)"));
                }
                i
            }
            Err(e) => {
                eprintln!("{}: {e}", self.snapshot);
                return 2;
            }
        };
        if let Err(e) = imported.write(&self.output) {
            eprintln!("{}: {e}", self.output);
            return 1;
        }
        summary(&self.output, &imported);
        0
    }
}

/// What the import found, device by device: how much of the history is
/// usable, and what had to be rebuilt.
fn summary(path: &str, i: &Imported) {
    println!("{path}: {} events", human::count(i.events.len() as u64));
    println!(
        "  config          {}",
        if i.conf.is_empty() {
            "(default)"
        } else {
            &i.conf
        }
    );
    if let Some((v, why)) = i.torch {
        println!("  torch release   {v}: {why}");
    }
    for d in &i.devices {
        let f = &d.facts;
        println!(
            "  device {}: {} trace entries, {} device mallocs, {} segment frees",
            d.device,
            human::count(d.entries as u64),
            f.mallocs.len() - d.initial.segments.len(),
            f.segment_frees.len()
        );
        if let Some(why) = &d.cut_reason {
            println!(
                "    the first {} entries contradict the final state and are left out ({why}); the trace starts after them",
                d.first_usable
            );
        }
        if d.warm_start() {
            println!(
                "    warm start: the history begins after the allocator held {} in {} segments with {} live blocks (recording began late, or the ring buffer dropped the oldest entries); {} warm-up events rebuild that state",
                human::bytes(d.initial.reserved()),
                d.initial.segments.len(),
                d.initial.live_blocks(),
                d.warmup_events
            );
            if f.frees_of_earlier_blocks > 0 {
                println!(
                    "    {} frees of blocks allocated before the history began (sizes: {} from the request, {} from the next block)",
                    f.frees_of_earlier_blocks, d.initial.inferred_sizes, d.initial.inferred_from_neighbour
                );
            }
        } else {
            println!("    cold start: the history covers the allocator's whole life");
        }
        if f.oom_retries + f.ooms + f.empty_caches + f.deferred_frees > 0 {
            println!(
                "    {} out-of-memory retries, {} failed allocations, {} empty_cache, {} frees that waited for other streams",
                f.oom_retries, f.ooms, f.empty_caches, f.deferred_frees
            );
        }
        if f.limit_refusals > 0 {
            println!(
                "    {} failed allocations a memory limit refused while the device had room (a memory fraction)",
                f.limit_refusals
            );
        }
        if f.gc_bursts > 0 {
            println!(
                "    {} bursts of segment frees before a device malloc, garbage collection's or retries' (the settings collect garbage): not read as the capacity",
                f.gc_bursts
            );
        }
    }
    if i.private_pool_allocs > 0 {
        println!(
            "  warning: {} allocations were in private pools (their trace entries' pool_id); the trace replays them in the default pools",
            i.private_pool_allocs
        );
    }
    if let Some((fraction, total)) = i.memory_limit {
        println!(
            "  memory fraction {fraction} of a {} device: the trace replays under it",
            human::bytes(total)
        );
    }
    if let Some((least, below)) = i
        .capacity
        .filter(|_| i.memory_limit.is_none_or(|l| l.0 == 1.0))
    {
        println!(
            "  device capacity {} (a device malloc failed: the capacity is at least {} and below {})",
            least,
            human::bytes(least),
            human::bytes(below + 1)
        );
        if least > below {
            println!("  warning: no capacity explains every failed device malloc");
        }
    }
}
