//! Snapshots and imports: `replay --snapshot` writes what PyTorch's readers
//! accept (tests/snapshot_check.py, shown failing on three corruptions); a
//! snapshot we write, imported back, replays to the same device mallocs and
//! the same final segments (whole history, and a ring buffer too small for
//! it: a warm start); the recordings of others (`../shared`, when present)
//! reproduce their truth files.

use cachealloc_core::Config;
use cachealloc_tests::{bundled_testdata, scratch, shared_part, testdata_part};
use cachealloc_trace::import::{import, import_with_limit, Imported, MemoryLimit};
use cachealloc_trace::{against, run, write_snapshot, Options, Quiet, SnapshotDict, TraceReader};
use std::path::Path;
use std::process::Command;

/// Run the Python checks on snapshot files; their output, or why they failed.
fn python_check(files: &[&Path]) -> Result<String, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("snapshot_check.py");
    let out = Command::new("python3")
        .arg(script)
        .arg("--settings")
        .args(files)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// A replay of `trace` with its whole history (or `history` entries) and
/// its snapshot at the end, on a device of `capacity` bytes.
fn snapshot_of(trace: &str, history: Option<usize>, capacity: Option<u64>) -> SnapshotDict {
    let events = TraceReader::open(trace).unwrap().count_rest().unwrap() as usize;
    let opts = Options {
        history: history.unwrap_or(3 * events + 16),
        snapshot: true,
        capacity,
        // Recorded with torch 2.11 or older: its block order.
        torch: Some(cachealloc_core::TorchVersion::V2_11),
        ..Options::default()
    };
    let (report, _) = run(trace, &opts, &mut Quiet).unwrap();
    report.snapshot.unwrap().0
}

fn bundled_traces() -> Vec<String> {
    let Some(dir) = testdata_part("traces") else {
        return Vec::new();
    };
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path().to_string_lossy().into_owned()))
        .filter(|p| p.ends_with(".jsonl.gz"))
        .collect();
    v.sort();
    v
}

