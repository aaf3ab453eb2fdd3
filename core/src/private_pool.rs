//! Private pools (PyTorch's `PrivatePool`): the pools behind CUDA-graph
//! capture and `torch.cuda.MemPool`. Each has its own small and large free
//! index, a use count and a count of its segments; requests are routed to
//! one by a list of (pool, stream filter) entries, the newest matching entry
//! first. The table has a fixed capacity `P` (a const generic of the
//! allocator); a block names its pool by a one-byte owner number: 0 is the
//! default pools, `k + 1` the table's entry `k`.

use crate::arena::BlockSlot;
use crate::backend::DevicePtr;
use crate::invariants::{expect, InvariantViolation};
use crate::pool::{BlockPool, Pool, Pools};
use crate::stats::StatArray;

/// A pool's id: PyTorch's `MempoolId_t`, a pair. `(0, 0)` names the default
/// pools; graphs make `(n, 0)`, `MemPool()` makes `(0, n)`; only identity
/// matters here.
///
/// ```
/// use cachealloc_core::MempoolId;
/// assert!(MempoolId::DEFAULT.is_default());
/// assert!(!MempoolId(0, 1).is_default());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MempoolId(pub u64, pub u64);

impl MempoolId {
    /// The default pools.
    pub const DEFAULT: MempoolId = MempoolId(0, 0);

    /// Whether this names the default pools.
    pub const fn is_default(self) -> bool {
        self.0 == 0 && self.1 == 0
    }
}

/// Options of a pool made with [`create_pool`](crate::DeviceAllocator::create_pool)
/// (`torch.cuda.MemPool(use_on_oom=..., no_split=...)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolOptions {
    /// A default-pool request that fails may take a free block of this pool
    /// (never a new segment) before the cache is flushed.
    pub use_on_oom: bool,
    /// Blocks of this pool are never split: every allocation takes a whole
    /// free block.
    pub no_split: bool,
}

impl PoolOptions {
    /// No option.
    pub const NONE: PoolOptions = PoolOptions {
        use_on_oom: false,
        no_split: false,
    };

    /// With `use_on_oom`.
    pub const fn use_on_oom(mut self) -> Self {
        self.use_on_oom = true;
        self
    }

    /// With `no_split`.
    pub const fn no_split(mut self) -> Self {
        self.no_split = true;
        self
    }
}

/// Where a private pool's segments come from when not from the device:
/// PyTorch's `torch.cuda.MemPool(allocator=...)`, whose pool calls the
/// given allocator's `raw_alloc` / `raw_delete` instead of `cudaMalloc` /
/// `cudaFree` (NCCL's `ncclMemAlloc` for symmetric memory, a pluggable
/// allocator). Plain function pointers and a context word, so that the
/// pool table holds it by value and the core needs no heap.
///
/// PyTorch's rules for such a pool, which the allocator follows: its
/// segments are never expandable (expandable segments stay the default
/// pools' and plain pools'), so a block is split by the rule of plain
/// segments; everything else (rounding, segment sizes, best fit and the
/// block order of the torch version, `no_split`, the memory fraction,
/// `release_pool` and `empty_cache`) is the same as for any private pool.
///
/// ```
/// use cachealloc_core::{DevicePtr, SegmentSource};
/// fn alloc(ctx: usize, size: u64, _stream: u64) -> Option<DevicePtr> {
///     Some(DevicePtr(ctx as u64 + size)) // the caller's own memory
/// }
/// fn free(_ctx: usize, _ptr: DevicePtr, _size: u64, _stream: u64) {}
/// let source = SegmentSource::new(alloc, free, 1 << 40);
/// assert_eq!((source.alloc)(source.ctx, 512, 0), Some(DevicePtr((1 << 40) + 512)));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SegmentSource {
    /// A new segment of `size` bytes (a multiple of 512) for a request on
    /// `stream`, 512-byte aligned; `None` when it has none (PyTorch: a
    /// `raw_alloc` that returned null, taken as an out-of-memory: the
    /// ladder goes on to its release rungs).
    pub alloc: fn(ctx: usize, size: u64, stream: u64) -> Option<DevicePtr>,
    /// Give back the segment at `ptr` of `size` bytes, made on `stream`
    /// (PyTorch's `raw_delete`; it cannot fail).
    pub free: fn(ctx: usize, ptr: DevicePtr, size: u64, stream: u64),
    /// Called once when the pool is deleted (no segment left): the
    /// context may be dropped.
    pub release: Option<fn(ctx: usize)>,
    /// The caller's word, passed back to each call.
    pub ctx: usize,
}

