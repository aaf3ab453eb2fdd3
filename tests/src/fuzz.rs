//! The logic of the fuzz targets, shared by `fuzz/` (cargo-fuzz) and a stable
//! `cargo test` that feeds it seeded random bytes and the committed corpus.
//!
//! - [`ops`]: an arbitrary sequence of allocator operations, with injected
//!   backend failures, mirrored on a shadow model: the live device ranges,
//!   and the ranges freed while other streams used them, pending until a
//!   sync covers those streams. No allocation may overlap a live or a
//!   pending range. Private pools (create, routing, captures, release,
//!   empty_cache of a pool): an allocation comes from the pool the newest
//!   matching routing names (or a `use_on_oom` pool for a default request),
//!   and a segment handed to one pool is never handed to another while the
//!   first exists. `check_invariants()` after every op; at the end
//!   everything is freed, the pools released, the cache emptied, and the
//!   device must hold nothing.
//! - [`no_false_oom`]: under a capacity, an allocation may fail only if the
//!   ladder released every releasable cached segment and the device really
//!   cannot supply the segment.
//! - [`conf`]: the config parser never panics and round-trips what it accepts.

use crate::ops::FUZZ_CONFIGS;
use crate::teardown;
use arbitrary::{Arbitrary, Unstructured};
use cachealloc_core::{
    Allocation, BlockId, BlockSlot, BlockState, Config, DeviceAllocator, DevicePtr, Error,
    MallocFlags, MempoolId, OomReport, PoolOptions, SegmentSource, StreamFilter,
};
use cachealloc_mock::{CaptureMode, MockDevice, MockError, MockMachine};
use std::collections::{BTreeMap, BTreeSet};

const MIB: u64 = 1 << 20;
/// The stream an all-streams capture captures on the simulated device (no
/// op uses it).
const CAPTURE_STREAM: u64 = 100;

/// The allocator the fuzz targets drive: small event capacity so full queues happen.
pub type FuzzAllocator = DeviceAllocator<MockDevice, Box<[BlockSlot]>, 8>;

/// A request size, skewed to the policy's boundaries.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    /// 0..64 KiB.
    Small(u16),
    /// 512 ± 127.
    Near512(i8),
    /// 1 MiB ± 127 bytes (the small / large pool boundary).
    Near1MiB(i8),
    /// 1 MiB ± 127 x 512 bytes.
    Around1MiB(i8),
    /// 10 MiB ± 127 x 512 bytes (the own-segment boundary).
    Near10MiB(i8),
    /// 20 MiB ± 127 x 64 KiB (oversize tolerances).
    Near20MiB(i8),
    /// Anything below 256 MiB.
    Medium(u32),
    /// Anything (mostly refused as over 1 EiB).
    Any(u64),
}

impl Size {
    /// Bytes.
    pub fn bytes(self) -> u64 {
        let around = |base: u64, d: i8, step: i64| (base as i64 + d as i64 * step).max(0) as u64;
        match self {
            Size::Small(x) => x as u64,
            Size::Near512(d) => around(512, d, 1),
            Size::Near1MiB(d) => around(MIB, d, 1),
            Size::Around1MiB(d) => around(MIB, d, 512),
            Size::Near10MiB(d) => around(10 * MIB, d, 512),
            Size::Near20MiB(d) => around(20 * MIB, d, 64 << 10),
            Size::Medium(x) => x as u64 % (256 * MIB),
            Size::Any(x) => x,
        }
    }
}

/// One operation.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum FuzzOp {
    /// malloc.
    Alloc {
        /// Request.
        size: Size,
        /// Stream (mod 3).
        stream: u8,
    },
    /// malloc with `NO_RETRY`.
    AllocNoRetry {
        /// Request.
        size: Size,
        /// Stream (mod 3).
        stream: u8,
    },
    /// free by handle of a live allocation.
    Free {
        /// Which live allocation.
        which: u16,
    },
    /// free by pointer, possibly inside the allocation.
    FreePtr {
        /// Which live allocation.
        which: u16,
        /// Offset into it (0: its start).
        offset: u32,
    },
    /// free of an already freed handle.
    DoubleFree {
        /// Which freed handle.
        which: u16,
    },
    /// record_stream.
    RecordStream {
        /// Which live allocation.
        which: u16,
        /// Stream (mod 3).
        stream: u8,
    },
    /// The host waits for a stream (or all).
    Sync {
        /// Stream (mod 3), or all.
        stream: Option<u8>,
    },
    /// empty_cache.
    EmptyCache,
    /// Set (MiB) or clear a memory limit.
    SetLimit {
        /// Limit in MiB.
        mib: Option<u16>,
    },
    /// `malloc_with_address` at a 512-byte multiple into a held segment.
    AllocAt {
        /// Bytes.
        size: Size,
        /// Stream (mod 3).
        stream: u8,
        /// Which segment (mod their count).
        seg: u8,
        /// Offset in it, in 512-byte units (mod its size).
        offset: u16,
    },
    /// Make the n-th backend call from now fail.
    InjectFailure {
        /// n (mod 8).
        after: u8,
    },
    /// reset_peak_stats.
    ResetPeak,
    /// `create_pool` (pool mod 3), or `create_pool_with_source`.
    PoolCreate {
        /// Which pool.
        pool: u8,
        /// `use_on_oom`.
        use_on_oom: bool,
        /// `no_split`.
        no_split: bool,
        /// Its segments from [`fuzz_source`] (a pool that exists refuses).
        source: bool,
    },
    /// `begin_allocate_to_pool` / `capture_begin` (pool mod 3).
    PoolBegin {
        /// Which pool.
        pool: u8,
        /// Streams routed: a bit mask of streams 0..3 (0: all).
        streams: u8,
        /// A capture.
        capture: bool,
    },
    /// `end_allocate_to_pool` (pool mod 3).
    PoolEnd {
        /// Which pool.
        pool: u8,
    },
    /// `release_pool` (pool mod 3).
    PoolRelease {
        /// Which pool.
        pool: u8,
    },
    /// `empty_cache_pool` (pool mod 3).
    PoolEmptyCache {
        /// Which pool.
        pool: u8,
    },
    /// malloc at an alignment: `1 << (log2 % 23)` (up to 4 MiB), or a bad
    /// one (0, or not a power of two) for `log2` of 250 and up.
    AllocAligned {
        /// Request.
        size: Size,
        /// The alignment's log2.
        log2: u8,
        /// Stream (mod 3).
        stream: u8,
    },
    /// `share_ipc_handle` of a live allocation (one more consumer).
    Share {
        /// Which live allocation.
        which: u16,
    },
    /// `release_ipc_share`: a consumer of a live allocation is done.
    ReleaseShare {
        /// Which live allocation.
        which: u16,
    },
}

