//! Allocation sequences taken from real traces, and the allocators compared
//! on them, bookkeeping only: ours (on the simulated device), offset-allocator
//! (O(1), out-of-band metadata), rlsf (TLSF, headers in a host buffer that
//! stands for the pool) and a plain `BTreeMap` best-fit baseline.
//!
//! The peers manage one contiguous range; ours manages segments with
//! PyTorch's policy. offset-allocator and rlsf get sizes in units of
//! `UNIT` bytes (offset-allocator counts in `u32`; rlsf needs real host
//! memory for its pool), the others get bytes.
#![allow(dead_code)]

use cachealloc_core::{BlockId, BlockSlot, Config, DeviceAllocator};
use cachealloc_mock::MockDevice;
use cachealloc_trace::{Event, TraceReader};
use std::alloc::Layout;
use std::collections::{BTreeMap, BTreeSet};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// Sizes are scaled by this for the peers that need it.
pub const UNIT: u64 = 256;

/// The traces of the test data (`tests/data/traces/`, or
/// `$CACHEALLOC_TESTDATA/traces/`).
pub fn data_traces() -> Vec<String> {
    let dir = match std::env::var_os("CACHEALLOC_TESTDATA") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data"),
    }
    .join("traces");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".jsonl.gz"))
        .collect();
    v.sort();
    v
}

/// One step of a sequence; allocations are numbered densely.
#[derive(Clone, Copy)]
pub enum Op {
    /// Allocate `size` bytes as number `slot`.
    Alloc { slot: u32, size: u64 },
    /// Free number `slot`.
    Free { slot: u32 },
}

/// The alloc/free sequence of a trace.
pub struct Sequence {
    /// The trace's file name.
    pub name: String,
    /// The steps.
    pub ops: Vec<Op>,
    /// Allocations in all.
    pub slots: usize,
    /// Peak of the sum of live sizes.
    pub peak_live: u64,
}

/// Read a trace's allocs and frees (streams, syncs and record_stream play
/// no part for single-range allocators).
pub fn load(path: &str) -> Sequence {
    let mut r = TraceReader::open(path).expect("open trace");
    let mut live = std::collections::HashMap::new();
    let (mut ops, mut next, mut cur, mut peak) = (Vec::new(), 0u32, 0u64, 0u64);
    while let Some(ev) = r.next_event() {
        match ev.expect("valid trace").1 {
            Event::Alloc { id, size, .. } => {
                live.insert(id, (next, size));
                ops.push(Op::Alloc { slot: next, size });
                next += 1;
                cur += size;
                peak = peak.max(cur);
            }
            Event::Free { id } => {
                let (slot, size) = live.remove(&id).expect("free of a live id");
                cur -= size;
                ops.push(Op::Free { slot });
            }
            _ => {}
        }
    }
    let name = std::path::Path::new(path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    Sequence {
        name,
        ops,
        slots: next as usize,
        peak_live: peak,
    }
}

/// Our allocator on the simulated device.
pub struct Ours {
    a: DeviceAllocator<MockDevice, Box<[BlockSlot]>, 64>,
    handles: Vec<Option<BlockId>>,
}

impl Ours {
    pub fn new(seq: &Sequence) -> Ours {
        Ours {
            a: DeviceAllocator::new(
                MockDevice::unlimited(),
                vec![BlockSlot::VACANT; 1 << 17].into_boxed_slice(),
                Config::DEFAULT,
            ),
            handles: vec![None; seq.slots],
        }
    }

    /// Run the sequence; returns the failures.
    pub fn run(&mut self, seq: &Sequence) -> u64 {
        let mut fails = 0;
        for op in &seq.ops {
            match *op {
                Op::Alloc { slot, size } => match self.a.malloc(size, 0) {
                    Ok(x) => self.handles[slot as usize] = x.handle,
                    Err(_) => fails += 1,
                },
                Op::Free { slot } => {
                    if let Some(id) = self.handles[slot as usize].take() {
                        self.a.free(id).expect("free");
                    }
                }
            }
        }
        fails
    }
}

/// offset-allocator over a 2^31-unit range.
pub struct Offset {
    a: offset_allocator::Allocator,
    handles: Vec<Option<offset_allocator::Allocation>>,
    /// The highest end offset ever handed out, in units.
    pub high_water: u64,
}

impl Offset {
    pub fn new(seq: &Sequence) -> Offset {
        Offset {
            a: offset_allocator::Allocator::with_max_allocs(1 << 31, 1 << 20),
            handles: vec![None; seq.slots],
            high_water: 0,
        }
    }

    pub fn run(&mut self, seq: &Sequence) -> u64 {
        let mut fails = 0;
        for op in &seq.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    let units = size.div_ceil(UNIT).max(1) as u32;
                    match self.a.allocate(units) {
                        Some(x) => {
                            self.high_water = self.high_water.max(x.offset as u64 + units as u64);
                            self.handles[slot as usize] = Some(x);
                        }
                        None => fails += 1,
                    }
                }
                Op::Free { slot } => {
                    if let Some(x) = self.handles[slot as usize].take() {
                        self.a.free(x);
                    }
                }
            }
        }
        fails
    }
}

/// A host buffer for rlsf's pool, reused across runs.
pub struct Pool {
    ptr: NonNull<[MaybeUninit<u8>]>,
}