impl SegmentSource {
    /// A source of these two functions, with no release call.
    pub const fn new(
        alloc: fn(usize, u64, u64) -> Option<DevicePtr>,
        free: fn(usize, DevicePtr, u64, u64),
        ctx: usize,
    ) -> Self {
        SegmentSource {
            alloc,
            free,
            release: None,
            ctx,
        }
    }

    /// With `release` called when the pool is deleted.
    pub const fn with_release(mut self, release: fn(usize)) -> Self {
        self.release = Some(release);
        self
    }
}

/// Which streams a routing to a pool takes (the filter of PyTorch's
/// `beginAllocateToPool`).
///
/// ```
/// use cachealloc_core::StreamFilter;
/// let side: StreamFilter<u64> = StreamFilter::streams(&[1, 3]).unwrap();
/// assert!(side.accepts(3) && !side.accepts(2));
/// assert!(StreamFilter::<u64>::All.accepts(7));
/// static CAPTURING: fn(u64) -> bool = |s| s >= 10;
/// assert!(StreamFilter::With(&CAPTURING).accepts(12));
/// ```
#[derive(Clone, Copy)]
#[non_exhaustive]
pub enum StreamFilter<St: 'static> {
    /// Every stream (`use_mem_pool` in a one-thread program,
    /// `_cuda_beginAllocateToPool`).
    All,
    /// Up to four streams: a capture's stream and the side streams that
    /// joined it (`_cuda_beginAllocateCurrentStreamToPool` takes one).
    Streams {
        /// The streams (the first `len`).
        list: [St; 4],
        /// How many.
        len: u8,
    },
    /// Any predicate: a CUDA graph's "this stream is capturing with my
    /// capture id", a thread filter.
    With(&'static (dyn Fn(St) -> bool + Sync)),
}

impl<St: Copy + PartialEq + 'static> StreamFilter<St> {
    /// One stream.
    pub fn stream(s: St) -> Self {
        StreamFilter::Streams {
            list: [s; 4],
            len: 1,
        }
    }

    /// These streams (1 to 4; `None` otherwise).
    pub fn streams(s: &[St]) -> Option<Self> {
        let first = *s.first()?;
        if s.len() > 4 {
            return None;
        }
        let mut list = [first; 4];
        list[..s.len()].copy_from_slice(s);
        Some(StreamFilter::Streams {
            list,
            len: s.len() as u8,
        })
    }

    /// Whether requests on `stream` are routed.
    #[inline]
    pub fn accepts(&self, stream: St) -> bool {
        match self {
            StreamFilter::All => true,
            StreamFilter::Streams { list, len } => list[..*len as usize].contains(&stream),
            StreamFilter::With(f) => f(stream),
        }
    }
}

impl<St: core::fmt::Debug + 'static> core::fmt::Debug for StreamFilter<St> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StreamFilter::All => f.write_str("All"),
            StreamFilter::Streams { list, len } => f
                .debug_tuple("Streams")
                .field(&&list[..*len as usize])
                .finish(),
            StreamFilter::With(_) => f.write_str("With(..)"),
        }
    }
}

/// What a pool looks like now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolInfo {
    /// Its id.
    pub id: MempoolId,
    /// Live users (graphs, `MemPool` objects, routings); 0: freeable.
    pub use_count: u32,
    /// Its segments (PyTorch's `cudaMalloc_count`).
    pub segments: u32,
    /// Bytes of its segments (PyTorch's
    /// `reserved_bytes_by_private_pools.<id>.all.current`).
    pub reserved_bytes: u64,
    /// Their peak.
    pub peak_reserved_bytes: u64,
    /// Its reserved bytes as torch 2.13's
    /// `reserved_bytes_by_private_pools.<id>` counts them (all, small,
    /// large; current, peak, allocated, freed).
    pub reserved_stats: StatArray,
    /// Its options.
    pub options: PoolOptions,
    /// Its segments come from a [`SegmentSource`] (PyTorch: a `MemPool`
    /// with an allocator of its own).
    pub has_source: bool,
}