/// The fuzz source's state on this thread (one run at a time).
#[derive(Clone, Copy)]
struct SourceState {
    /// Bytes handed out and not given back.
    live: u64,
    /// The next address.
    next: u64,
    /// It refused a segment since the last look (an out-of-memory of its
    /// own, which no device capacity explains).
    refused: bool,
}

const SOURCE_BASE: u64 = 1 << 63;

std::thread_local! {
    static SOURCE: std::cell::Cell<SourceState> = const {
        std::cell::Cell::new(SourceState { live: 0, next: SOURCE_BASE, refused: false })
    };
}

fn source_alloc(_: usize, size: u64, _: u64) -> Option<DevicePtr> {
    let mut s = SOURCE.get();
    // Addresses from 2^63 up, above every device range, never twice in a
    // run (the shadow knows a segment by its base), until they run out.
    let Some(end) = s.next.checked_add(size) else {
        s.refused = true;
        SOURCE.set(s);
        return None;
    };
    let p = s.next;
    s.live += size;
    s.next = end;
    SOURCE.set(s);
    Some(DevicePtr(p))
}

fn source_free(_: usize, _: DevicePtr, size: u64, _: u64) {
    let mut s = SOURCE.get();
    s.live = s
        .live
        .checked_sub(size)
        .expect("the source got back more than it gave");
    SOURCE.set(s);
}

/// A segment source for pools of the fuzz: addresses from 2^63 up, its
/// bytes out counted (none may be left at the end of a run).
pub fn fuzz_source() -> SegmentSource {
    SegmentSource::new(source_alloc, source_free, 0)
}

/// Bytes the fuzz source handed out on this thread and has not got back.
pub fn fuzz_source_live() -> u64 {
    SOURCE.get().live
}

/// Whether the fuzz source refused a segment since the last call.
fn source_refused() -> bool {
    let mut s = SOURCE.get();
    let r = s.refused;
    s.refused = false;
    SOURCE.set(s);
    r
}

/// The pool of a fuzz op's pool number.
fn pool_id(pool: u8) -> MempoolId {
    MempoolId(0, pool as u64 % 3 + 1)
}

/// A whole fuzz input. Decoded densely: three setting bytes, then ops until
/// the bytes run out (at most 1000), so every byte of a random input is used.
#[derive(Debug)]
pub struct FuzzInput {
    /// Index into [`FUZZ_CONFIGS`].
    pub conf: u8,
    /// Capacity: (x + 2) x 2 MiB, or unlimited.
    pub capacity: Option<u8>,
    /// Block slots: 2 + x.
    pub slots: u8,
    /// The operations.
    pub ops: Vec<FuzzOp>,
}

impl<'a> Arbitrary<'a> for FuzzInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let conf = u8::arbitrary(u)?;
        let capacity = Option::<u8>::arbitrary(u)?;
        let slots = u8::arbitrary(u)?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < 1000 {
            ops.push(FuzzOp::arbitrary(u)?);
        }
        Ok(FuzzInput {
            conf,
            capacity,
            slots,
            ops,
        })
    }
}

struct Live {
    alloc: Allocation,
    stream: u64,
    /// Streams recorded on it besides its own.
    uses: BTreeSet<u64>,
    /// Those recorded during a capture.
    capture_uses: BTreeSet<u64>,
    /// IPC shares not yet released.
    shares: u32,
    /// Freed by its owner while shared: held until the last release.
    held: bool,
}

/// A range freed while other streams used it: pending until a sync covers
/// every one of them.
struct Pending {
    size: u64,
    streams: BTreeSet<u64>,
    /// Streams recorded during a capture: done when no capture is left.
    capture_streams: BTreeSet<u64>,
}