impl Pool {
    /// A pool for the sequence (its peak live bytes / UNIT, twice over).
    pub fn new(seq: &Sequence) -> Pool {
        let bytes = (seq.peak_live.div_ceil(UNIT) as usize) * 2 + (1 << 20);
        let b: Box<[MaybeUninit<u8>]> = vec![MaybeUninit::uninit(); bytes].into_boxed_slice();
        Pool {
            ptr: NonNull::from(Box::leak(b)),
        }
    }
}

type RTlsf = rlsf::Tlsf<'static, u32, u32, 28, 32>;

/// rlsf over the pool.
pub struct Rlsf {
    t: RTlsf,
    handles: Vec<Option<(NonNull<u8>, Layout)>>,
}

impl Rlsf {
    pub fn new(seq: &Sequence, pool: &Pool) -> Rlsf {
        let mut t = RTlsf::new();
        // SAFETY: the pool's buffer is leaked (lives forever) and is handed to
        // one Tlsf at a time: the previous one is dropped before the next run
        // is set up, and nothing else touches the buffer.
        unsafe {
            t.insert_free_block_ptr(NonNull::slice_from_raw_parts(
                pool.ptr.cast::<u8>(),
                pool.ptr.len(),
            ))
        };
        Rlsf {
            t,
            handles: vec![None; seq.slots],
        }
    }

    pub fn run(&mut self, seq: &Sequence) -> u64 {
        let mut fails = 0;
        for op in &seq.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    let layout = Layout::from_size_align(size.div_ceil(UNIT).max(1) as usize, 16)
                        .expect("layout");
                    match self.t.allocate(layout) {
                        Some(p) => self.handles[slot as usize] = Some((p, layout)),
                        None => fails += 1,
                    }
                }
                Op::Free { slot } => {
                    if let Some((p, layout)) = self.handles[slot as usize].take() {
                        // SAFETY: `p` came from this Tlsf's `allocate` with this alignment and is freed once.
                        unsafe { self.t.deallocate(p, layout.align()) };
                    }
                }
            }
        }
        fails
    }
}

/// Best fit on a `BTreeSet` of (size, address), coalescing through a
/// `BTreeMap` by address; grows at the top when nothing fits.
pub struct BTreeBestFit {
    by_size: BTreeSet<(u64, u64)>,
    by_addr: BTreeMap<u64, u64>,
    top: u64,
    handles: Vec<Option<(u64, u64)>>,
}

impl BTreeBestFit {
    pub fn new(seq: &Sequence) -> BTreeBestFit {
        BTreeBestFit {
            by_size: BTreeSet::new(),
            by_addr: BTreeMap::new(),
            top: 0,
            handles: vec![None; seq.slots],
        }
    }

    pub fn run(&mut self, seq: &Sequence) -> u64 {
        for op in &seq.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    let size = size.div_ceil(512).max(1) * 512;
                    let addr = match self.by_size.range((size, 0)..).next().copied() {
                        Some((s, a)) => {
                            self.by_size.remove(&(s, a));
                            self.by_addr.remove(&a);
                            if s > size {
                                self.by_size.insert((s - size, a + size));
                                self.by_addr.insert(a + size, s - size);
                            }
                            a
                        }
                        None => {
                            self.top += size;
                            self.top - size
                        }
                    };
                    self.handles[slot as usize] = Some((addr, size));
                }
                Op::Free { slot } => {
                    if let Some((mut a, mut s)) = self.handles[slot as usize].take() {
                        if let Some((&pa, &ps)) = self.by_addr.range(..a).next_back() {
                            if pa + ps == a {
                                self.by_addr.remove(&pa);
                                self.by_size.remove(&(ps, pa));
                                a = pa;
                                s += ps;
                            }
                        }
                        if let Some(ns) = self.by_addr.remove(&(a + s)) {
                            self.by_size.remove(&(ns, a + s));
                            s += ns;
                        }
                        self.by_addr.insert(a, s);
                        self.by_size.insert((s, a));
                    }
                }
            }
        }
        0
    }
}

/// Print the fragmentation table of BENCHMARKS.md for `traces` (Markdown).
pub fn print_fragmentation_table(traces: &[String]) {
    use cachealloc_cli::human::bytes;
    use cachealloc_trace::{min_capacity, run, Options, Quiet};
    let confs = ["", "max_split_size_mb:128", "roundup_power2_divisions:4"];
    println!("| trace | peak live | peak reserved (default) | (max_split_size_mb:128) | (roundup_power2_divisions:4) | min capacity (default / mss 128 / rp2 4) | offset-allocator high-water |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for t in traces {
        let mut reserved = Vec::new();
        let mut mins = Vec::new();
        let mut live = 0;
        for c in confs {
            let opts = Options {
                config: cachealloc_core::Config::parse(c).expect("config"),
                conf: c.to_string(),
                ..Options::default()
            };
            let (r, _) = run(t, &opts, &mut Quiet).expect("replay");
            live = r.peak_live_bytes;
            reserved.push(format!(
                "{} ({:.3})",
                bytes(r.peak_reserved_bytes),
                r.fragmentation()
            ));
            mins.push(bytes(min_capacity(t, &opts, &r).expect("bisection")));
        }
        let seq = load(t);
        let mut off = Offset::new(&seq);
        assert_eq!(off.run(&seq), 0);
        let hw = off.high_water * UNIT;
        let name = std::path::Path::new(t)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} ({:.3}) |",
            bytes(live),
            reserved[0],
            reserved[1],
            reserved[2],
            mins.join(" / "),
            bytes(hw),
            hw as f64 / live as f64
        );
    }
}
