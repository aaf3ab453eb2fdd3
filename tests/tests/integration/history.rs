//! Memory history and snapshots. Differential: on random multi-stream
//! sequences (record_stream, syncs, empty_cache, capacities with OOMs,
//! memory fractions with garbage collection), every trace entry (action,
//! address or free bytes, size, stream) and every segment and block of the
//! final snapshot equal the reference model's, run with its history on.
//! Then the points PyTorch's own tests care about, one by one, and the
//! observers.

use cachealloc_core::{
    testing::TinyBackend, BlockSlot, Config, DeviceAllocator, Error, TraceAction, TraceActions,
    TraceEntry,
};
use cachealloc_mock::MockDevice;
use cachealloc_tests::{ops, oracle, testdata_dir, testdata_part};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The fields of a trace entry both sides must agree on.
fn entry_key(e: &Value) -> String {
    format!(
        "{} addr={} free={} size={} stream={}",
        e["action"], e["addr"], e["device_free"], e["size"], e["stream"]
    )
}

/// The fields of a segment (and its blocks) both sides must agree on.
fn segment_key(s: &Value) -> String {
    let blocks: Vec<String> = s["blocks"]
        .as_array()
        .map(|b| {
            b.iter()
                .map(|b| {
                    format!(
                        "[{} {} {} {}]",
                        b["address"], b["size"], b["requested_size"], b["state"]
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "dev={} addr={} total={} alloc={} active={} req={} stream={} type={} pool={} exp={} {}",
        s["device"],
        s["address"],
        s["total_size"],
        s["allocated_size"],
        s["active_size"],
        s["requested_size"],
        s["stream"],
        s["segment_type"],
        s["segment_pool_id"],
        s["is_expandable"],
        blocks.join("")
    )
}

/// The first difference between two lists of keys.
fn first_difference(what: &str, ours: &[String], theirs: &[String]) -> Option<String> {
    for (k, (o, t)) in ours.iter().zip(theirs).enumerate() {
        if o != t {
            return Some(format!("{what} {k}: ours {o}, model {t}"));
        }
    }
    (ours.len() != theirs.len()).then(|| {
        format!(
            "{what}: ours has {}, the model {}",
            ours.len(),
            theirs.len()
        )
    })
}

#[test]
fn history_and_snapshot_agree_with_the_reference_model() {
    if testdata_part("oracle/pytorch_sim.py").is_none() {
        return;
    }
    let seed = std::env::var("CACHEALLOC_DIFF_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_0011u64);
    let n: u64 = std::env::var("CACHEALLOC_HISTORY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let scratch = std::env::temp_dir().join(format!("cachealloc-hist-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let cases: Vec<ops::Case> = (0..n)
        .map(|k| ops::generate(seed.wrapping_add(k.wrapping_mul(0x9E37_79B9))))
        .collect();
    let mut jobs = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        let path = scratch.join(format!("case-{k}.jsonl"));
        ops::write_trace(c, &path).unwrap();
        jobs.push(oracle::Job {
            path,
            conf: c.conf.clone(),
            capacity: None,
            memory_fraction: c.memory_fraction,
        });
    }
    let theirs = oracle::run_history_batch(&testdata_dir(), &jobs, &scratch).unwrap();
    let (mut entries, mut failures) = (0usize, Vec::new());
    let mut actions = std::collections::BTreeMap::new();
    for (c, model) in cases.iter().zip(theirs) {
        let model = match model {
            Ok(m) => m,
            Err(e) if oracle::model_stopped_on_known_bug(&e) => continue,
            Err(e) => panic!("seed {}: the model failed: {e}", c.seed),
        };
        let ours = ops::replay_with(c, 64, 1 << 16).unwrap();
        let (dict, dropped) = ours.report.snapshot.as_ref().expect("a snapshot");
        assert_eq!(dropped.iter().map(|d| d.1).sum::<u64>(), 0);
        let ours = serde_json::to_value(dict).unwrap();
        let keys = |v: &Value, f: fn(&Value) -> String, k: &str| -> Vec<String> {
            v[k].as_array()
                .map(|a| {
                    a.iter()
                        .flat_map(|x| match x.as_array() {
                            Some(inner) => inner.iter().map(f).collect::<Vec<_>>(),
                            None => vec![f(x)],
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let (ot, mt) = (
            keys(&ours, entry_key, "device_traces"),
            keys(&model, entry_key, "device_traces"),
        );
        let (os, ms) = (
            keys(&ours, segment_key, "segments"),
            keys(&model, segment_key, "segments"),
        );
        for e in ours["device_traces"][0].as_array().into_iter().flatten() {
            *actions.entry(e["action"].to_string()).or_insert(0) += 1;
        }
        entries += ot.len();
        if let Some(d) = first_difference("trace entry", &ot, &mt)
            .or_else(|| first_difference("segment", &os, &ms))
        {
            failures.push(format!(
                "seed {} (conf {:?}, capacity {:?}, fraction {:?}): {d}",
                c.seed, c.conf, c.capacity, c.memory_fraction
            ));
        }
    }
    println!("history: {n} cases, {entries} trace entries, by action: {actions:?}");
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    for a in [
        "alloc",
        "free_requested",
        "free_completed",
        "segment_alloc",
        "segment_free",
        "oom",
        "snapshot",
    ] {
        assert!(
            actions.contains_key(&format!("\"{a}\"")),
            "no {a} entry in {n} cases"
        );
    }
}

type Hist = DeviceAllocator<MockDevice, Vec<BlockSlot>, 64, Vec<TraceEntry>>;

fn with_history(capacity: Option<u64>, entries: usize) -> Hist {
    let mut a = DeviceAllocator::with_history(
        MockDevice::new(capacity),
        vec![BlockSlot::VACANT; 256],
        vec![TraceEntry::EMPTY; entries],
        Config::DEFAULT,
    );
    a.record_history(true, usize::MAX, false, TraceActions::NONE);
    a
}

fn actions(a: &Hist) -> Vec<(TraceAction, u64)> {
    a.history().entries().map(|e| (e.action, e.size)).collect()
}

/// A free with a recorded stream: `free_requested` at the free,
/// `free_completed` only when a later malloc finds the event done.
#[test]
fn free_completed_waits_for_the_streams_that_used_the_block() {
    use TraceAction::*;
    let mut a = with_history(None, 64);
    let x = a.malloc(1000, 0).unwrap();
    a.record_stream(x.handle.unwrap(), 1).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    assert_eq!(
        actions(&a),
        [
            (SegmentAlloc, 2 << 20),
            (Alloc, 1000),
            (FreeRequested, 1000)
        ]
    );
    let _y = a.malloc(1000, 0).unwrap(); // stream 1 not done: still pending
    assert_eq!(a.history().len(), 4);
    a.backend_mut().sync(Some(1));
    let _z = a.malloc(1000, 0).unwrap(); // now it completes first
    let tail: Vec<_> = actions(&a).into_iter().skip(4).collect();
    assert_eq!(tail, [(FreeCompleted, 1000), (Alloc, 1000)]);
    let times: Vec<u64> = a.history().entries().map(|e| e.time_us).collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "the mock's clock ticks: {times:?}"
    );
}

/// `empty_cache`: pending frees complete (waited for), then `segment_free`.
#[test]
fn empty_cache_completes_then_frees_segments() {
    use TraceAction::*;
    let mut a = with_history(None, 64);
    let x = a.malloc(4 << 20, 0).unwrap();
    a.record_stream(x.handle.unwrap(), 2).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.empty_cache().unwrap();
    let got = actions(&a);
    assert_eq!(
        got,
        [
            (SegmentAlloc, 20 << 20),
            (Alloc, 4 << 20),
            (FreeRequested, 4 << 20),
            (FreeCompleted, 4 << 20),
            (SegmentFree, 20 << 20)
        ]
    );
}

/// Garbage collection (a memory limit and a threshold): the aged cached
/// segment goes back (`segment_free`) before the device malloc it makes
/// room for (`segment_alloc`), within the same `malloc`.
#[test]
fn garbage_collection_frees_segments_before_the_malloc() {
    use TraceAction::*;
    let mut a = with_history(None, 64);
    a.set_config(Config::parse("garbage_collection_threshold:0.5").unwrap());
    a.set_memory_limit(100 << 20);
    let x = a.malloc(30 << 20, 0).unwrap();
    let _y = a.malloc(30 << 20, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    let before = a.history().len();
    let _z = a.malloc(40 << 20, 0).unwrap();
    let tail: Vec<_> = actions(&a).into_iter().skip(before).collect();
    assert_eq!(
        tail,
        [
            (SegmentFree, 30 << 20),
            (SegmentAlloc, 40 << 20),
            (Alloc, 40 << 20)
        ]
    );
    assert_eq!(a.stats().num_device_free, 1);
}

/// OOM: the whole ladder's entries (here the cached segment is released
/// first), then `oom` with the device's free bytes and the rounded size;
/// the observers get PyTorch's arguments (the segment size it could not
/// have, the total, the free bytes).
#[test]
fn oom_entry_and_observer() {
    use TraceAction::*;
    static SEEN: Mutex<Vec<(u32, u64, u64, u64)>> = Mutex::new(Vec::new());
    fn observe(device: u32, alloc_size: u64, total: u64, free: u64) {
        SEEN.lock().unwrap().push((device, alloc_size, total, free));
    }
    let mut a = with_history(Some(30 << 20), 64);
    assert!(a.attach_out_of_memory_observer(&observe).is_ok());
    let x = a.malloc(3 << 20, 0).unwrap(); // a 20 MiB segment
    a.free(x.handle.unwrap()).unwrap();
    let err = a.malloc((31 << 20) - 100, 0).unwrap_err(); // a 32 MiB segment: never fits
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    let got: Vec<_> = a
        .history()
        .entries()
        .map(|e| (e.action, e.addr, e.size))
        .skip(3)
        .collect();
    let base = cachealloc_mock::DEVICE_BASE;
    assert_eq!(
        got,
        [
            (FreeCompleted, base, 3 << 20),
            (SegmentFree, base, 20 << 20),
            (Oom, 30 << 20, 31 << 20) // free bytes, the rounded request
        ]
    );
    assert_eq!(*SEEN.lock().unwrap(), [(0, 32 << 20, 30 << 20, 30 << 20)]);
    a.set_memory_limit(28 << 20);
    assert!(a.malloc(29 << 20, 0).is_err());
    assert_eq!(
        SEEN.lock().unwrap()[1].2,
        28 << 20,
        "the limit, when set, not the total"
    );
}

/// Trackers see every entry, with history off too, and skipped actions;
/// the skip list and the annotations.
#[test]
fn trackers_skip_and_annotations() {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    fn count(_: &TraceEntry) {
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
    let mut a = with_history(None, 64);
    a.record_history(
        true,
        usize::MAX,
        true,
        TraceActions::NONE.with(TraceAction::Alloc),
    );
    assert!(a.attach_trace_tracker(&count).is_ok());
    a.set_trace_context(7);
    let x = a.malloc(512, 0).unwrap();
    a.record_annotation(99);
    a.free(x.handle.unwrap()).unwrap();
    let kept: Vec<_> = a
        .history()
        .entries()
        .map(|e| (e.action, e.context))
        .collect();
    assert_eq!(
        kept,
        [
            (TraceAction::SegmentAlloc, 7),
            (TraceAction::UserDefined, 99),
            (TraceAction::FreeRequested, 7),
            (TraceAction::FreeCompleted, 7)
        ],
        "alloc skipped"
    );
    assert_eq!(
        COUNT.load(Ordering::Relaxed),
        5,
        "the tracker saw the alloc too"
    );
    a.record_history(false, usize::MAX, false, TraceActions::NONE);
    assert!(a.history().is_empty(), "off clears, as in PyTorch");
    let _y = a.malloc(512, 0).unwrap();
    assert_eq!(
        COUNT.load(Ordering::Relaxed),
        6,
        "trackers work with history off"
    );
}

/// A small ring keeps the newest entries and counts the dropped ones; the
/// snapshot says so.
#[test]
fn a_small_ring_drops_the_oldest() {
    let mut a = with_history(None, 4);
    for _ in 0..3 {
        let x = a.malloc(512, 0).unwrap();
        a.free(x.handle.unwrap()).unwrap();
    }
    // segment_alloc + 3 x (alloc, free_requested, free_completed) = 10.
    assert_eq!((a.history().len(), a.history().dropped()), (4, 6));
    let snap = a.snapshot();
    assert_eq!(snap.dropped, 7, "the snapshot entry dropped one more");
    let last: Vec<_> = snap.history.map(|e| e.action).collect();
    assert_eq!(last.last(), Some(&TraceAction::Snapshot));
}

/// With no history storage, nothing is recorded and nothing changes.
#[test]
fn no_history_storage_records_nothing() {
    let mut a = DeviceAllocator::new(
        TinyBackend::default(),
        [BlockSlot::VACANT; 8],
        Config::DEFAULT,
    );
    a.record_history(true, usize::MAX, false, TraceActions::NONE);
    let x = a.malloc(512, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    assert!(a.history().is_empty());
    assert_eq!(a.history().dropped(), 4);
}

/// No frames, no annotation names.
struct NoNames;
impl cachealloc_trace::SnapshotNames for NoNames {
    fn frames(&self, _: &str, _: u64) -> Vec<cachealloc_trace::Frame> {
        Vec::new()
    }
    fn annotation(&self, id: u64) -> String {
        id.to_string()
    }
}

/// Trace entries name their pool (PyTorch's `TraceEntry::mempool_`): a
/// private pool's allocation, segment and free, the default pools'
/// (0, 0), an out-of-memory in the pool its request went to; a snapshot
/// shows it as `pool_id` from torch 2.12 on, and not under 2.11.
#[test]
fn trace_entries_carry_their_pool() {
    use cachealloc_core::{MempoolId, StreamFilter, TorchVersion};
    use TraceAction::*;
    let pool = MempoolId(0, 7);
    for torch in [TorchVersion::V2_15, TorchVersion::V2_11] {
        let mut a = DeviceAllocator::with_history(
            MockDevice::new(Some(64 << 20)),
            vec![BlockSlot::VACANT; 256],
            vec![TraceEntry::EMPTY; 64],
            Config::DEFAULT.with_torch_version(torch),
        );
        a.record_history(true, usize::MAX, false, TraceActions::NONE);
        let d = a.malloc(4096, 0).unwrap();
        a.begin_allocate_to_pool(pool, StreamFilter::stream(1))
            .unwrap();
        let p = a.malloc(4096, 1).unwrap();
        assert!(a.malloc(1 << 30, 1).is_err());
        a.free(p.handle.unwrap()).unwrap();
        a.end_allocate_to_pool(pool).unwrap();
        a.free(d.handle.unwrap()).unwrap();
        let pools: Vec<(TraceAction, MempoolId)> =
            a.history().entries().map(|e| (e.action, e.pool)).collect();
        let def = MempoolId::DEFAULT;
        assert_eq!(
            pools,
            [
                (SegmentAlloc, def),
                (Alloc, def),
                (SegmentAlloc, pool),
                (Alloc, pool),
                (Oom, pool),
                (FreeRequested, pool),
                (FreeCompleted, pool),
                (FreeRequested, def),
                (FreeCompleted, def),
            ]
        );
        let mut dict =
            cachealloc_trace::SnapshotDict::new(cachealloc_core::AllocatorSettings::DEFAULT, "");
        cachealloc_trace::add_device(&mut dict, a.snapshot(), &NoNames);
        let json = serde_json::to_value(&dict).unwrap();
        let ids: Vec<Value> = json["device_traces"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pool_id"].clone())
            .collect();
        // memory_viz's key for the pool of a trace entry: private pools
        // only (the default pools' entries keep torch's keys), any release.
        let viz: Vec<Value> = json["device_traces"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["segment_pool_id"].clone())
            .collect();
        assert_eq!(viz[3], serde_json::json!([0, 7]), "{viz:?}");
        assert!(viz[1].is_null() && viz[0].is_null(), "{viz:?}");
        // The import reads it back: the private pool's allocation is named.
        let bytes = serde_json::to_vec(&json).unwrap();
        let imported = cachealloc_trace::import::import(&bytes, "pools", None).unwrap();
        if torch >= TorchVersion::V2_12 {
            assert_eq!(ids[3], serde_json::json!([0, 7]), "{ids:?}");
            assert_eq!(ids[1], serde_json::json!([0, 0]), "{ids:?}");
            assert_eq!(imported.private_pool_allocs, 1);
        } else {
            assert!(
                ids.iter().all(Value::is_null),
                "torch 2.11 has no pool_id: {ids:?}"
            );
            assert_eq!(imported.private_pool_allocs, 0);
        }
    }
}

/// `malloc_with_address` leaves PyTorch's four entries: the prefix's
/// `alloc`, the request's `alloc` (its unrounded size), the prefix's
/// `free_requested` and `free_completed`; with expandable segments an
/// unmapped page is no free block (the call fails and records nothing).
#[test]
fn an_allocation_at_an_address_records_the_prefix_pair() {
    use cachealloc_core::DevicePtr;
    use TraceAction::*;
    let mut a = DeviceAllocator::with_history(
        MockDevice::new(Some(256 << 20)),
        vec![BlockSlot::VACANT; 256],
        vec![TraceEntry::EMPTY; 64],
        Config::DEFAULT,
    );
    let x = a.malloc(4 << 20, 0).unwrap();
    a.free(x.handle.unwrap()).unwrap();
    a.record_history(true, usize::MAX, false, TraceActions::NONE);
    let at = DevicePtr(x.ptr.0 + (6 << 20));
    let y = a.malloc_with_address(3 << 20, at, 0).unwrap();
    assert_eq!(y.ptr, at);
    let got: Vec<(TraceAction, u64, u64)> = a
        .history()
        .entries()
        .map(|e| (e.action, e.addr, e.size))
        .collect();
    let (base, six) = (x.ptr.0, 6 << 20);
    assert_eq!(
        got,
        [
            (Alloc, base, six),
            (Alloc, at.0, 3 << 20),
            (FreeRequested, base, six),
            (FreeCompleted, base, six),
        ]
    );
    a.check_invariants().unwrap();

    // Expandable segments: mapped free pages serve, unmapped ones do not.
    let mut e = DeviceAllocator::new(
        MockDevice::new(Some(256 << 20)),
        vec![BlockSlot::VACANT; 256],
        Config::parse("expandable_segments:True").unwrap(),
    );
    let x = e.malloc(4 << 20, 0).unwrap(); // maps one 20 MiB page
    e.free(x.handle.unwrap()).unwrap();
    let mapped = e.stats().reserved_bytes.all().current;
    let err = e
        .malloc_with_address(2 << 20, DevicePtr(x.ptr.0 + (20 << 20)), 0)
        .unwrap_err();
    assert!(err.to_string().contains("Could not allocate"), "{err}");
    let y = e
        .malloc_with_address(2 << 20, DevicePtr(x.ptr.0 + (18 << 20)), 0)
        .unwrap();
    assert_eq!(y.ptr.0, x.ptr.0 + (18 << 20));
    assert_eq!(e.stats().reserved_bytes.all().current, mapped);
    assert_eq!(e.stats().num_device_alloc, 1);
    e.check_invariants().unwrap();
}