#[test]
fn replay_snapshots_pass_pytorchs_structural_checks() {
    let dir = scratch("snapshots");
    for t in bundled_traces() {
        let dict = snapshot_of(&t, None, None);
        // cachealloc's accounting rides along, under a key of its own: it
        // agrees with the segments PyTorch's keys describe.
        let f = &dict.cachealloc_fragmentation[0];
        let reserved: u64 = dict.segments.iter().map(|s| s.total_size).sum();
        let allocated: u64 = dict.segments.iter().map(|s| s.allocated_size).sum();
        assert_eq!(
            (f.total.reserved_bytes, f.total.allocated_bytes),
            (reserved, allocated)
        );
        let name = Path::new(&t)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (p, j) = (
            dir.join(format!("{name}.pickle")),
            dir.join(format!("{name}.json")),
        );
        write_snapshot(p.to_str().unwrap(), &dict).unwrap();
        write_snapshot(j.to_str().unwrap(), &dict).unwrap();
        match python_check(&[&p, &j]) {
            Ok(out) => print!("{out}"),
            Err(out) => panic!("{t}: {out}"),
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The checker is trusted only once it fails: blocks that do not tile, a
/// history the final state contradicts, a JSON twin that differs.
#[test]
fn the_snapshot_checker_fails_on_corruption() {
    let dir = scratch("snapshot-corrupt");
    let trace = bundled_traces()
        .into_iter()
        .next()
        .expect("a bundled trace");
    let good = snapshot_of(&trace, None, None);
    let p = dir.join("x.pickle");
    let j = dir.join("x.json");
    let write = |d: &SnapshotDict, path: &Path| write_snapshot(path.to_str().unwrap(), d).unwrap();

    let mut bad = good.clone();
    bad.segments[0].blocks[0].size += 512;
    write(&bad, &p);
    let e = python_check(&[&p]).unwrap_err();
    assert!(e.contains("tile") || e.contains("blocks sum"), "{e}");

    let mut bad = good.clone();
    let k = bad.device_traces[0]
        .iter()
        .rposition(|e| e.action == "alloc")
        .unwrap();
    bad.device_traces[0].remove(k);
    write(&bad, &p);
    let e = python_check(&[&p]).unwrap_err();
    assert!(e.contains("walking back"), "{e}");

    write(&good, &p);
    let mut other = good.clone();
    other.segments[0].stream += 1;
    write(&other, &j);
    let e = python_check(&[&p, &j]).unwrap_err();
    assert!(e.contains("differs"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Import `snapshot` (pickle bytes), write the trace, and set its replay
/// (with the recorded addresses) against the snapshot.
fn round_trip(
    snapshot: &[u8],
    name: &str,
    dir: &Path,
    conf: &str,
) -> Vec<cachealloc_trace::DeviceAgainst> {
    let imported = import(snapshot, name, Some(conf)).unwrap_or_else(|e| panic!("{name}: {e}"));
    replay_against(&imported, snapshot, name, dir, conf)
}

/// Write `imported` (the import of `snapshot`) as a trace and set its
/// replay (with the recorded addresses) against the snapshot.
fn replay_against(
    imported: &Imported,
    snapshot: &[u8],
    name: &str,
    dir: &Path,
    conf: &str,
) -> Vec<cachealloc_trace::DeviceAgainst> {
    let trace = dir.join(format!("{name}.jsonl.gz"));
    imported.write(trace.to_str().unwrap()).unwrap();
    let opts = Options {
        config: Config::parse(conf).unwrap(),
        conf: conf.to_string(),
        real_addresses: true,
        // No release given: the import reads it off the snapshot's fields
        // (the header's `torch_version`), as it must for a recording that
        // names none.
        ..Options::default()
    };
    against(trace.to_str().unwrap(), snapshot, name, &opts)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .0
}

/// A recording that ran out of memory under a memory fraction, with
/// garbage collection (which PyTorch runs only under one): the import reads
/// the limit off the out-of-memory entries (the device had room) or takes
/// it given, and the replay is equal block for block either way. (Before
/// the limit was read, its garbage collection's segment frees were read as
/// failed mallocs: "no capacity explains every failed device malloc", and
/// 143 device mallocs too few.)
#[test]
fn a_recording_under_a_memory_fraction_imports_and_replays() {
    let dir = scratch("fraction");
    let t = format!(
        "{}/traces/resnet50-train.jsonl.gz",
        bundled_testdata().display()
    );
    let conf = "garbage_collection_threshold:0.6";
    let events = TraceReader::open(&t).unwrap().count_rest().unwrap() as usize;
    let opts = Options {
        config: Config::parse(conf).unwrap(),
        conf: conf.to_string(),
        capacity: Some(8 << 30),
        memory_fraction: Some(0.35),
        history: 3 * events + 16,
        snapshot: true,
        // Recorded with torch 2.11 or older: its block order.
        torch: Some(cachealloc_core::TorchVersion::V2_11),
        ..Options::default()
    };
    let (report, _) = run(&t, &opts, &mut Quiet).unwrap();
    assert!(report.ooms > 0, "the recording runs out of memory");
    let p = dir.join("fraction.pickle");
    write_snapshot(p.to_str().unwrap(), &report.snapshot.unwrap().0).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let given = MemoryLimit {
        fraction: 0.35,
        device_total: 8 << 30,
    };
    for (label, limit) in [("inferred", None), ("given", Some(given))] {
        let imported = import_with_limit(&bytes, label, Some(conf), limit).unwrap();
        let f = imported.devices[0].facts.limit_refusals;
        assert!(f > 0, "{label}: the limit, not the device, refused");
        let expect = limit.map_or(1.0, |l| l.fraction);
        assert_eq!(imported.memory_limit.map(|l| l.0), Some(expect), "{label}");
        for d in replay_against(&imported, &bytes, label, &dir, conf) {
            assert!(d.matches(), "{label}: {d:#?}");
        }
    }
    // The same settings without a fraction: PyTorch collects no garbage,
    // the segment frees before a device malloc are retries, and they tell
    // the capacity.
    let tight = Options {
        memory_fraction: None,
        capacity: Some(3 << 30),
        ..opts
    };
    let (report, _) = run(&t, &tight, &mut Quiet).unwrap();
    let p = dir.join("no-fraction.pickle");
    write_snapshot(p.to_str().unwrap(), &report.snapshot.unwrap().0).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let imported = import(&bytes, "no-fraction", Some(conf)).unwrap();
    assert_eq!(imported.memory_limit, None);
    assert!(imported.devices[0].facts.oom_retries > 0);
    assert_eq!(imported.devices[0].facts.gc_bursts, 0);
    for d in replay_against(&imported, &bytes, "no-fraction", &dir, conf) {
        assert!(d.matches(), "no fraction: {d:#?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Snapshots recorded with expandable segments (their segments are mapped
/// runs, their history `segment_map` / `segment_unmap`): from a cold start,
/// with the whole history, they import and replay to the same maps, unmaps,
/// peak and final runs, block for block, on an unlimited device and on a
/// 3 GiB one (unmaps, out-of-memory errors); a warm start (a ring buffer
/// that dropped the oldest entries) is refused, saying why.
/// A recording made on the simulated device: under a memory fraction of
/// 0.05 of an H200, 256 MiB tensors until one runs out of memory, all
/// freed, `empty_cache`, a 64 MiB tensor and a reduction (a 2 MiB small
/// segment), freed; twice. The `empty_cache` shows in the history only as
/// segment frees before the 64 MiB tensor's device malloc, which an
/// out-of-memory retry also makes; it must be read as an `empty_cache`,
/// because a freed 256 MiB segment would have served that request from the
/// cache (read as a retry, the replay keeps the 256 MiB segments and serves
/// the 64 MiB tensor from one of them).
#[test]
fn a_fraction_recording_with_empty_cache_replays_block_for_block() {
    use std::fmt::Write as _;
    let dir = scratch("fraction-empty-cache");
    let mut t = String::from(
        r#"{"format":"cachealloc-trace","version":1,"source":"256 MiB until out of memory under a fraction, empty_cache, 64 MiB; twice","device_capacity":139810037760,"memory_fraction":0.05}"#,
    );
    t.push('\n');
    let mut id = 0u64;
    for _round in 0..2 {
        // 26 fit under the fraction; the 27th runs out of memory.
        let first = id;
        for _ in 0..27 {
            writeln!(t, r#"{{"op":"alloc","id":{id},"size":268435456}}"#).unwrap();
            id += 1;
        }
        for k in first..first + 26 {
            writeln!(t, r#"{{"op":"free","id":{k}}}"#).unwrap();
        }
        writeln!(t, r#"{{"op":"empty_cache"}}"#).unwrap();
        writeln!(t, r#"{{"op":"alloc","id":{id},"size":67108864}}"#).unwrap();
        writeln!(t, r#"{{"op":"alloc","id":{},"size":4}}"#, id + 1).unwrap();
        writeln!(t, r#"{{"op":"free","id":{id}}}"#).unwrap();
        writeln!(t, r#"{{"op":"free","id":{}}}"#, id + 1).unwrap();
        id += 2;
    }
    let trace = dir.join("recording.jsonl");
    std::fs::write(&trace, t).unwrap();
    let snap = snapshot_of(trace.to_str().unwrap(), None, None);
    let p = dir.join("recording.pickle");
    write_snapshot(p.to_str().unwrap(), &snap).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let given = MemoryLimit {
        fraction: 0.05,
        device_total: 139810037760,
    };
    for (label, limit) in [("inferred", None), ("given", Some(given))] {
        let imported = import_with_limit(&bytes, "recording", Some(""), limit).unwrap();
        assert_eq!(imported.devices[0].facts.empty_caches, 2, "{label}");
        for d in replay_against(&imported, &bytes, &format!("recording-{label}"), &dir, "") {
            assert_eq!(d.recorded.mallocs.len(), 56, "{label}");
            assert_eq!(d.recorded.frees.len(), 54, "{label}");
            assert!(d.matches(), "{label}: {d:#?}");
        }
    }
}

#[test]
fn expandable_snapshots_import_and_replay_to_the_same_state() {
    let dir = scratch("expandable");
    let conf = "expandable_segments:True";
    for t in bundled_traces() {
        let name = Path::new(&t)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let events = TraceReader::open(&t).unwrap().count_rest().unwrap() as usize;
        for (label, history, capacity) in [
            ("whole", 3 * events + 16, None),
            ("3GiB", 3 * events + 16, Some(3u64 << 30)),
            ("ring", events, None),
        ] {
            let opts = Options {
                config: Config::parse(conf).unwrap(),
                conf: conf.to_string(),
                capacity,
                history,
                snapshot: true,
                // Recorded with torch 2.11 or older: its block order.
                torch: Some(cachealloc_core::TorchVersion::V2_11),
                ..Options::default()
            };
            let (report, _) = run(&t, &opts, &mut Quiet).unwrap();
            let p = dir.join(format!("{name}.{label}.pickle"));
            write_snapshot(p.to_str().unwrap(), &report.snapshot.unwrap().0).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            if label == "ring" {
                let e = import(&bytes, &name, Some(conf))
                    .err()
                    .expect("a warm start is refused");
                assert!(
                    e.contains("(a cold start) can be imported yet"),
                    "{name}: {e}"
                );
                continue;
            }
            for d in round_trip(&bytes, &format!("{name}.{label}"), &dir, conf) {
                println!(
                    "{name} ({label}): {} maps, {} unmaps, final state {}",
                    d.replayed.mallocs.len(),
                    d.replayed.frees.len(),
                    d.state_difference.as_deref().unwrap_or("equal")
                );
                assert!(
                    !d.recorded.mallocs.is_empty(),
                    "{name} ({label}): no maps read"
                );
                assert!(d.matches(), "{name} ({label}): {d:#?}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn our_snapshots_import_and_replay_to_the_same_state() {
    let dir = scratch("round-trip");
    for t in bundled_traces() {
        let name = Path::new(&t)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // The whole history (a cold start); a ring buffer with room for
        // about two thirds of it (the oldest entries dropped: a warm
        // start); a device 3% above the peak of live bytes (device mallocs
        // fail and are retried after the cache is released, some
        // allocations fail for good: the import reads the capacity off
        // them).
        let events = TraceReader::open(&t).unwrap().count_rest().unwrap() as usize;
        let (report, _) = run(&t, &Options::default(), &mut Quiet).unwrap();
        let tight = report.peak_live_bytes / 100 * 103;
        for (label, history, capacity) in [
            ("whole", None, None),
            ("ring", Some(events), None),
            ("tight", None, Some(tight)),
        ] {
            let dict = snapshot_of(&t, history, capacity);
            let p = dir.join(format!("{name}.{label}.pickle"));
            write_snapshot(p.to_str().unwrap(), &dict).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            for d in round_trip(&bytes, &format!("{name}.{label}"), &dir, "") {
                println!(
                    "{name} ({label}): {} device mallocs, {} frees, final state {}",
                    d.replayed.mallocs.len(),
                    d.replayed.frees.len(),
                    d.state_difference.as_deref().unwrap_or("equal")
                );
                assert!(d.matches(), "{name} ({label}): {d:#?}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The recordings of other people's GPUs: every non-expandable one replays
/// to its truth file (device mallocs in order, device frees, peaks) and,
/// with the real addresses, to its final segments block for block.
#[test]
fn real_snapshots_reproduce_what_pytorch_did() {
    let (Some(snaps), Some(truths)) = (shared_part("real-snapshots"), shared_part("real-traces"))
    else {
        println!("real snapshots: 0 checked (../shared/real-snapshots and real-traces are not beside the checkout)");
        return;
    };
    let dir = scratch("real-snapshots");
    let mut names: Vec<String> = std::fs::read_dir(&snaps)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pickle"))
        .map(|n| n.trim_end_matches(".pickle").to_string())
        .collect();
    names.sort();
    let (mut checked, mut left_out) = (0, 0);
    println!("| recording | device mallocs (truth) | device frees (truth) | peak reserved (truth) | peak allocated (truth) | final blocks |");
    for name in &names {
        let bytes = std::fs::read(snaps.join(format!("{name}.pickle"))).unwrap();
        let truth: serde_json::Value = serde_json::from_slice(
            &std::fs::read(truths.join(format!("{name}.truth.json"))).unwrap(),
        )
        .unwrap();
        let conf = truth["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
            .as_str()
            .unwrap_or("");
        if conf.contains("expandable_segments:True") {
            println!("| {name} | left out: expandable segments (the_real_expandable_recording_maps_what_pytorch_mapped checks it) |");
            left_out += 1;
            continue;
        }
        checked += 1;
        for d in round_trip(&bytes, name, &dir, conf) {
            let t = &truth["devices"][d.device.to_string()];
            let sizes: Vec<u64> = serde_json::from_value(t["segment_alloc_sizes"].clone()).unwrap();
            let frees = t["num_segment_free"].as_u64().unwrap() as usize;
            let peak_reserved = t["peak_reserved_bytes"].as_u64().unwrap();
            let peak_allocated = t["peak_allocated_bytes"].as_u64().unwrap();
            println!(
                "| {name} | {} ({}) | {} ({}) | {} ({}) | {} ({}) | {} |",
                d.replayed.mallocs.len(),
                sizes.len(),
                d.replayed.frees.len(),
                frees,
                d.replayed.peak_reserved,
                peak_reserved,
                d.replayed_peak_allocated,
                peak_allocated,
                d.state_difference.as_deref().unwrap_or("equal")
            );
            assert_eq!(d.replayed.mallocs, sizes, "{name}: device malloc sizes");
            assert_eq!(d.replayed.frees.len(), frees, "{name}: device frees");
            assert_eq!(
                d.replayed.peak_reserved, peak_reserved,
                "{name}: peak reserved"
            );
            assert_eq!(
                d.replayed_peak_allocated, peak_allocated,
                "{name}: peak allocated"
            );
            assert!(d.matches(), "{name}: {d:#?}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    println!(
        "real snapshots: {checked} of {} recordings checked, {left_out} left out",
        names.len()
    );
    assert!(checked > 0, "no recording was checked");
}

/// A snapshot cachealloc writes under each release carries that release's
/// fields, and the import reads the release (its family: 2.14 stands for
/// 2.15 too, whose own field torch writes only on tagged entries) off
/// them, into the trace's header.
#[test]
fn the_import_reads_the_release_a_snapshot_was_written_under() {
    use cachealloc_core::TorchVersion;
    let dir = scratch("releases");
    let t = format!(
        "{}/traces/bert-mlm-train.jsonl.gz",
        bundled_testdata().display()
    );
    let events = TraceReader::open(&t).unwrap().count_rest().unwrap() as usize;
    for (minor, family) in [(11, 11), (12, 12), (13, 13), (14, 14), (15, 14)] {
        let opts = Options {
            history: 3 * events + 16,
            snapshot: true,
            torch: Some(TorchVersion::new(2, minor)),
            ..Options::default()
        };
        let (report, _) = run(&t, &opts, &mut Quiet).unwrap();
        let p = dir.join(format!("2.{minor}.pickle"));
        write_snapshot(p.to_str().unwrap(), &report.snapshot.unwrap().0).unwrap();
        let imported = import(&std::fs::read(&p).unwrap(), "release", None).unwrap();
        let (v, why) = imported.torch.expect("a torch recording");
        assert_eq!(
            v,
            TorchVersion::new(2, family),
            "written under 2.{minor}: {why}"
        );
        assert_eq!(
            imported.header["torch_version"].as_str(),
            Some(v.to_string().as_str())
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
