//! [`advise`]: which allocator settings a trace would have run best with.
//! The trace is replayed under a grid of settings (the recorded one,
//! expandable segments, each `roundup_power2_divisions`, `max_split_size_mb`
//! values taken from the trace's own request sizes, garbage collection
//! under a limit, the compact policy, and combinations of the settings that
//! helped), each replay on its own thread, and the results are ranked.

use crate::error::{Reason, TraceError};
use crate::event::Event;
use crate::min_capacity::min_capacity;
use crate::reader::TraceReader;
use crate::report::Report;
use crate::run::{run_reader, Options, Quiet};
use cachealloc_core::{Config, ConfigItems, OomClass};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What [`advise`] is asked.
#[derive(Clone, Debug, Default)]
pub struct AdviseOptions {
    /// The settings the trace was recorded with ("" for PyTorch's defaults).
    pub recorded: String,
    /// A device (or limit) to fit: each setting replays under it.
    pub capacity: Option<u64>,
    /// Also find each setting's smallest device, to 2 MiB (a bisection:
    /// about a dozen more replays a setting).
    pub min_capacity: bool,
    /// Replays at once (0: one per core).
    pub threads: usize,
    /// The torch release whose decisions the replays take (`None`: the
    /// trace's, else the newest).
    pub torch: Option<cachealloc_core::TorchVersion>,
}

/// One setting of the grid.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its settings string ("" the defaults).
    pub conf: String,
    /// The items it sets over the recorded settings ("" for those).
    pub extra: String,
    /// What it tries, in words ("recorded", "expandable segments", ...).
    pub what: String,
    /// Whether PyTorch has it (the compact policy is cachealloc's own).
    pub pytorch: bool,
    /// Replayed with `set_per_process_memory_fraction(1.0)` (garbage
    /// collection acts only under a memory fraction).
    pub memory_fraction: Option<f64>,
}

/// How one setting did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The setting.
    pub candidate: Candidate,
    /// Peak reserved bytes (of the run under the capacity, if one is given).
    pub peak_reserved_bytes: u64,
    /// Device mallocs (or page maps).
    pub num_device_alloc: u64,
    /// Device frees (or unmaps).
    pub num_device_free: u64,
    /// Allocations that ran out of memory.
    pub ooms: u64,
    /// The first out-of-memory's verdict.
    pub first_oom_class: Option<OomClass>,
    /// Under the capacity: whether it ran without an out-of-memory.
    pub fits: Option<bool>,
    /// The smallest device it runs on (with `min_capacity`).
    pub min_capacity: Option<u64>,
}

/// The advice on one trace.
#[derive(Clone, Debug)]
pub struct Advice {
    /// The trace.
    pub trace: String,
    /// The capacity to fit, if given.
    pub capacity: Option<u64>,
    /// Every setting, best first ([`rank`]); the recorded one among them.
    pub ranked: Vec<Outcome>,
    /// The position in `ranked` of the recorded setting.
    pub recorded: usize,
    /// The position in `ranked` of the setting to use: the best PyTorch
    /// setting that does better than the recorded one; under a capacity,
    /// the best PyTorch setting that fits (the recorded one, if it is
    /// best). `None`: without a capacity, the recorded setting is best;
    /// under one, no setting fits.
    pub recommended: Option<usize>,
    /// Under a capacity: whether any setting fits.
    pub any_fits: Option<bool>,
}

/// `key:value` items of a settings string (the core's splitter).
fn items(conf: &str) -> Vec<&str> {
    ConfigItems::of(conf).collect()
}

/// `base` with the items of `extra` set (an item of `extra` replaces the one
/// of the same key), as written; `None` if it does not parse.
pub fn with_settings(base: &str, extra: &str) -> Option<String> {
    let key = |item: &str| item.split(':').next().unwrap_or("").trim().to_string();
    let extra_items = items(extra);
    let mut all: Vec<&str> = items(base)
        .into_iter()
        .filter(|b| !extra_items.iter().any(|e| key(e) == key(b)))
        .collect();
    all.extend(extra_items);
    let conf = all.join(",");
    Config::parse(&conf).ok().map(|_| conf)
}

