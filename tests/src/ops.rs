//! Random multi-stream op sequences, their trace files
//! (`../shared/trace-format.md`), and their replay on the core with the
//! trace format's rules (an alloc that fails with out-of-memory is counted,
//! and the later free or record_stream of its id is skipped).

use crate::{allocator, MockAllocator};
use cachealloc_core::{Allocation, Config};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::Path;

/// One event of a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Allocate `size` bytes on `stream` as `id`.
    Alloc {
        /// Trace id.
        id: u64,
        /// Bytes.
        size: u64,
        /// Stream.
        stream: u64,
    },
    /// Free `id`.
    Free {
        /// Trace id.
        id: u64,
    },
    /// `id` is also used on `stream`.
    RecordStream {
        /// Trace id.
        id: u64,
        /// Stream.
        stream: u64,
    },
    /// The host waits for `stream` (all when `None`).
    Sync {
        /// Stream.
        stream: Option<u64>,
    },
    /// Return unused cached segments.
    EmptyCache,
}

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
        let _ = match *op {
            Op::Alloc { id, size, stream } => writeln!(
                s,
                r#"{{"op":"alloc","id":{id},"size":{size},"stream":{stream}}}"#
            ),
            Op::Free { id } => writeln!(s, r#"{{"op":"free","id":{id}}}"#),
            Op::RecordStream { id, stream } => {
                writeln!(s, r#"{{"op":"record_stream","id":{id},"stream":{stream}}}"#)
            }
            Op::Sync { stream: Some(st) } => writeln!(s, r#"{{"op":"sync","stream":{st}}}"#),
            Op::Sync { stream: None } => writeln!(s, r#"{{"op":"sync"}}"#),
            Op::EmptyCache => writeln!(s, r#"{{"op":"empty_cache"}}"#),
        };
    }
    s
}

/// Write the case's trace to `path`.
pub fn write_trace(case: &Case, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, trace_text(case))
}

/// The result of replaying a case on the core.
pub struct Replayed {
    /// The allocator at the end.
    pub alloc: MockAllocator,
    /// Allocations still live at the end.
    pub live: HashMap<u64, Allocation>,
    /// Allocs that failed with out-of-memory.
    pub ooms: u64,
}

/// Replay a case on the core with the trace format's rules, checking the
/// invariants after every op. Like the reference model (and PyTorch, whose
/// allocators exist only once CUDA is initialised), an `empty_cache` before
/// the first allocation does nothing.
pub fn replay(case: &Case) -> Result<Replayed, String> {
    replay_checked(case, 1)
}

/// [`replay`], checking the invariants after every `check_every`-th op and at the end.
pub fn replay_checked(case: &Case, check_every: usize) -> Result<Replayed, String> {
    let config = Config::parse(&case.conf).map_err(|e| e.to_string())?;
    let mut a = allocator(case.capacity, config, 1 << 14);
    if let Some(f) = case.memory_fraction {
        a.set_memory_fraction(f).map_err(|e| e.to_string())?;
    }
    let mut live: HashMap<u64, Allocation> = HashMap::new();
    let mut failed: HashSet<u64> = HashSet::new();
    let mut started = false;
    let mut ooms = 0;
    for (n, op) in case.ops.iter().enumerate() {
        let at = |e: String| format!("op {n} {op:?}: {e}");
        match *op {
            Op::Alloc { id, size, stream } => {
                failed.remove(&id);
                started = true;
                match a.malloc(size, stream) {
                    Ok(x) => {
                        live.insert(id, x);
                    }
                    Err(e) if e.is_out_of_memory() => {
                        failed.insert(id);
                        ooms += 1;
                    }
                    Err(e) => return Err(at(e.to_string())),
                }
            }
            Op::Free { id } => {
                if failed.remove(&id) {
                    continue;
                }
                let x = live
                    .remove(&id)
                    .ok_or_else(|| at("free of an id that is not live".into()))?;
                a.free_ptr(x.ptr).map_err(|e| at(e.to_string()))?;
            }
            Op::RecordStream { id, stream } => {
                if failed.contains(&id) {
                    continue;
                }
                let x = live
                    .get(&id)
                    .ok_or_else(|| at("record_stream of an id that is not live".into()))?;
                a.record_stream_ptr(x.ptr, stream)
                    .map_err(|e| at(e.to_string()))?;
            }
            Op::Sync { stream } => a.backend_mut().sync(stream),
            Op::EmptyCache => {
                if started {
                    a.empty_cache().map_err(|e| at(e.to_string()))?;
                }
            }
        }
        if n % check_every.max(1) == 0 {
            a.check_invariants().map_err(|e| at(e.to_string()))?;
        }
    }
    a.check_invariants()
        .map_err(|e| format!("at the end: {e}"))?;
    Ok(Replayed {
        alloc: a,
        live,
        ooms,
    })
}
