//! Random multi-stream op sequences and their trace files
//! (`docs/trace-format.md`), replayed through the trace crate's reader and
//! replay engine (so the differential test exercises the real trace path)
//! with the invariants checked after every event.

use cachealloc_core::Config;
pub use cachealloc_trace::Event as Op;
use cachealloc_trace::{run_reader, Alloc, Observer, Options, Replay, Report, TraceReader};
use std::fmt::Write as _;
use std::path::Path;

/// A generated case: the settings and the ops.
#[derive(Clone, Debug)]
pub struct Case {
    /// The seed it was generated from.
    pub seed: u64,
    /// Config string.
    pub conf: String,
    /// Device capacity.
    pub capacity: Option<u64>,
    /// `set_per_process_memory_fraction`, applied when the allocator is created.
    pub memory_fraction: Option<f64>,
    /// The ops.
    pub ops: Vec<Op>,
}

/// SplitMix64: small, seedable, good enough for test generation.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u64) -> bool {
        self.next_u64() % 100 < p
    }
    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next_u64() % items.len() as u64) as usize]
    }
}

/// The config strings the generator draws from.
pub const CONFIGS: &[&str] = &[
    "",
    "",
    "max_split_size_mb:40",
    "max_split_size_mb:100",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
    "max_split_size_mb:64,roundup_power2_divisions:2",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.8,max_split_size_mb:32",
    "expandable_segments:True",
    "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:40",
    "expandable_segments:True,garbage_collection_threshold:0.6",
    "expandable_segments:True,roundup_power2_divisions:4",
];

/// The config strings the fuzz targets draw from: [`CONFIGS`] and the
/// compact policy (which the reference model does not know, so the
/// differential test leaves it out).
pub const FUZZ_CONFIGS: &[&str] = &[
    "",
    "",
    "max_split_size_mb:40",
    "max_split_size_mb:100",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
    "max_split_size_mb:64,roundup_power2_divisions:2",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.8,max_split_size_mb:32",
    "expandable_segments:True",
    "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:40",
    "expandable_segments:True,garbage_collection_threshold:0.6",
    "expandable_segments:True,roundup_power2_divisions:4",
    "policy:compact",
    "policy:compact",
    "policy:compact",
    "policy:compact,max_split_size_mb:40",
    "policy:compact,garbage_collection_threshold:0.6",
    "policy:compact,roundup_power2_divisions:4",
];

const MIB: u64 = 1 << 20;

/// A request size skewed to the policy's boundaries.
pub fn size(rng: &mut Rng) -> u64 {
    const EDGES: &[u64] = &[
        0,
        1,
        511,
        512,
        513,
        MIB - 1,
        MIB,
        MIB + 1,
        2 * MIB,
        10 * MIB - 1,
        10 * MIB,
        10 * MIB + 1,
        12 * MIB,
        20 * MIB,
        40 * MIB,
        41 * MIB,
        60 * MIB,
    ];
    match rng.range(0, 99) {
        0..=34 => rng.range(1, 65536),
        35..=49 => *rng.pick(EDGES),
        50..=74 => rng.range(64 << 10, 4 * MIB),
        75..=94 => rng.range(MIB, 64 * MIB),
        _ => rng.range(64 * MIB, 300 * MIB),
    }
}

/// Generate a case from `seed`.
pub fn generate(seed: u64) -> Case {
    let mut rng = Rng(seed);
    let conf = rng.pick(CONFIGS).to_string();
    let capacity = if rng.pct(50) {
        Some(*rng.pick(&[64 * MIB, 128 * MIB, 256 * MIB, 512 * MIB]))
    } else {
        None
    };
    let memory_fraction = match capacity {
        Some(_) if rng.pct(35) => Some(*rng.pick(&[0.5, 0.8, 1.0])),
        _ => None,
    };
    let streams = if rng.pct(50) { 1 } else { rng.range(2, 4) };
    let n = rng.range(40, 260);
    let mut ops = Vec::with_capacity(n as usize);
    let mut live: Vec<u64> = Vec::new();
    let mut freed: Vec<u64> = Vec::new();
    let mut next_id = 0u64;
    for _ in 0..n {
        let r = rng.range(0, 99);
        if live.is_empty() || r < 45 {
            let id = if !freed.is_empty() && rng.pct(10) {
                freed.swap_remove((rng.next_u64() % freed.len() as u64) as usize)
            } else {
                next_id += 1;
                next_id - 1
            };
            ops.push(Op::Alloc {
                id,
                size: size(&mut rng),
                stream: rng.range(0, streams - 1),
                device: 0,
            });
            live.push(id);
        } else if r < 82 {
            // Mostly recent allocations die first, as tensors do.
            let k = if rng.pct(60) {
                live.len() - 1 - (rng.next_u64() % live.len().min(4) as u64) as usize
            } else {
                (rng.next_u64() % live.len() as u64) as usize
            };
            let id = live.swap_remove(k);
            ops.push(Op::Free { id });
            freed.push(id);
        } else if r < 90 {
            let id = *rng.pick(&live);
            ops.push(Op::RecordStream {
                id,
                stream: rng.range(0, streams),
            });
        } else if r < 97 {
            let stream = if rng.pct(40) {
                None
            } else {
                Some(rng.range(0, streams))
            };
            ops.push(Op::Sync { stream });
        } else {
            ops.push(Op::EmptyCache);
        }
    }
    Case {
        seed,
        conf,
        capacity,
        memory_fraction,
        ops,
    }
}