/// A range freed on `stream`: until that stream is synchronized, another
/// stream may use it only after waiting for it on the device (a
/// `stream_wait_event` logged after the free). `waits` and `syncs` are the
/// lengths of the mock's logs at the free.
#[derive(Clone, Copy)]
struct Released {
    size: u64,
    stream: u64,
    waits: usize,
    syncs: usize,
}

/// Whether work queued on `stream` from now on runs after the work of the
/// stream that freed `r`, up to the free: some chain of device-side waits
/// since the free leads from `r`'s stream to `stream` (waits are logged in
/// order, a later wait sees what an earlier one made its stream wait for),
/// or the host waited for a stream on such a chain.
fn ordered_after(r: Released, stream: u64, waits: &[(u64, u64)], syncs: &[u64]) -> bool {
    let mut seen = vec![r.stream];
    for &(waiter, on) in &waits[r.waits..] {
        if seen.contains(&on) && !seen.contains(&waiter) {
            seen.push(waiter);
        }
    }
    seen.contains(&stream) || syncs[r.syncs..].iter().any(|s| seen.contains(s))
}

/// The shadow model: live allocations and pending ranges, by address; the
/// routing list and the pool of every segment seen.
struct Shadow {
    live: BTreeMap<u64, Live>,
    pending: BTreeMap<u64, Pending>,
    released: BTreeMap<u64, Released>,
    freed: Vec<BlockId>,
    /// (pool, streams mask, capture), newest last.
    routes: Vec<(MempoolId, u8, bool)>,
    /// The simulated device's captures begun for each capture route (as
    /// the runtime begins capturing after `capture_begin`): its streams.
    device_captures: Vec<(MempoolId, Vec<u64>)>,
    /// Segment base -> the pool its blocks were handed to.
    segment_pool: BTreeMap<u64, MempoolId>,
}

impl Shadow {
    fn nth(&self, which: u16) -> Option<u64> {
        if self.live.is_empty() {
            return None;
        }
        self.live
            .keys()
            .nth(which as usize % self.live.len())
            .copied()
    }

    fn insert(&mut self, a: Allocation, requested: u64, stream: u64) {
        assert!(
            a.size >= requested && a.size.is_multiple_of(512) && a.ptr.0.is_multiple_of(512),
            "bad block for {requested}: {a:?}"
        );
        for (&p, pe) in self.pending.range(..a.ptr.0 + a.size) {
            assert!(
                p + pe.size <= a.ptr.0,
                "overlaps memory freed at {p:#x} that streams {:?} may still use: {a:?}",
                pe.streams
            );
        }
        if let Some((&p, l)) = self.live.range(..a.ptr.0).next_back() {
            assert!(
                p + l.alloc.size <= a.ptr.0,
                "overlaps the allocation below: {a:?}"
            );
        }
        if let Some((&p, _)) = self.live.range(a.ptr.0..).next() {
            assert!(
                a.ptr.0 + a.size <= p,
                "overlaps the allocation above: {a:?}"
            );
        }
        self.live.insert(
            a.ptr.0,
            Live {
                alloc: a,
                stream,
                uses: BTreeSet::new(),
                capture_uses: BTreeSet::new(),
                shares: 0,
                held: false,
            },
        );
    }

    /// The pool a request on `stream` must come from: the newest routing
    /// that takes it, else the default pools.
    fn route(&self, stream: u64) -> MempoolId {
        self.routes
            .iter()
            .rev()
            .find(|r| r.1 == 0 || r.1 & (1 << stream) != 0)
            .map_or(MempoolId::DEFAULT, |r| r.0)
    }

    fn capturing(&self) -> bool {
        self.routes.iter().any(|r| r.2)
    }

    /// The runtime begins capturing the streams of capture `id` (an
    /// all-streams capture: a stream of its own) on the simulated device,
    /// those not captured already; from now on the device refuses what the
    /// driver refuses during a capture.
    fn begin_device_capture(&mut self, a: &mut FuzzAllocator, id: MempoolId, streams: &[u64]) {
        let all = [CAPTURE_STREAM];
        let streams = if streams.is_empty() {
            &all[..]
        } else {
            streams
        };
        let mut begun = Vec::new();
        for &s in streams {
            if !a.backend().is_capturing(s) {
                a.backend_mut()
                    .begin_capture(s, CaptureMode::Global)
                    .expect("begin capture");
                begun.push(s);
            }
        }
        self.device_captures.push((id, begun));
    }

    /// The runtime ends the device captures of `id`: none may have been
    /// invalidated by a call the allocator made meanwhile.
    fn end_device_capture(&mut self, a: &mut FuzzAllocator, id: MempoolId) {
        let Some(k) = self.device_captures.iter().position(|c| c.0 == id) else {
            return;
        };
        let (_, streams) = self.device_captures.remove(k);
        for s in streams {
            if let Err(e) = a.backend_mut().end_capture(s) {
                panic!("the capture of stream {s} into {id:?}: {e}");
            }
        }
    }

    /// No capture is left: streams recorded during one are done.
    fn captures_over(&mut self) {
        self.pending.retain(|_, pe| {
            for s in &pe.capture_streams {
                pe.streams.remove(s);
            }
            pe.capture_streams.clear();
            !pe.streams.is_empty()
        });
    }