/// The canonical form of `conf` (two strings of one policy have the same).
fn canonical(conf: &str) -> String {
    Config::parse(conf).map_or_else(|_| conf.to_string(), |c| c.to_string())
}

/// An error of the options given for `trace`.
fn option_error(trace: &str, why: String) -> TraceError {
    TraceError {
        path: trace.to_string(),
        line: 0,
        reason: Reason::Option(why),
    }
}

/// Sizes of the trace's `alloc` events.
fn request_sizes(trace: &str) -> Result<Vec<u64>, TraceError> {
    let mut r = TraceReader::open(trace)?;
    let mut sizes = Vec::new();
    while let Some(e) = r.next_event() {
        if let (_, Event::Alloc { size, .. }) = e? {
            sizes.push(size);
        }
    }
    Ok(sizes)
}

/// `max_split_size_mb` values from the trace's large requests: the sizes
/// at which 50%, 90% and 99% of the requests above 1 MiB are smaller
/// (PyTorch takes more than 20 MiB), in MiB.
fn split_sizes(sizes: &[u64]) -> Vec<u64> {
    const MIB: u64 = 1 << 20;
    let mut large: Vec<u64> = sizes.iter().copied().filter(|&s| s > MIB).collect();
    large.sort_unstable();
    let mut out = Vec::new();
    if large.is_empty() {
        return out;
    }
    for q in [0.5, 0.9, 0.99] {
        let k = ((large.len() - 1) as f64 * q) as usize;
        let mb = large[k].div_ceil(MIB).max(21);
        if !out.contains(&mb) {
            out.push(mb);
        }
    }
    out
}

/// The settings tried one at a time.
pub fn singles(trace: &str, opts: &AdviseOptions) -> Result<Vec<Candidate>, TraceError> {
    let bad_recorded = |why: String| {
        option_error(
            trace,
            format!(
                "the recorded settings {:?} do not parse{why}",
                opts.recorded
            ),
        )
    };
    Config::parse(&opts.recorded).map_err(|e| bad_recorded(format!(": {e}")))?;
    let recorded = with_settings(&opts.recorded, "").ok_or_else(|| bad_recorded(String::new()))?;
    let mut tries: Vec<(String, String, bool, Option<f64>)> = vec![(
        "expandable_segments:True".into(),
        "expandable segments".into(),
        true,
        None,
    )];
    for d in [1, 2, 4, 8] {
        tries.push((
            format!("roundup_power2_divisions:{d}"),
            format!("{d} rounding divisions"),
            true,
            None,
        ));
    }
    tries.push((
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]".into(),
        "rounding divisions by size".into(),
        true,
        None,
    ));
    let sizes = request_sizes(trace)?;
    let splits = split_sizes(&sizes);
    for &mb in &splits {
        tries.push((
            format!("max_split_size_mb:{mb}"),
            format!("no split of blocks over {mb} MiB"),
            true,
            None,
        ));
    }
    if let Some(&mb) = splits.first() {
        // Oversize requests may take cached oversize blocks this much larger
        // (20 MiB by default): more reuse, more slack.
        let rounding = (2 * mb).max(64);
        tries.push((
            format!("max_split_size_mb:{mb},max_non_split_rounding_mb:{rounding}"),
            format!("no split over {mb} MiB, oversize blocks reused up to {rounding} MiB larger"),
            true,
            None,
        ));
    }
    // The segment size for requests of 1 to 10 MiB (20 MiB by default).
    if sizes.iter().any(|&s| s > (1 << 20) && s < (10 << 20)) {
        for mb in [12, 64] {
            tries.push((
                format!("large_segment_size_mb:{mb}"),
                format!("{mb} MiB segments for requests of 1 to 10 MiB"),
                true,
                None,
            ));
        }
    }
    if opts.capacity.is_some() {
        tries.push((
            "per_process_memory_fraction:0.9,throw_on_cudamalloc_oom:True".into(),
            "refuse what would reserve over 90% of the device, before any device call (torch 2.12 on)".into(),
            true,
            None,
        ));
        for t in [0.6, 0.8] {
            tries.push((
                format!("garbage_collection_threshold:{t}"),
                format!("garbage collection at {t} (under a memory fraction of 1.0)"),
                true,
                Some(1.0),
            ));
        }
    }
    tries.push((
        "policy:compact".into(),
        "the compact policy (cachealloc's)".into(),
        false,
        None,
    ));
    let mut out = vec![Candidate {
        conf: recorded.clone(),
        extra: String::new(),
        what: "recorded".into(),
        pytorch: true,
        memory_fraction: None,
    }];
    for (extra, what, pytorch, memory_fraction) in tries {
        if let Some(conf) = with_settings(&recorded, &extra) {
            if !out.iter().any(|c| canonical(&c.conf) == canonical(&conf)) {
                out.push(Candidate {
                    conf,
                    extra,
                    what,
                    pytorch,
                    memory_fraction,
                });
            }
        }
    }
    Ok(out)
}

