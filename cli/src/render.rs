//! What the subcommands print for people (the `--json` output is the trace
//! crate's `Report::to_json` and `TraceStats`' serialization).

use cachealloc_cli::human;
use cachealloc_trace::{Report, TraceStats};

/// `replay`: one trace's summary.
pub fn replay_summary(r: &Report) {
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
        "  torch           {} (its decisions: --torch-version chooses)",
        r.torch_version
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
    let expandable = cachealloc_core::Config::parse(&r.conf).is_ok_and(|c| c.expandable_segments);
    println!(
        "  {}  {}   {} {}",
        if expandable {
            "maps and mallocs"
        } else {
            "device mallocs"
        },
        human::count(s.num_device_alloc as u64),
        if expandable {
            "unmaps and frees"
        } else {
            "frees"
        },
        human::count(s.num_device_free as u64)
    );
    println!(
        "  retries         {}   OOMs {}",
        s.num_alloc_retries, r.ooms
    );
    if let Some(o) = &r.first_oom {
        println!(
            "  first OOM       line {}: {} on stream {} of device {}: {}",
            o.line,
            human::bytes(o.size),
            o.stream,
            o.device,
            o.cause
        );
    }
    let used: u64 = r.slots.iter().map(|s| u64::from(s.1)).sum();
    let had: u64 = r.slots.iter().map(|s| u64::from(s.2)).sum();
    println!(
        "  block slots     {} used of {} ({} of host metadata at 88 bytes each)",
        human::count(used),
        human::count(had),
        human::bytes(used * 88)
    );
    for (d, p) in &r.pools {
        println!(
            "  private pool    [{}, {}] on device {d}: {} segments, {} reserved (peak {}), use count {}",
            p.id.0,
            p.id.1,
            p.segments,
            human::bytes(p.reserved_bytes),
            human::bytes(p.peak_reserved_bytes),
            p.use_count
        );
    }
    println!(
        "  speed           {:.2} M events/s replayed ({:.1} ms); end to end {:.2} M events/s ({:.1} ms; reading and parsing took {:.1} ms of CPU, on other threads for a large file)",
        r.events_per_second() / 1e6,
        r.replay_seconds * 1e3,
        r.end_to_end_events_per_second() / 1e6,
        r.total_seconds * 1e3,
        r.parse_seconds * 1e3
    );
}

/// One row of `compare`'s table.
pub struct CompareRow {
    /// The trace file.
    pub trace: String,
    /// The config string.
    pub conf: String,
    /// Its replay.
    pub report: Report,
    /// The smallest capacity without an OOM, when asked for.
    pub min_capacity: Option<u64>,
}

/// `compare`: the table.
pub fn compare_table(rows: &[CompareRow], capacity: Option<u64>, find_min: bool) {
    let cap = capacity.map_or("unlimited".to_string(), human::bytes);
    println!(
        "{:<32} {:<44} {:>8} {:>12} {:>12} {:>9} {:>6}{}",
        "trace",
        "config",
        "frag",
        "peak live",
        "peak resv",
        "dev calls",
        "OOMs",
        if find_min {
            "  min capacity  min/live"
        } else {
            ""
        }
    );
    for row in rows {
        let r = &row.report;
        let name = std::path::Path::new(&row.trace)
            .file_name()
            .map_or(row.trace.clone(), |f| f.to_string_lossy().into_owned());
        let calls: i64 = r
            .devices
            .iter()
            .map(|(_, s)| s.num_device_alloc + s.num_device_free)
            .sum();
        // The largest device's peak of live bytes: the device that must fit.
        let live = r.device_peak_live.iter().copied().max().unwrap_or(0);
        println!(
            "{:<32} {:<44} {:>8.3} {:>12} {:>12} {:>9} {:>6}{}",
            name,
            if row.conf.is_empty() {
                "(default)"
            } else {
                &row.conf
            },
            r.fragmentation(),
            human::bytes(r.peak_live_bytes),
            human::bytes(r.peak_reserved_bytes),
            calls,
            r.ooms,
            row.min_capacity.map_or(String::new(), |m| format!(
                "  {:>12}  {:>8}",
                human::bytes(m),
                if live > 0 {
                    format!("{:.4}", m as f64 / live as f64)
                } else {
                    "-".to_string()
                }
            ))
        );
    }
    println!(
        "(capacity: {cap}; frag = peak reserved / peak live; dev calls = device mallocs, \
         maps, unmaps and frees{})",
        if find_min {
            "; min/live = min capacity / the largest device's peak live"
        } else {
            ""
        }
    );
}

/// `check`: one valid trace's statistics.
pub fn check_summary(t: &str, s: &TraceStats) {
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
    if s.pool_ops > 0 {
        println!(
            "  private pools {} ({} pool ops)",
            s.pools,
            human::count(s.pool_ops)
        );
    }
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

/// `check --against`: recorded and replayed, device by device.
pub fn against(
    trace: &str,
    snapshot: &str,
    conf: &str,
    devices: &[cachealloc_trace::DeviceAgainst],
) {
    println!("{trace} against {snapshot}");
    println!(
        "  config          {}",
        if conf.is_empty() { "(default)" } else { conf }
    );
    let same = |ok: bool| if ok { "same" } else { "DIFFERENT" };
    for d in devices {
        let (a, b) = (&d.recorded, &d.replayed);
        println!(
            "  device {}                  recorded        replayed",
            d.device
        );
        println!(
            "    device mallocs      {:>12}    {:>12}    {}",
            a.mallocs.len(),
            b.mallocs.len(),
            same(a.mallocs == b.mallocs).replace("same", "same sizes, same order")
        );
        println!(
            "    device frees        {:>12}    {:>12}    {}",
            a.frees.len(),
            b.frees.len(),
            same(a.frees == b.frees).replace("same", "same sizes, same order")
        );
        println!(
            "    peak reserved       {:>12}    {:>12}    {}",
            human::bytes(a.peak_reserved),
            human::bytes(b.peak_reserved),
            same(a.peak_reserved == b.peak_reserved)
        );
        println!(
            "    segments at the end {:>12}    {:>12}    {}",
            a.segments,
            b.segments,
            same(a.segments == b.segments)
        );
        println!(
            "    peak allocated                      {:>12}",
            human::bytes(d.replayed_peak_allocated)
        );
        match &d.state_difference {
            None => println!("    final segments and blocks: equal, block for block"),
            Some(why) => println!("    final segments and blocks: {why}"),
        }
        if let Some(u) = d.real_addresses {
            println!(
                "    recorded addresses: {} mallocs placed, {} elsewhere, {} unused",
                u.placed, u.missed, u.unused
            );
        }
    }
}