    /// The allocation at `p` was freed: pending if other streams used it;
    /// released by its stream (`logs`: the lengths of the mock's wait and
    /// sync logs now).
    fn free(&mut self, p: u64, logs: (usize, usize)) {
        if let Some(l) = self.live.remove(&p) {
            self.freed.push(l.alloc.handle.expect("handle"));
            self.released.insert(
                p,
                Released {
                    size: l.alloc.size,
                    stream: l.stream,
                    waits: logs.0,
                    syncs: logs.1,
                },
            );
            if !l.uses.is_empty() {
                self.pending.insert(
                    p,
                    Pending {
                        size: l.alloc.size,
                        streams: l.uses,
                        capture_streams: l.capture_uses,
                    },
                );
            }
        }
    }

    /// The host waited for `stream` (all streams when `None`).
    fn sync(&mut self, stream: Option<u64>) {
        match stream {
            None => {
                self.pending.clear();
                self.released.clear();
            }
            Some(s) => {
                self.pending.retain(|_, pe| {
                    pe.streams.remove(&s);
                    !pe.streams.is_empty()
                });
                self.released.retain(|_, r| r.stream != s);
            }
        }
    }

    /// A fresh allocation `a` on `stream` may take memory another stream
    /// freed only once that stream was synchronized or `stream` waited for
    /// it on the device since the free (the compact policy's hand-over; the
    /// mock's logs say which). The ranges it takes are forgotten.
    fn check_reuse(&mut self, a: &Allocation, stream: u64, waits: &[(u64, u64)], syncs: &[u64]) {
        let (lo, hi) = (a.ptr.0, a.ptr.0 + a.size);
        let overlapping: Vec<(u64, Released)> = self
            .released
            .range(..hi)
            .filter(|(&p, r)| p + r.size > lo)
            .map(|(&p, &r)| (p, r))
            .collect();
        for (p, r) in overlapping {
            assert!(
                r.stream == stream || ordered_after(r, stream, waits, syncs),
                "{a:?} on stream {stream} takes memory freed on stream {} at {p:#x} with no wait for it",
                r.stream
            );
            self.released.remove(&p);
            if p < lo {
                self.released.insert(p, Released { size: lo - p, ..r });
            }
            if p + r.size > hi {
                self.released.insert(
                    hi,
                    Released {
                        size: p + r.size - hi,
                        ..r
                    },
                );
            }
        }
    }

    /// After an operation that waited for every pending event
    /// (`num_sync_all_streams` grew): after a success nothing is pending.
    /// After a failure part-way, which events were waited for cannot be
    /// told from outside (a range may have had some of its streams' events
    /// waited for and not others), so the shadow forgets the pending ranges
    /// rather than guess.
    fn synchronized_all(&mut self) {
        self.pending.clear();
    }
}

/// What a run exercised (the stable test sums and checks these).
#[derive(Clone, Copy, Debug, Default)]
pub struct Coverage {
    /// Inputs run.
    pub inputs: u64,
    /// Operations run.
    pub ops: u64,
    /// Successful allocations.
    pub allocs: u64,
    /// Successful frees.
    pub frees: u64,
    /// Out-of-memory errors.
    pub ooms: u64,
    /// Injected backend failures that surfaced.
    pub injected: u64,
    /// Metadata-exhausted errors.
    pub exhausted: u64,
    /// Full event queue / stream-use table errors.
    pub full_queues: u64,
    /// Interior-pointer and double-free errors.
    pub bad_frees: u64,
    /// Allocations made while some freed range was still pending.
    pub while_pending: u64,
    /// Allocations made in a private pool.
    pub pool_allocs: u64,
    /// IPC shares taken.
    pub shares: u64,
    /// Frees held for a share, later freed by its release.
    pub held_frees: u64,
    /// Allocations at an alignment above 512 bytes.
    pub aligned: u64,
    /// Requests refused for a bad alignment.
    pub bad_alignments: u64,
    /// Allocations at an address (`malloc_with_address`) served.
    pub at_address: u64,
    /// Allocations in a pool with a segment source.
    pub source_allocs: u64,
}

impl Coverage {
    /// Add another run's counts.
    pub fn add(&mut self, o: Coverage) {
        self.inputs += o.inputs;
        self.ops += o.ops;
        self.allocs += o.allocs;
        self.frees += o.frees;
        self.ooms += o.ooms;
        self.injected += o.injected;
        self.exhausted += o.exhausted;
        self.full_queues += o.full_queues;
        self.bad_frees += o.bad_frees;
        self.while_pending += o.while_pending;
        self.pool_allocs += o.pool_allocs;
        self.at_address += o.at_address;
        self.source_allocs += o.source_allocs;
        self.shares += o.shares;
        self.held_frees += o.held_frees;
        self.aligned += o.aligned;
        self.bad_alignments += o.bad_alignments;
    }
}

/// What `run` is checking for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Ops,
    NoFalseOom,
}

fn injected(e: &Error<MockError>) -> bool {
    matches!(e, Error::Backend(MockError::Injected { .. }))
}