/// One private pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PrivatePool {
    pub(crate) id: MempoolId,
    pub(crate) use_count: u32,
    pub(crate) segments: u32,
    /// Bytes of its segments, and their peak.
    pub(crate) reserved: u64,
    pub(crate) peak: u64,
    /// The same as a `StatArray` (torch's `reserved_bytes_by_private_pools`).
    pub(crate) reserved_stats: StatArray,
    pub(crate) options: PoolOptions,
    /// Where its segments come from (`None`: the device).
    pub(crate) source: Option<SegmentSource>,
    pub(crate) blocks: Pools,
}

impl PrivatePool {
    pub(crate) fn info(&self) -> PoolInfo {
        PoolInfo {
            id: self.id,
            use_count: self.use_count,
            segments: self.segments,
            reserved_bytes: self.reserved,
            peak_reserved_bytes: self.peak,
            reserved_stats: self.reserved_stats,
            options: self.options,
            has_source: self.source.is_some(),
        }
    }
}

/// The private pools: `P` entries, each empty or a pool.
pub(crate) struct PoolTable<const P: usize> {
    pools: [Option<PrivatePool>; P],
    /// The reserved-bytes statistics of deleted pools, current 0: the
    /// newest `P`, a ring (torch keeps every one until a reset; the bound
    /// is stated beside the "every key" claim, docs/torch-native.md).
    retired: [Option<(MempoolId, StatArray)>; P],
    /// Where the next deleted pool's statistics go.
    retired_next: usize,
}

impl<const P: usize> PoolTable<P> {
    pub(crate) const fn new() -> Self {
        const { assert!(P < 255, "at most 254 private pools") };
        PoolTable {
            pools: [None; P],
            retired: [None; P],
            retired_next: 0,
        }
    }

    /// The owner number of pool `id`, if it exists.
    pub(crate) fn owner_of(&self, id: MempoolId) -> Option<u8> {
        self.pools
            .iter()
            .position(|p| p.is_some_and(|p| p.id == id))
            .map(|k| k as u8 + 1)
    }

    /// The pool with owner number `owner` (not 0).
    #[inline]
    pub(crate) fn get(&self, owner: u8) -> Option<&PrivatePool> {
        self.pools.get((owner as usize).wrapping_sub(1))?.as_ref()
    }