/// Replay `c` (`data`: the trace, read and decompressed once for every
/// candidate).
fn try_one(
    trace: &str,
    data: &Arc<Vec<u8>>,
    c: &Candidate,
    opts: &AdviseOptions,
) -> Result<Outcome, TraceError> {
    let open = || TraceReader::from_shared(trace, data.clone());
    let trace_fraction = open()?.header.memory_fraction;
    let config = Config::parse(&c.conf)
        .map_err(|e| option_error(trace, format!("settings {:?}: {e}", c.conf)))?;
    let base = Options {
        config,
        torch: opts.torch,
        conf: c.conf.clone(),
        capacity: opts.capacity,
        // Garbage collection needs a fraction: the trace's own if it has
        // one, else the candidate's 1.0 (every candidate then has the same
        // memory).
        memory_fraction: c
            .memory_fraction
            .filter(|_| opts.capacity.is_some())
            .map(|f| trace_fraction.unwrap_or(f)),
        ..Options::default()
    };
    let (r, _) = run_reader(open()?, &base, &mut Quiet)?;
    let min = if opts.min_capacity {
        // As `compare --min-capacity`: bisect up to the peak of a run no
        // capacity limits (not even the trace's own).
        let unlimited = Options {
            capacity: Some(u64::MAX),
            memory_fraction: None,
            ..base.clone()
        };
        let (u, _): (Report, _) = run_reader(open()?, &unlimited, &mut Quiet)?;
        let probe = Options {
            capacity: None,
            ..unlimited
        };
        Some(min_capacity(trace, &probe, &u)?)
    } else {
        None
    };
    let stats = |f: fn(&cachealloc_core::DeviceStats) -> i64| {
        r.devices.iter().map(|d| f(&d.1).max(0) as u64).sum::<u64>()
    };
    Ok(Outcome {
        candidate: c.clone(),
        peak_reserved_bytes: r.peak_reserved_bytes,
        num_device_alloc: stats(|s| s.num_device_alloc),
        num_device_free: stats(|s| s.num_device_free),
        ooms: r.ooms,
        first_oom_class: r.first_oom.as_ref().map(|o| o.cause.class),
        fits: r.capacity.map(|_| r.ooms == 0),
        min_capacity: min,
    })
}