/// After an OOM from the full ladder: no releasable cached whole segment is
/// left (of the default pools, or of a pool nobody uses), and the device (or
/// the limit) really cannot supply the segment. While a capture is under
/// way no rung gives memory back (it would invalidate the capture): nothing
/// is checked there. With expandable segments the flush unmapped every free
/// page, and wherever the request goes it maps at most its size in whole
/// pages (a new reservation maps exactly that): the device must lack them.
fn assert_true_oom(a: &FuzzAllocator, capacity: Option<u64>, r: &OomReport, in_capture: bool) {
    if source_refused() {
        // A pool's own allocator ran out: not the device.
        return;
    }
    let alloc_size = r.alloc_size;
    let needed = if a.config().maps_pages() {
        let page = if r.rounded <= 1 << 20 || a.config().compact() {
            2 << 20
        } else {
            20 << 20
        };
        r.rounded.div_ceil(page) * page
    } else {
        alloc_size
    };
    if in_capture {
        return;
    }
    let releasable = |id: MempoolId| id.is_default() || a.pool_use_count(id) == 0;
    for seg in a.segments().filter(|s| releasable(s.pool_id)) {
        assert!(
            seg.blocks().any(|b| b.state != BlockState::Inactive),
            "OOM while a whole cached segment of {} bytes could have been released",
            seg.total_size
        );
    }
    let held = a.backend().held_bytes();
    let device_full = capacity.is_some_and(|c| held + needed > c);
    let limit_hit = a
        .memory_limit()
        .is_some_and(|l| a.stats().reserved_bytes.all().current as u64 + alloc_size > l);
    assert!(
        device_full || limit_hit,
        "false OOM: {held} bytes held, segment of {alloc_size}, capacity {capacity:?}, limit {:?}",
        a.memory_limit()
    );
}

/// Run one input. With `CACHEALLOC_FUZZ_DEBUG` set, every op is printed
/// with the hand-overs, device-side waits, stream synchronizations and
/// routes so far (for reading a crash input).
fn run(data: &[u8], mode: Mode) -> Coverage {
    SOURCE.set(SourceState {
        live: 0,
        next: SOURCE_BASE,
        refused: false,
    });
    let mut cov = Coverage {
        inputs: 1,
        ..Coverage::default()
    };
    let mut u = Unstructured::new(data);
    let Ok(input) = FuzzInput::arbitrary(&mut u) else {
        return cov;
    };
    let conf = FUZZ_CONFIGS[input.conf as usize % FUZZ_CONFIGS.len()];
    let config = Config::parse(conf).unwrap_or(Config::DEFAULT);
    let mut capacity = input.capacity.map(|x| (x as u64 + 2) * 2 * MIB);
    if mode == Mode::NoFalseOom && capacity.is_none() {
        capacity = Some(64 * MIB);
    }
    let slots = 2 + input.slots as usize;
    let machine = MockMachine::new();
    let mut a: FuzzAllocator = DeviceAllocator::with_events(
        MockDevice::new(capacity).with_machine(&machine),
        vec![BlockSlot::VACANT; slots].into_boxed_slice(),
        config,
    );
    let mut shadow = Shadow {
        live: BTreeMap::new(),
        pending: BTreeMap::new(),
        released: BTreeMap::new(),
        freed: Vec::new(),
        routes: Vec::new(),
        device_captures: Vec::new(),
        segment_pool: BTreeMap::new(),
    };
    let debug = std::env::var_os("CACHEALLOC_FUZZ_DEBUG").is_some();
    if debug {
        eprintln!("conf {conf:?} capacity {capacity:?} slots {slots}");
    }
    for (n, op) in input.ops.iter().enumerate() {
        if debug {
            eprintln!(
                "op {n}: {op:?}  [handovers {} waits {:?} syncs {:?} routes {:?}]",
                a.stream_handovers(),
                a.backend().stream_waits(),
                a.backend().stream_synchronizations(),
                shadow.routes
            );
        }
        let calls_before = a.backend().counters().total;
        let syncs = a.stats().num_sync_all_streams;
        let stream_syncs = a.backend().stream_synchronizations().len();
        step(&mut a, &mut shadow, *op, mode, capacity, &mut cov);
        if a.stats().num_sync_all_streams > syncs {
            shadow.synchronized_all();
        }
        // Unmapping pages waits for the segment's stream first.
        for &s in &a.backend().stream_synchronizations()[stream_syncs..] {
            shadow.sync(Some(s));
        }
        cov.ops += 1;
        if let Err(v) = a.check_invariants() {
            panic!("after op {n} {op:?} (calls {calls_before}..): {v}");
        }
        assert_eq!(
            a.live_allocations() as usize,
            shadow.live.len(),
            "after op {n} {op:?}: live allocations"
        );
    }
    for k in 0..3 {
        let id = pool_id(k);
        shadow.end_device_capture(&mut a, id);
        let _ = a.end_allocate_to_pool(id);
        while a.pool_use_count(id) > 0 {
            a.release_pool(id).expect("release of a pool in use");
        }
    }
    // The consumers are done: held allocations are freed by their last
    // release.
    a.backend_mut().clear_faults();
    let shared: Vec<(u64, u32, bool)> = shadow
        .live
        .iter()
        .map(|(&p, l)| (p, l.shares, l.held))
        .collect();
    for (p, shares, held) in shared {
        for _ in 0..shares {
            a.release_ipc_share(DevicePtr(p))
                .unwrap_or_else(|e| panic!("release of a share at teardown: {e}"));
        }
        if held {
            shadow.live.remove(&p);
        }
    }
    let live: Vec<DevicePtr> = shadow.live.keys().map(|&p| DevicePtr(p)).collect();
    if let Err(e) = teardown(&mut a, live) {
        panic!("teardown: {e}");
    }
    assert_eq!(
        fuzz_source_live(),
        0,
        "leak: bytes of a pool's source not given back"
    );
    cov
}

