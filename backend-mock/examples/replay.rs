//! Replay an allocation trace (`../shared/trace-format.md`, plain or `.gz`)
//! through the caching allocator on the simulated device and print what it
//! reserved. A stand-in for the `cachealloc replay` command to come.
//!
//! cargo run --release -p cachealloc-mock --example replay -- traces/resnet50-train.jsonl.gz

use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DevicePtr};
use cachealloc_mock::MockDevice;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::time::Instant;

fn human(b: i64) -> String {
    let b = b as f64;
    match b {
        b if b >= (1u64 << 30) as f64 => format!("{:.2} GiB", b / (1u64 << 30) as f64),
        b if b >= (1 << 20) as f64 => format!("{:.2} MiB", b / (1 << 20) as f64),
        b if b >= 1024.0 => format!("{:.2} KiB", b / 1024.0),
        b => format!("{b} B"),
    }
}

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "traces/resnet50-train.jsonl.gz".to_string());
    let conf = args.next().unwrap_or_default();
    let config = Config::parse(&conf).map_err(|e| e.to_string())?;
    let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    let reader: Box<dyn Read> = if path.ends_with(".gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };

    let mut lines = BufReader::new(reader).lines().enumerate();
    let (_, header) = lines.next().ok_or(format!("{path}: empty trace"))?;
    let header: serde_json::Value = serde_json::from_str(&header.map_err(|e| e.to_string())?)
        .map_err(|e| format!("{path}:1: {e}"))?;
    if header["format"] != "cachealloc-trace" || header["version"] != 1 {
        return Err(format!("{path}:1: not a cachealloc-trace version 1 header"));
    }
    let capacity = header["device_capacity"].as_u64();
    let mut a: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 1024> = DeviceAllocator::new(
        MockDevice::new(capacity),
        vec![BlockSlot::VACANT; 1 << 18].into_boxed_slice(),
        config,
    );
    let mut live: HashMap<u64, (DevicePtr, u64)> = HashMap::new();
    let mut failed = HashSet::new();
    let (mut events, mut allocs, mut ooms, mut live_bytes, mut peak_live) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut started = false;
    let t0 = Instant::now();
    for (n, line) in lines {
        let line = line.map_err(|e| format!("{path}:{}: {e}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let at = |e: String| format!("{path}:{}: {e}", n + 1);
        let ev: serde_json::Value = serde_json::from_str(&line).map_err(|e| at(e.to_string()))?;
        let num = |k: &str| {
            ev[k]
                .as_u64()
                .ok_or_else(|| at(format!("`{k}` must be a non-negative integer")))
        };
        events += 1;
        match ev["op"].as_str() {
            Some("alloc") => {
                let (id, size) = (num("id")?, num("size")?);
                let stream = ev["stream"].as_u64().unwrap_or(0);
                if live.contains_key(&id) {
                    return Err(at(format!("alloc of id {id}, which is live")));
                }
                failed.remove(&id);
                allocs += 1;
                started = true;
                match a.malloc(size, stream) {
                    Ok(x) => {
                        live.insert(id, (x.ptr, size));
                        live_bytes += size;
                        peak_live = peak_live.max(live_bytes);
                    }
                    Err(e) if e.is_out_of_memory() => {
                        ooms += 1;
                        failed.insert(id);
                    }
                    Err(e) => return Err(at(e.to_string())),
                }
            }
            Some("free") => {
                let id = num("id")?;
                if failed.remove(&id) {
                    continue;
                }
                let (p, size) = live
                    .remove(&id)
                    .ok_or_else(|| at(format!("free of id {id}, which is not live")))?;
                live_bytes -= size;
                a.free_ptr(p).map_err(|e| at(e.to_string()))?;
            }
            Some("record_stream") => {
                let (id, stream) = (num("id")?, num("stream")?);
                if !failed.contains(&id) {
                    let (p, _) = live.get(&id).ok_or_else(|| {
                        at(format!("record_stream of id {id}, which is not live"))
                    })?;
                    a.record_stream_ptr(*p, stream)
                        .map_err(|e| at(e.to_string()))?;
                }
            }
            Some("sync") => a.backend_mut().sync(ev["stream"].as_u64()),
            Some("empty_cache") if started => a.empty_cache().map_err(|e| at(e.to_string()))?,
            Some("empty_cache") => {}
            other => return Err(at(format!("unknown op {other:?}"))),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    a.check_invariants().map_err(|e| e.to_string())?;
    let s = a.stats();
    let peak_reserved = s.reserved_bytes.all().peak;
    println!("trace          {path}");
    println!(
        "source         {}",
        header["source"].as_str().unwrap_or("?")
    );
    println!("config         {:?}", conf);
    println!("events         {events} ({allocs} allocations, {ooms} out of memory)");
    println!("peak live      {}", human(peak_live as i64));
    println!("peak allocated {}", human(s.allocated_bytes.all().peak));
    println!("peak reserved  {}", human(peak_reserved));
    println!(
        "fragmentation  {:.3} (peak reserved / peak live)",
        peak_reserved as f64 / peak_live.max(1) as f64
    );
    println!(
        "device mallocs {}, frees {}, retries {}, OOMs {}",
        s.num_device_alloc, s.num_device_free, s.num_alloc_retries, s.num_ooms
    );
    println!(
        "time           {:.3} s ({:.1} M events/s, JSON parsing included)",
        secs,
        events as f64 / secs / 1e6
    );
    println!("memory_stats (non-zero):");
    s.for_each(|k, v| {
        if v != 0 {
            println!("  {k:<40} {v}");
        }
    });
    Ok(())
}