/// Replay every candidate, `threads` at a time; `done` is called after
/// each (with how many are done).
fn try_all(
    trace: &str,
    data: &Arc<Vec<u8>>,
    candidates: &[Candidate],
    opts: &AdviseOptions,
    done: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Outcome>, TraceError> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(candidates.len())
    .max(1);
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Outcome, TraceError>>>> =
        Mutex::new((0..candidates.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = candidates.get(k) else {
                    return;
                };
                let r = try_one(trace, data, c, opts);
                let failed = r.is_err();
                results.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(r);
                done(finished.fetch_add(1, Ordering::Relaxed) + 1);
                if failed {
                    // The rest would fail alike (a bad trace): stop taking work.
                    next.store(candidates.len(), Ordering::Relaxed);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut out = Vec::with_capacity(results.len());
    for r in results.into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}

/// The ranking key: runs without an out-of-memory first (under a capacity,
/// the given one or the trace's), then the smallest device (with
/// `min_capacity`), the lowest peak reserved, the fewest device calls, the
/// shortest settings string.
fn key(o: &Outcome) -> (bool, u64, u64, u64, usize) {
    (
        o.ooms > 0,
        o.min_capacity.unwrap_or(0),
        o.peak_reserved_bytes,
        o.num_device_alloc + o.num_device_free,
        o.candidate.conf.len(),
    )
}

/// Sort `outcomes` best first.
pub fn rank(outcomes: &mut [Outcome]) {
    outcomes.sort_by_key(key);
}

/// Pairs and the triple of the (at most three) best PyTorch settings that
/// did better than the recorded one, each touching different keys.
fn combinations(recorded: &Outcome, singles: &[Outcome]) -> Vec<Candidate> {
    let mut better: Vec<&Outcome> = singles
        .iter()
        .filter(|o| o.candidate.pytorch && o.candidate.memory_fraction.is_none())
        .filter(|o| o.candidate.what != "recorded" && key(o) < key(recorded))
        .collect();
    better.sort_by_key(|o| key(o));
    let mut chosen: Vec<&Outcome> = Vec::new();
    for o in better {
        // One value per kind of setting (one rounding, one split size).
        let kind = setting_kind(&o.candidate.extra);
        if chosen
            .iter()
            .all(|c| setting_kind(&c.candidate.extra) != kind)
        {
            chosen.push(o);
        }
        if chosen.len() == 3 {
            break;
        }
    }
    let mut out = Vec::new();
    let mut add = |parts: &[&Outcome]| {
        let mut conf = recorded.candidate.conf.clone();
        let mut extra = Vec::new();
        let mut what = Vec::new();
        for p in parts {
            // Each part's own items, over what the others set.
            let Some(c) = with_settings(&conf, &p.candidate.extra) else {
                return;
            };
            conf = c;
            extra.push(p.candidate.extra.clone());
            what.push(p.candidate.what.clone());
        }
        out.push(Candidate {
            conf,
            extra: extra.join(","),
            what: what.join(" + "),
            pytorch: true,
            memory_fraction: None,
        });
    };
    for i in 0..chosen.len() {
        for j in i + 1..chosen.len() {
            add(&[chosen[i], chosen[j]]);
        }
    }
    if chosen.len() == 3 {
        add(&chosen);
    }
    out
}

/// The key of the (first) item a setting sets over the recorded ones.
fn setting_kind(extra: &str) -> String {
    items(extra)
        .first()
        .and_then(|i| i.split(':').next())
        .unwrap_or("")
        .to_string()
}

/// The advice on `trace`: every setting of the grid replayed (then the
/// combinations of the ones that helped), ranked; `progress(done, total)`
/// after each replay.
pub fn advise(
    trace: &str,
    opts: &AdviseOptions,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Advice, TraceError> {
    let singles = singles(trace, opts)?;
    // Read and decompressed once: every replay parses it from memory.
    let data = TraceReader::read_whole(trace)?;
    let total = AtomicUsize::new(singles.len());
    let tried = try_all(trace, &data, &singles, opts, &|n| {
        progress(n, total.load(Ordering::Relaxed))
    })?;
    let recorded = tried
        .iter()
        .find(|o| o.candidate.what == "recorded")
        .cloned()
        .ok_or_else(|| option_error(trace, "the recorded setting did not run".into()))?;
    let combos: Vec<Candidate> = combinations(&recorded, &tried)
        .into_iter()
        .filter(|c| {
            !tried
                .iter()
                .any(|o| canonical(&o.candidate.conf) == canonical(&c.conf))
        })
        .collect();
    let before = singles.len();
    total.store(before + combos.len(), Ordering::Relaxed);
    let more = try_all(trace, &data, &combos, opts, &|n| {
        progress(before + n, before + combos.len())
    })?;
    let mut ranked = tried;
    ranked.extend(more);
    rank(&mut ranked);
    let recorded_at = ranked
        .iter()
        .position(|o| o.candidate.what == "recorded")
        .unwrap_or(0);
    let any_fits = opts
        .capacity
        .map(|_| ranked.iter().any(|o| o.fits == Some(true)));
    let recorded_key = key(&ranked[recorded_at]);
    // The best PyTorch setting: under a capacity, the best that fits (the
    // recorded one, if it is best); else the best that beats the recorded.
    let recommended = ranked
        .iter()
        .position(|o| o.candidate.pytorch && o.fits != Some(false))
        .filter(|&i| opts.capacity.is_some() || key(&ranked[i]) < recorded_key);
    Ok(Advice {
        trace: trace.to_string(),
        capacity: opts.capacity,
        ranked,
        recorded: recorded_at,
        recommended,
        any_fits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_compose_and_replace_their_keys() {
        assert_eq!(
            with_settings("", "expandable_segments:True").unwrap(),
            "expandable_segments:True"
        );
        let c = with_settings(
            "max_split_size_mb:200,roundup_power2_divisions:[256:1,>:4]",
            "roundup_power2_divisions:2",
        )
        .unwrap();
        assert_eq!(c, "max_split_size_mb:200,roundup_power2_divisions:2");
        assert_eq!(
            Config::parse(&c).unwrap().roundup_power2_divisions,
            Config::parse("roundup_power2_divisions:2")
                .unwrap()
                .roundup_power2_divisions
        );
        assert!(with_settings("", "no_such_key:1").is_none());
        assert_eq!(
            items("a:1,b:[1:2,>:3], c:4"),
            vec!["a:1", "b:[1:2,>:3]", "c:4"]
        );
    }

    fn outcome(conf: &str, extra: &str, peak: u64, ooms: u64) -> Outcome {
        Outcome {
            candidate: Candidate {
                conf: conf.into(),
                extra: extra.into(),
                what: if extra.is_empty() {
                    "recorded".into()
                } else {
                    extra.into()
                },
                pytorch: true,
                memory_fraction: None,
            },
            peak_reserved_bytes: peak,
            num_device_alloc: 1,
            num_device_free: 0,
            ooms,
            first_oom_class: None,
            fits: None,
            min_capacity: None,
        }
    }

    /// A pair sets both parts' own items: B's split size is not undone by
    /// A's string, which carries the recorded one.
    #[test]
    fn combinations_compose_the_parts_own_items() {
        let rec = outcome("max_split_size_mb:200", "", 100, 0);
        let a = outcome(
            "max_split_size_mb:200,roundup_power2_divisions:4",
            "roundup_power2_divisions:4",
            90,
            0,
        );
        let b = outcome("max_split_size_mb:100", "max_split_size_mb:100", 80, 0);
        let combos = combinations(&rec, &[rec.clone(), a, b]);
        assert_eq!(combos.len(), 1);
        let c = Config::parse(&combos[0].conf).unwrap();
        assert_eq!(c.max_split_size, 100 << 20, "{}", combos[0].conf);
        assert_eq!(
            c.roundup_power2_divisions,
            Config::parse("roundup_power2_divisions:4")
                .unwrap()
                .roundup_power2_divisions
        );
    }

    /// A setting that runs out of memory ranks after every one that does
    /// not, however low its peak.
    #[test]
    fn out_of_memory_ranks_last() {
        let mut v = vec![outcome("a", "a", 10, 3), outcome("b", "b", 50, 0)];
        rank(&mut v);
        assert_eq!(v[0].candidate.conf, "b");
    }

    #[test]
    fn split_sizes_come_from_the_large_requests() {
        const MIB: u64 = 1 << 20;
        let sizes: Vec<u64> = (1..=100).map(|k| k * MIB).collect();
        assert_eq!(split_sizes(&sizes), vec![51, 90, 99]);
        assert_eq!(split_sizes(&[512, 4096]), Vec::<u64>::new());
    }
}