fn step(
    a: &mut FuzzAllocator,
    sh: &mut Shadow,
    op: FuzzOp,
    mode: Mode,
    capacity: Option<u64>,
    cov: &mut Coverage,
) {
    match op {
        FuzzOp::Alloc { size, stream }
        | FuzzOp::AllocNoRetry { size, stream }
        | FuzzOp::AllocAligned { size, stream, .. } => {
            let no_retry = matches!(op, FuzzOp::AllocNoRetry { .. });
            let bytes = size.bytes();
            let stream = stream as u64 % 3;
            let flags = if no_retry {
                MallocFlags::NO_RETRY
            } else {
                MallocFlags::empty()
            };
            let syncs = a.stats().num_sync_all_streams;
            let align = match op {
                FuzzOp::AllocAligned { log2: 250.., .. } => {
                    [0, 3, 768, 3 << 20][bytes as usize % 4]
                }
                FuzzOp::AllocAligned { log2, .. } => 1u64 << (log2 % 23),
                _ => 1,
            };
            let r = if matches!(op, FuzzOp::AllocAligned { .. }) {
                a.malloc_aligned(bytes, align, stream, flags)
            } else {
                a.malloc_with(bytes, stream, flags)
            };
            match r {
                Err(Error::BadAlignment { alignment }) => {
                    assert!(!alignment.is_power_of_two() && alignment == align);
                    cov.bad_alignments += 1;
                }
                // A request routed to a no_split pool.
                Err(Error::Unsupported { what, .. }) if align > 512 => {
                    assert!(what.contains("never splits"), "{what}");
                }
                Ok(x) if bytes == 0 => assert!(x.ptr.is_null() && x.handle.is_none()),
                Ok(x) => {
                    assert_eq!(x.ptr.0 % align, 0, "{x:?} not aligned to {align}");
                    cov.aligned += (align > 512) as u64;
                    if a.stats().num_sync_all_streams > syncs {
                        // The ladder waited for every event before this.
                        sh.synchronized_all();
                    }
                    let info = a
                        .allocation_info(x.handle.expect("handle"))
                        .expect("info of a fresh allocation");
                    assert_eq!(
                        (info.requested_size, info.size, info.stream),
                        (bytes, x.size, stream)
                    );
                    check_pool(a, sh, x.ptr, info.pool, stream);
                    cov.pool_allocs += !info.pool.is_default() as u64;
                    cov.source_allocs +=
                        a.pool_info(info.pool).is_some_and(|p| p.has_source) as u64;
                    cov.while_pending += !sh.pending.is_empty() as u64;
                    sh.insert(x, bytes, stream);
                    let m = a.backend();
                    sh.check_reuse(&x, stream, m.stream_waits(), m.stream_synchronizations());
                    cov.allocs += 1;
                }
                Err(Error::TooLarge { .. }) => assert!(bytes >= 1 << 60 || align > 512),
                Err(Error::SizeOverflow { .. }) if align > 512 => {}
                Err(Error::OutOfMemory(r)) => {
                    cov.ooms += 1;
                    assert!(bytes < 1 << 60);
                    if mode == Mode::NoFalseOom && !no_retry {
                        // No rung gives memory back while any capture is
                        // under way on the device.
                        assert_true_oom(a, capacity, &r, sh.capturing());
                    }
                }
                Err(Error::MetadataExhausted { .. }) => cov.exhausted += 1,
                Err(e) if injected(&e) => cov.injected += 1,
                Err(e) => panic!("malloc({bytes}): {e}"),
            }
        }
        FuzzOp::AllocAt {
            size,
            stream,
            seg,
            offset,
        } => {
            let bytes = size.bytes();
            let stream = stream as u64 % 3;
            let segs: Vec<(u64, u64)> = a.segments().map(|s| (s.address.0, s.total_size)).collect();
            let Some(&(base, total)) = segs.get(seg as usize % segs.len().max(1)) else {
                return;
            };
            let at = DevicePtr(base + (offset as u64 * 512) % total);
            match a.malloc_with_address(bytes, at, stream) {
                Ok(x) if bytes == 0 => assert!(x.ptr.is_null() && x.handle.is_none()),
                Ok(x) => {
                    assert_eq!(x.ptr, at, "not at the address asked for");
                    let info = a
                        .allocation_info(x.handle.expect("handle"))
                        .expect("info of a fresh allocation");
                    assert_eq!((info.requested_size, info.stream), (bytes, stream));
                    check_pool(a, sh, x.ptr, info.pool, stream);
                    cov.at_address += 1;
                    sh.insert(x, bytes, stream);
                    let m = a.backend();
                    sh.check_reuse(&x, stream, m.stream_waits(), m.stream_synchronizations());
                    cov.allocs += 1;
                }
                Err(Error::NoFreeBlockAt { ptr, .. }) => assert_eq!(ptr, at),
                Err(Error::TooLarge { .. }) => assert!(bytes >= 1 << 60),
                Err(Error::MetadataExhausted { .. }) => cov.exhausted += 1,
                Err(e) if injected(&e) => cov.injected += 1,
                Err(e) => panic!("malloc_with_address({bytes}, {at}): {e}"),
            }
        }
        FuzzOp::Free { which } | FuzzOp::FreePtr { which, .. } => {
            let Some(p) = sh.nth(which) else { return };
            let l = &sh.live[&p];
            let (id, size) = (l.alloc.handle.expect("handle"), l.alloc.size);
            let (shares, held) = (l.shares, l.held);
            let offset = match op {
                FuzzOp::FreePtr { offset, .. } => offset as u64 % size,
                _ => 0,
            };
            let r = if offset > 0 {
                a.free_ptr(DevicePtr(p + offset))
            } else if matches!(op, FuzzOp::FreePtr { .. }) {
                a.free_ptr(DevicePtr(p))
            } else {
                a.free(id)
            };
            match r {
                Ok(()) if shares > 0 => {
                    assert!(offset == 0 && !held, "a free of a held block succeeded");
                    sh.live.get_mut(&p).expect("live").held = true;
                    cov.held_frees += 1;
                }
                Err(Error::NotAllocated { ptr }) if held => {
                    assert_eq!(ptr, DevicePtr(p));
                    cov.bad_frees += 1;
                }
                Ok(()) => {
                    assert_eq!(offset, 0, "freeing an interior pointer succeeded");
                    let m = a.backend();
                    sh.free(
                        p,
                        (m.stream_waits().len(), m.stream_synchronizations().len()),
                    );
                    cov.frees += 1;
                }
                Err(Error::InteriorPointer { base, .. }) => {
                    assert!(offset > 0 && base == DevicePtr(p));
                    cov.bad_frees += 1;
                }
                Err(e @ (Error::EventQueueFull { .. } | Error::Backend(_))) => {
                    assert!(
                        matches!(e, Error::EventQueueFull { .. }) || injected(&e),
                        "{e}"
                    );
                    if injected(&e) {
                        cov.injected += 1;
                    } else {
                        cov.full_queues += 1;
                    }
                    // The allocation must still be live and untouched.
                    assert_eq!(a.allocation_info(id).map(|i| i.ptr), Ok(DevicePtr(p)));
                }
                Err(e) => panic!("free: {e}"),
            }
        }
        FuzzOp::DoubleFree { which } => {
            if sh.freed.is_empty() {
                return;
            }
            let id = sh.freed[which as usize % sh.freed.len()];
            match a.free(id) {
                Err(Error::StaleHandle { .. }) => cov.bad_frees += 1,
                other => panic!("double free gave {other:?}"),
            }
        }
        FuzzOp::RecordStream { which, stream } => {
            let Some(p) = sh.nth(which) else { return };
            let id = sh.live[&p].alloc.handle.expect("handle");
            let stream = stream as u64 % 3;
            let held = sh.live[&p].held;
            match a.record_stream(id, stream) {
                Err(Error::NotAllocated { .. }) if held => cov.bad_frees += 1,
                Ok(()) => {
                    assert!(!held, "record_stream of a held block");
                    let capturing = sh.capturing();
                    let l = sh.live.get_mut(&p).expect("live");
                    if stream != l.stream {
                        l.uses.insert(stream);
                        if capturing {
                            l.capture_uses.insert(stream);
                        }
                    }
                }
                Err(Error::StreamUsesFull { .. }) => cov.full_queues += 1,
                Err(e) => panic!("record_stream: {e}"),
            }
        }
        FuzzOp::Sync { stream } => {
            let stream = stream.map(|s| s as u64 % 3);
            a.backend_mut().sync(stream);
            sh.sync(stream);
        }
        FuzzOp::EmptyCache => match a.empty_cache() {
            Ok(()) => {}
            Err(e) if injected(&e) => cov.injected += 1,
            // Unmapping the middle of a free expandable block leaves a
            // cached piece on each side: two slots.
            Err(Error::MetadataExhausted { .. }) if a.config().maps_pages() => cov.exhausted += 1,
            Err(e) => panic!("empty_cache: {e}"),
        },
        FuzzOp::SetLimit { mib } => match mib {
            Some(m) => a.set_memory_limit(m as u64 * MIB),
            None => a.clear_memory_limit(),
        },
        FuzzOp::InjectFailure { after } => {
            if mode == Mode::Ops {
                a.backend_mut().fail_call(after as u64 % 8);
            }
        }
        FuzzOp::ResetPeak => a.reset_peak_stats(),
        FuzzOp::PoolCreate {
            pool,
            use_on_oom,
            no_split,
            source,
        } => {
            let mut o = PoolOptions::NONE;
            if use_on_oom {
                o = o.use_on_oom();
            }
            if no_split {
                o = o.no_split();
            }
            if source {
                pool_result(a.create_pool_with_source(pool_id(pool), o, fuzz_source()));
            } else {
                pool_result(a.create_pool(pool_id(pool), o));
            }
        }
        FuzzOp::PoolBegin {
            pool,
            streams,
            capture,
        } => {
            let mask = streams & 7;
            let list: Vec<u64> = (0..3).filter(|s| mask & (1 << s) != 0).collect();
            let filter = if mask == 0 {
                StreamFilter::All
            } else {
                StreamFilter::streams(&list).expect("1 to 3 streams")
            };
            let id = pool_id(pool);
            let r = if capture {
                a.capture_begin(id, filter)
            } else {
                a.begin_allocate_to_pool(id, filter)
            };
            if r.is_ok() {
                sh.routes.push((id, mask, capture));
                if capture {
                    sh.begin_device_capture(a, id, &list);
                }
            }
            pool_result(r);
        }
        FuzzOp::PoolEnd { pool } => {
            let id = pool_id(pool);
            sh.end_device_capture(a, id);
            if a.end_allocate_to_pool(id).is_ok() {
                sh.routes.retain(|r| r.0 != id);
                if !sh.capturing() {
                    sh.captures_over();
                }
            }
        }
        FuzzOp::Share { which } => {
            let Some(p) = sh.nth(which) else { return };
            let l = sh.live.get_mut(&p).expect("live");
            match a.share_ipc_handle(DevicePtr(p)) {
                Ok(_) => {
                    assert!(!l.held, "a held block was shared again");
                    l.shares += 1;
                    cov.shares += 1;
                }
                Err(Error::NotAllocated { .. }) => assert!(l.held),
                // Blocks of expandable segments, and of pools with a
                // segment source, are not shared as handles.
                Err(
                    Error::Unsupported { .. }
                    | Error::IpcNotShareable { .. }
                    | Error::IpcSharesFull { .. },
                ) => {}
                Err(e) => panic!("share: {e}"),
            }
        }
        FuzzOp::ReleaseShare { which } => {
            let Some(p) = sh.nth(which) else { return };
            let (shares, held) = (sh.live[&p].shares, sh.live[&p].held);
            match a.release_ipc_share(DevicePtr(p)) {
                Ok(()) => {
                    assert!(shares > 0, "release of a block never shared");
                    let l = sh.live.get_mut(&p).expect("live");
                    l.shares -= 1;
                    if l.shares == 0 && held {
                        let m = a.backend();
                        let logs = (m.stream_waits().len(), m.stream_synchronizations().len());
                        sh.free(p, logs);
                        cov.frees += 1;
                    }
                }
                Err(Error::IpcNotShared { .. }) => assert_eq!(shares, 0),
                // The held block's free failed: it stays held and shared.
                Err(e @ (Error::EventQueueFull { .. } | Error::Backend(_))) => {
                    assert!(shares == 1 && held, "{e}");
                    if injected(&e) {
                        cov.injected += 1;
                    } else {
                        cov.full_queues += 1;
                    }
                }
                Err(e) => panic!("release_ipc_share: {e}"),
            }
        }
        FuzzOp::PoolRelease { pool } => pool_result(a.release_pool(pool_id(pool))),
        FuzzOp::PoolEmptyCache { pool } => match a.empty_cache_pool(pool_id(pool)) {
            Ok(()) => {}
            Err(e) if injected(&e) => cov.injected += 1,
            Err(Error::MetadataExhausted { .. }) if a.config().maps_pages() => cov.exhausted += 1,
            Err(e) => panic!("empty_cache_pool: {e}"),
        },
    }
}