    /// The pool with owner number `owner`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, owner: u8) -> Option<&mut PrivatePool> {
        self.pools
            .get_mut((owner as usize).wrapping_sub(1))?
            .as_mut()
    }

    /// A new pool with `use_count` 1 in a free entry; its owner number.
    pub(crate) fn create(
        &mut self,
        id: MempoolId,
        options: PoolOptions,
        source: Option<SegmentSource>,
    ) -> Option<u8> {
        let k = self.pools.iter().position(Option::is_none)?;
        // A pool made again under a deleted one's id reports its own figures.
        for r in self.retired.iter_mut() {
            if r.is_some_and(|(rid, _)| rid == id) {
                *r = None;
            }
        }
        self.pools[k] = Some(PrivatePool {
            id,
            use_count: 1,
            segments: 0,
            reserved: 0,
            peak: 0,
            reserved_stats: StatArray::ZERO,
            options,
            source,
            blocks: Pools::EMPTY,
        });
        Some(k as u8 + 1)
    }

    /// Forget pool `owner` (it has no segment left); its segment source,
    /// if any, is told.
    pub(crate) fn delete(&mut self, owner: u8) {
        if let Some(p) = self.pools.get_mut((owner as usize).wrapping_sub(1)) {
            if let Some(pool) = p.take() {
                if let Some(SegmentSource {
                    release: Some(release),
                    ctx,
                    ..
                }) = pool.source
                {
                    crate::sync::in_callback(|| release(ctx));
                }
                let mut stats = pool.reserved_stats;
                for s in stats.0.iter_mut() {
                    s.current = 0;
                }
                if P > 0 {
                    self.retired[self.retired_next % P] = Some((pool.id, stats));
                    self.retired_next = (self.retired_next + 1) % P;
                }
            }
        }
    }

    /// Every pool's reserved-bytes statistics, the live pools' then the
    /// deleted ones kept (torch's `reserved_bytes_by_private_pools`).
    pub(crate) fn reserved_stats(&self) -> impl Iterator<Item = (MempoolId, StatArray)> + '_ {
        self.iter()
            .map(|(_, p)| (p.id, p.reserved_stats))
            .chain(self.retired.iter().flatten().copied())
    }

    /// `reset_peak_memory_stats` and `reset_accumulated_memory_stats` of the
    /// pools' statistics.
    pub(crate) fn reset_stats(&mut self, peak: bool, accumulated: bool) {
        let live = self
            .pools
            .iter_mut()
            .flatten()
            .map(|p| &mut p.reserved_stats);
        let retired = self.retired.iter_mut().flatten().map(|(_, s)| s);
        for s in live.chain(retired) {
            if peak {
                s.reset_peak();
            }
            if accumulated {
                s.reset_accumulated();
            }
        }
    }

    /// Owner numbers and pools, in table order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u8, &PrivatePool)> {
        self.pools
            .iter()
            .enumerate()
            .filter_map(|(k, p)| Some((k as u8 + 1, p.as_ref()?)))
    }

    /// The entries.
    pub(crate) const fn capacity(&self) -> usize {
        P
    }

    /// The entries, as a slice (for snapshots).
    pub(crate) fn entries(&self) -> &[Option<PrivatePool>] {
        &self.pools
    }

    /// Each pool's free indexes are valid; their block counts.
    pub(crate) fn verify(&self, slots: &[BlockSlot], limit: u32) -> Result<(), InvariantViolation> {
        for (_, p) in self.iter() {
            for kind in Pool::ALL {
                p.blocks.get(kind).verify(slots, limit)?;
            }
            expect(
                "private pool: reserved bytes of a pool without segments",
                None,
                0,
                if p.segments == 0 {
                    p.reserved as i64
                } else {
                    0
                },
            )?;
        }
        Ok(())
    }
}

/// The id of owner `owner` in `entries` (0: the default pools).
#[inline]
pub(crate) fn id_of(entries: &[Option<PrivatePool>], owner: u8) -> MempoolId {
    entries
        .get((owner as usize).wrapping_sub(1))
        .and_then(|p| p.as_ref())
        .map_or(MempoolId::DEFAULT, |p| p.id)
}

/// One entry of the routing list: requests on streams `filter` accepts go
/// to pool `owner`; `capture` when a real capture is under way on them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Route<St: 'static> {
    pub(crate) id: MempoolId,
    pub(crate) owner: u8,
    pub(crate) filter: StreamFilter<St>,
    pub(crate) capture: bool,
}

/// The free index of `kind` in owner `owner`'s pools (0: the default pools).
#[inline(always)]
pub(crate) fn block_pool_mut<'a, const P: usize>(
    default: &'a mut Pools,
    table: &'a mut PoolTable<P>,
    owner: u8,
    kind: Pool,
) -> &'a mut BlockPool {
    if owner == 0 {
        return default.get_mut(kind);
    }
    match table.get_mut(owner) {
        Some(p) => p.blocks.get_mut(kind),
        // A block names a pool that exists (the checker proves it); a
        // dangling owner falls back to the default pools rather than panic.
        None => default.get_mut(kind),
    }
}

/// [`block_pool_mut`], shared.
#[inline(always)]
pub(crate) fn block_pool<'a, const P: usize>(
    default: &'a Pools,
    table: &'a PoolTable<P>,
    owner: u8,
    kind: Pool,
) -> &'a BlockPool {
    if owner == 0 {
        return default.get(kind);
    }
    match table.get(owner) {
        Some(p) => p.blocks.get(kind),
        None => default.get(kind),
    }
}