/// The case as a trace file's text.
pub fn trace_text(case: &Case) -> String {
    let mut s = String::new();
    let cap = case.capacity.map_or("null".to_string(), |c| c.to_string());
    let _ = writeln!(
        s,
        r#"{{"format":"cachealloc-trace","version":1,"source":"cachealloc differential case, seed {}","device_capacity":{cap}}}"#,
        case.seed
    );
    for op in &case.ops {
        s.push_str(&cachealloc_trace::event_json(op));
        s.push('\n');
    }
    s
}

/// Write the case's trace to `path`.
pub fn write_trace(case: &Case, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, trace_text(case))
}

/// The result of replaying a case: the CLI's report and replay state.
pub struct Replayed {
    /// The report (statistics per device, OOMs, peaks).
    pub report: Report,
    /// The replay state (the device allocators).
    pub replay: Replay,
}

impl Replayed {
    /// Device 0's allocator.
    pub fn alloc(&self) -> &Alloc {
        &self.replay.devices[0].alloc
    }
}

/// Checks the invariants of every device after every `every`-th event and
/// stops at the first violation.
struct Check {
    every: u64,
    violation: Option<String>,
}

impl Observer for Check {
    fn after_event(&mut self, index: u64, r: &Replay) {
        if self.violation.is_none() && index.is_multiple_of(self.every) {
            for d in &r.devices {
                if let Err(v) = d.alloc.check_invariants() {
                    self.violation = Some(format!("after event {index}, device {}: {v}", d.index));
                }
            }
        }
    }
    fn stop_after(&self, _index: u64) -> bool {
        self.violation.is_some()
    }
}

/// Replay a case (through its trace text), checking the invariants after
/// every event.
pub fn replay(case: &Case) -> Result<Replayed, String> {
    replay_checked(case, 1)
}

/// [`replay()`], checking the invariants after every `check_every`-th event and at the end.
pub fn replay_checked(case: &Case, check_every: u64) -> Result<Replayed, String> {
    replay_with(case, check_every, 0)
}

/// [`replay_checked`] with a memory history of `history` entries per device
/// and, when it is not 0, a snapshot at the end (in the report).
pub fn replay_with(case: &Case, check_every: u64, history: usize) -> Result<Replayed, String> {
    replay_as(case, check_every, history, None)
}

/// [`replay_with`] taking torch `torch`'s decisions (the newest if `None`).
pub fn replay_as(
    case: &Case,
    check_every: u64,
    history: usize,
    torch: Option<cachealloc_core::TorchVersion>,
) -> Result<Replayed, String> {
    let config = Config::parse(&case.conf).map_err(|e| e.to_string())?;
    let opts = Options {
        config,
        torch,
        conf: case.conf.clone(),
        capacity: case.capacity,
        memory_fraction: case.memory_fraction,
        slots: 2048,
        history,
        snapshot: history > 0,
        ..Options::default()
    };
    let reader = TraceReader::from_bytes(
        &format!("case-{}", case.seed),
        trace_text(case).into_bytes(),
        false,
    )
    .map_err(|e| e.to_string())?;
    let mut check = Check {
        every: check_every.max(1),
        violation: None,
    };
    let (report, replay) = run_reader(reader, &opts, &mut check).map_err(|e| e.to_string())?;
    if let Some(v) = check.violation {
        return Err(v);
    }
    for d in &replay.devices {
        d.alloc
            .check_invariants()
            .map_err(|e| format!("at the end: {e}"))?;
    }
    Ok(Replayed { report, replay })
}