/// A pool call fails only for a reason of the pool rules.
fn pool_result(r: Result<(), Error<MockError>>) {
    match r {
        Ok(())
        | Err(
            Error::UnknownPool { .. }
            | Error::AlreadyRouting { .. }
            | Error::NotRouting { .. }
            | Error::PoolFreeable { .. }
            | Error::PoolExists { .. }
            | Error::PoolTableFull { .. },
        ) => {}
        Err(e) => panic!("pool call: {e}"),
    }
}

/// A fresh allocation at `ptr` in pool `pool`, on `stream`: it comes from
/// the pool the newest matching routing names (or, for a default request,
/// from a `use_on_oom` pool), and its segment was never handed to another
/// pool.
fn check_pool(a: &FuzzAllocator, sh: &mut Shadow, ptr: DevicePtr, pool: MempoolId, stream: u64) {
    let want = sh.route(stream);
    assert!(
        pool == want
            || (want.is_default() && a.pool_info(pool).is_some_and(|p| p.options.use_on_oom)),
        "an allocation on stream {stream} came from pool {pool:?}, the routing names {want:?}"
    );
    let base = match a.base_allocation(ptr) {
        Ok((base, _)) => base,
        // An expandable segment is never shared, so it has no base to give;
        // the checker proves its blocks are all of its pool.
        Err(Error::Unsupported { .. }) => return,
        Err(e) => panic!("a segment holds it: {e}"),
    };
    if let Some(&before) = sh.segment_pool.get(&base.0) {
        assert_eq!(
            before, pool,
            "segment {base} of pool {before:?} handed to pool {pool:?}"
        );
    }
    sh.segment_pool.insert(base.0, pool);
}

/// The `ops` target.
pub fn ops(data: &[u8]) -> Coverage {
    run(data, Mode::Ops)
}

/// The `no_false_oom` target.
pub fn no_false_oom(data: &[u8]) -> Coverage {
    run(data, Mode::NoFalseOom)
}

/// The `conf` target: never panics; what parses, prints and parses back equal.
pub fn conf(data: &[u8]) -> Coverage {
    let text = String::from_utf8_lossy(data);
    match Config::parse(&text) {
        Ok(c) => {
            let printed = c.to_string();
            match Config::parse(&printed) {
                Ok(back) => assert_eq!(back, c, "{text:?} printed as {printed:?}"),
                Err(e) => panic!("{text:?} printed as {printed:?}, which does not parse: {e}"),
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    Coverage {
        inputs: 1,
        ..Coverage::default()
    }
}
