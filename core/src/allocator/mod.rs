//! [`DeviceAllocator`]: one device's caching allocator, single-threaded
//! (`&mut self`). The policy is PyTorch's `DeviceCachingAllocator`.
//!
//! This file holds the state and the public API; the work is in
//! `malloc.rs` (the allocation ladder), `split.rs` (handing out a block),
//! `free.rs` (frees, merges, end-of-life events), `release.rs` (returning
//! segments to the device: the release rungs, `empty_cache`, garbage
//! collection), `lookup.rs` (handles and pointers to slots) and
//! `invariants.rs` (the checker).

mod capture;
mod checkpoint;
mod compact;
pub use checkpoint::{CheckpointBlock, RestoreCounts};
mod aligned;
mod at_address;
mod construct;
mod counters;
mod drop;
mod expandable;
pub(super) mod fragmentation;
mod free;
mod history;
mod invariants;
mod ipc;
pub use ipc::{needs_peer_copy, ShareableHandle, DEFAULT_IPC_HANDLES, DEFAULT_IPC_SHARES};
mod ipc_pages;
pub use ipc_pages::PagesShare;
mod lookup;
mod malloc;
mod oom_notices;
pub(crate) use oom_notices::OomNotice;
mod pools;
mod registry;
mod release;
mod split;
mod storage;
#[cfg(test)]
mod tests;
mod transitions;

use crate::allocation::{Allocation, AllocationInfo, MallocFlags};
use crate::arena::{Arena, BlockId, BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::config::Config;
use crate::error::Error;
use crate::events::EventQueue;
use crate::history::{History, HistoryStorage, NoHistory, OutOfMemoryObserver, TraceTracker};
use crate::live::LiveIndex;
use crate::oom_cause::OomCause;
use crate::policy;
use crate::pool::{Pool, Pools};
use crate::private_pool::{block_pool, PoolTable, Route};
use crate::segment_index::SegmentIndex;
use crate::segment_table::SegmentRegistry;
use crate::snapshot::{BlockState, CacheInfo, Segments};
use crate::stats::DeviceStats;

/// The event capacity of an allocator made by [`DeviceAllocator::new`].
pub const DEFAULT_EVENTS: usize = 64;

/// The private-pool capacity of an allocator made by [`DeviceAllocator::new`].
pub const DEFAULT_POOLS: usize = 16;

/// Called when no cached block fits, before the allocator asks the device
/// for memory (PyTorch's `FreeMemoryCallback`). It may free allocations
/// through the [`FreeAccess`] it is given; it returns whether it freed
/// anything, and if so the cache is searched again. It keeps its state
/// behind `&self` (atomics, a lock); any `Fn(&mut dyn FreeAccess) -> bool +
/// Sync` closure is one. Register it with
/// [`DeviceAllocator::add_free_memory_callback`], in storage that lives as
/// long as the allocator (a `static`, or `Box::leak` with `std`).
pub trait FreeMemoryCallback: Sync {
    /// Free what can be freed; whether anything was.
    fn free_memory(&self, allocator: &mut dyn FreeAccess) -> bool;
}

impl<F> FreeMemoryCallback for F
where
    F: Fn(&mut dyn FreeAccess) -> bool + Sync,
{
    fn free_memory(&self, allocator: &mut dyn FreeAccess) -> bool {
        self(allocator)
    }
}

/// What a free-memory callback may do with the allocator that calls it.
pub trait FreeAccess {
    /// Free the live allocation starting at `ptr`; whether it was freed.
    fn free_ptr(&mut self, ptr: DevicePtr) -> bool;
    /// Free the live allocation `id`; whether it was freed.
    fn free(&mut self, id: BlockId) -> bool;
}

impl<B, S, const E: usize, H, const P: usize> FreeAccess for DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    fn free_ptr(&mut self, ptr: DevicePtr) -> bool {
        DeviceAllocator::free_ptr(self, ptr).is_ok()
    }
    fn free(&mut self, id: BlockId) -> bool {
        DeviceAllocator::free(self, id).is_ok()
    }
}

/// One device's caching allocator.
///
/// `B` is the device, `S` the block-slot storage (any
/// `AsRef<[BlockSlot]> + AsMut<[BlockSlot]>`), `E` the event capacity
/// ([`new`](Self::new) uses [`DEFAULT_EVENTS`];
/// [`with_events`](Self::with_events) any other, at most 65535), `H` the
/// storage of the memory history ([`NoHistory`] unless made with
/// [`with_history`](Self::with_history); see `record_history`), `P` the
/// number of private pools that can exist at once ([`DEFAULT_POOLS`]).
///
/// # Capacities, and what happens when they run out
///
/// - **Block slots** (`storage`, 88 bytes each): one per block, that is per
///   live allocation, per cached or pending free block, and at least one per
///   segment. A workload with `L` live allocations at its peak needs about
///   `2 L` plus its segments (each allocation can leave a cached remainder
///   behind it); the replay tool starts with 8,192 per device and doubles
///   them whenever they run out (see `with_growing_storage`). When they run
///   out, `malloc` fails with
///   [`Error::MetadataExhausted`] before it changes anything (it keeps two in
///   reserve); frees never need a new slot.
/// - **Events** (`E`): the end-of-life events queued at once (a free of a
///   block that `record_stream` marked records one per extra stream), the
///   idle events kept for reuse, and the (block, stream) pairs recorded on
///   live blocks. A free that would overflow the queue first completes what
///   has finished, then fails with [`Error::EventQueueFull`], leaving the
///   allocation live; a `record_stream` beyond the table fails with
///   [`Error::StreamUsesFull`]. PyTorch's queues are unbounded: size `E` for
///   the streams a block is used on times the frees in flight.
/// - **Private pools** (`P`): pools that exist at once (created and not yet
///   deleted by an `empty_cache` after their last release). One more fails
///   with [`Error::PoolTableFull`].
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
/// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 32], Config::DEFAULT);
/// let x = a.malloc(3 << 20, 0)?;                       // large pool, 20 MiB segment
/// assert_eq!(a.stats().reserved_bytes.all().current, 20 << 20);
/// a.free(x.handle.unwrap())?;
/// a.empty_cache()?;
/// assert_eq!(a.stats().reserved_bytes.all().current, 0);
/// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
/// ```
pub struct DeviceAllocator<
    B: DeviceBackend,
    S,
    const E: usize = 64,
    H = NoHistory,
    const P: usize = DEFAULT_POOLS,
> {
    backend: B,
    /// Block metadata.
    arena: Arena<S>,
    /// The free index of each pool.
    pools: Pools,
    /// Segment heads by base address.
    segments: SegmentIndex,
    /// Allocated blocks by address.
    live: LiveIndex,
    /// Stream uses, end-of-life events, idle events.
    events: EventQueue<B, E>,
    config: Config,
    /// The config at creation (the `max_split_size` statistic keeps it).
    initial_config: Config,
    stats: DeviceStats,
    /// PyTorch's `allowed_memory_maximum`, when a memory fraction or limit is set.
    limit: Option<u64>,
    /// PyTorch's `total_allocated_memory`: bytes of all segments.
    total_allocated_memory: u64,
    next_allocation_id: u64,
    /// The number the next device malloc's memory gets (torch's
    /// registration counter; see `counters.rs`).
    next_counter: u32,
    /// What every request asks of `config`, read once per config.
    shape: ConfigShape,
    /// The device's total memory, once read (the rejection policy's base).
    device_total: Option<u64>,
    /// `per_process_memory_fraction` of the config at creation is yet to be
    /// applied as the memory fraction (it is at the first new segment).
    fraction_pending: bool,
    /// The rejection policy refused the last `alloc_block` (taken by the
    /// ladder).
    rejected: Option<malloc::Rejection>,
    /// The last `alloc_block` asked a pool's own allocator (a segment
    /// source), which returned none (the verdict `pool_allocator`).
    source_refused: bool,
    callbacks: heapless::Vec<&'static dyn FreeMemoryCallback, MAX_CALLBACKS>,
    /// The memory history.
    history: History<H>,
    trackers: heapless::Vec<&'static dyn TraceTracker, MAX_CALLBACKS>,
    oom_observers: heapless::Vec<&'static dyn OutOfMemoryObserver, MAX_CALLBACKS>,
    /// The caller's context id, carried by the entries recorded now.
    trace_context: u64,
    /// Whether anything sees trace entries: history on, or a tracker.
    tracing: bool,
    /// The private pools.
    private: PoolTable<P>,
    /// Where requests go: (pool, stream filter), the newest last.
    routes: heapless::Vec<Route<B::Stream>, P>,
    /// Real captures under way (routes with `capture`).
    captures: u32,
    /// The captures of `captures` marked by `mark_capture_begin` (torch
    /// 2.13 on), apart from the routings that are captures.
    marked_captures: u32,
    /// Blocks freed during a capture, waiting for it to end (linked
    /// through `hash_next()`, oldest first).
    deferred: Deferred,
    /// The compact policy's segments.
    compact: compact::CompactHeads<P>,
    /// Cached blocks handed from one stream to another (compact policy).
    handovers: u64,
    /// The most pages were ever mapped at once (bytes; the compact policy
    /// reclaims free pages only to stay under it).
    reserved_high: u64,
    /// IPC handles opened here, with their use counts.
    ipc_opened: ipc::Opened,
    /// Allocations shared through IPC with consumers outstanding.
    ipc_shared: ipc::Shared,
    /// The registry of segment ranges this device keeps up to date, and
    /// its device number there.
    registry: Option<(&'static dyn SegmentRegistry, u32)>,
    /// Whether out-of-memory notices are kept for the observers instead of
    /// calling them (while a thread-safe front end owns the allocator: it
    /// calls them once its lock is released), and the ones kept.
    pub(crate) keep_oom: bool,
    pub(crate) oom_kept: heapless::Vec<OomNotice, 4>,
    /// The verdicts on the last out-of-memories, with their bytes, by their
    /// numbers (the error carries only the class and the number), and the
    /// last number given.
    last_ooms: heapless::Deque<(u32, OomCause), OOM_CAUSES_KEPT>,
    oom_seq: u32,
    /// Ranges the device made that the allocator refused during a capture
    /// (a contract violation, a full segment registry), to hand back once
    /// it ends: (address, size, an address reservation).
    given_back_later: heapless::Vec<(u64, u64, bool), 4>,
    /// What a drop must do, once there is something (segments of pools
    /// with a source of their own, a segment registry): set where the
    /// bounds that doing it needs are known (`drop.rs`).
    on_drop: Option<DropWork<B, S, E, H, P>>,
}

/// What a [`DeviceAllocator`]'s drop runs (`drop.rs`).
type DropWork<B, S, const E: usize, H, const P: usize> = fn(&mut DeviceAllocator<B, S, E, H, P>);

/// How many out-of-memory verdicts a device keeps (by number, for the
/// threads whose calls failed: their errors name them).
pub const OOM_CAUSES_KEPT: usize = 8;

/// The most callbacks of each kind a device holds (free-memory callbacks,
/// trace trackers, out-of-memory observers).
pub const MAX_CALLBACKS: usize = 4;

/// Two answers of the config that every request needs, kept beside it
/// (recomputed whenever the config changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConfigShape {
    /// [`Config::maps_pages`].
    pub(crate) maps_pages: bool,
    /// [`Config::rounds_to_divisions`].
    pub(crate) rounds: bool,
}

impl ConfigShape {
    pub(crate) const fn of(c: &Config) -> ConfigShape {
        ConfigShape {
            maps_pages: c.maps_pages(),
            rounds: c.rounds_to_divisions(),
        }
    }
}

/// The list of deferred blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deferred {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
    /// Parked blocks with a free marker (`graph_capture_record_stream_reuse`).
    pub(crate) marked: u32,
}

impl Deferred {
    pub(crate) const EMPTY: Deferred = Deferred {
        head: NIL,
        tail: NIL,
        len: 0,
        marked: 0,
    };
}

type Res<T, B> = Result<T, Error<<B as DeviceBackend>::Error>>;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Allocate `size` bytes for use on `stream`. Zero bytes give
    /// [`Allocation::NULL`] without touching the allocator.
    #[inline]
    pub fn malloc(&mut self, size: u64, stream: B::Stream) -> Res<Allocation, B> {
        self.malloc_with(size, stream, MallocFlags::empty())
    }

    /// [`malloc`](Self::malloc) with per-call options.
    #[inline]
    pub fn malloc_with(
        &mut self,
        size: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> Res<Allocation, B> {
        self.malloc_impl::<false>(size, policy::MIN_BLOCK_SIZE, stream, flags)
    }

    /// [`malloc_with`](Self::malloc_with) at an address that is a multiple
    /// of `alignment` (a power of two; TensorFlow's `AllocateRaw`). Every
    /// block is 512-byte aligned, so up to 512 this is `malloc_with`
    /// exactly. A larger alignment looks for a block `alignment - 512`
    /// bytes larger than the rounded request (so possibly in the large
    /// pool), cuts off its low end up to the aligned address as a free
    /// block, and hands out the aligned rest (split as usual): the
    /// allocation starts at the returned pointer, and frees, `base_allocation`
    /// and `allocation_info` work as for any other. Zero or a non-power of
    /// two is [`Error::BadAlignment`]; a pool that never splits refuses
    /// alignments above 512. Above 512 the padded size is the request for
    /// the policy (pool, oversize rules, new segment size, the rounded
    /// size of an out-of-memory report).
    pub fn malloc_aligned(
        &mut self,
        size: u64,
        alignment: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> Res<Allocation, B> {
        if !alignment.is_power_of_two() {
            return Err(Error::BadAlignment { alignment });
        }
        if alignment <= policy::MIN_BLOCK_SIZE {
            return self.malloc_impl::<false>(size, alignment, stream, flags);
        }
        self.malloc_impl::<true>(size, alignment, stream, flags)
    }

    /// Free an allocation by its handle. If other streams used it
    /// (`record_stream`), its memory returns to the cache only once their
    /// work queued so far is done, noticed at a later `malloc` or `empty_cache`.
    #[inline]
    pub fn free(&mut self, id: BlockId) -> Res<(), B> {
        let i = self.validate(id)?;
        self.free_by_owner(i)
    }

    /// Free an allocation by its address (null is a no-op).
    pub fn free_ptr(&mut self, ptr: DevicePtr) -> Res<(), B> {
        if ptr.is_null() {
            return Ok(());
        }
        let i = self.live_slot(ptr)?;
        self.free_by_owner(i)
    }

    /// The owner's free of live block `i`: held while it is shared through
    /// IPC, else `free_slot`.
    #[inline]
    fn free_by_owner(&mut self, i: u32) -> Res<(), B> {
        if !self.ipc_shared.is_empty() {
            if let Some(r) = self.free_shared(i) {
                return r;
            }
        }
        self.free_slot(i)
    }

    /// Mark an allocation as used on `stream` too (PyTorch's `recordStream`).
    /// Its allocation stream is ignored; repeated streams collapse.
    pub fn record_stream(&mut self, id: BlockId, stream: B::Stream) -> Res<(), B> {
        let i = self.validate(id)?;
        self.record_stream_slot(i, stream)
    }

    /// [`record_stream`](Self::record_stream) by address (null is a no-op).
    pub fn record_stream_ptr(&mut self, ptr: DevicePtr, stream: B::Stream) -> Res<(), B> {
        if ptr.is_null() {
            return Ok(());
        }
        let i = self.live_slot(ptr)?;
        self.record_stream_slot(i, stream)
    }

    /// Wait for every pending end-of-life event, then return every cached
    /// segment that is entirely free to the device. Peaks are kept.
    ///
    /// While a capture is under way it does nothing: waiting for events
    /// and freeing device memory would invalidate the capture (PyTorch
    /// still empties freeable private pools then). The next `empty_cache`
    /// after the capture does the work.
    pub fn empty_cache(&mut self) -> Res<(), B> {
        if self.capturing() {
            return Ok(());
        }
        self.release_cached_blocks()
    }

    /// `set_per_process_memory_fraction`: from now on no new segment may take
    /// reserved memory above `fraction × total device memory`.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Res<(), B> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidFraction);
        }
        // torch 2.11 to 2.15 (each wheel's `setMemoryFraction`): 1.0 sets
        // no limit (and so no "allowed" in an out-of-memory message, no
        // garbage collection); a lower fraction, that much of the device.
        self.limit = if fraction < 1.0 {
            let total = self.backend.mem_info().map_err(Error::Backend)?.total;
            Some((fraction * total as f64) as u64)
        } else {
            None
        };
        // Later than the config's fraction, which torch applies at init.
        self.fraction_pending = false;
        Ok(())
    }

    /// Limit reserved memory to `bytes` (a memory fraction given in bytes).
    pub fn set_memory_limit(&mut self, bytes: u64) {
        self.limit = Some(bytes);
        self.fraction_pending = false;
    }

    /// Remove the memory limit (and with it garbage collection).
    pub fn clear_memory_limit(&mut self) {
        self.limit = None;
        self.fraction_pending = false;
    }

    /// The memory limit, if one is set.
    pub fn memory_limit(&self) -> Option<u64> {
        self.limit
    }

    /// PyTorch's `getMemoryFraction`: the memory limit over the device's
    /// total memory, 1.0 when no limit is set (a fraction of 0.5 reads back
    /// as 0.5 up to the limit's truncation to whole bytes).
    pub fn memory_fraction(&mut self) -> Res<f64, B> {
        match self.limit {
            None => Ok(1.0),
            Some(limit) => {
                let total = self.backend.mem_info().map_err(Error::Backend)?.total;
                Ok(if total == 0 {
                    1.0
                } else {
                    limit as f64 / total as f64
                })
            }
        }
    }

    /// Replace the settings (like `_set_allocator_settings`; the
    /// `max_split_size` statistic keeps its value from creation, as in
    /// PyTorch; what a string leaves out stays as [`Config::followed_by`]
    /// says, the torch version included).
    pub fn set_config(&mut self, config: Config) {
        self.config = self.config.followed_by(config);
        self.shape = ConfigShape::of(&self.config);
    }

    /// The policy in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The statistics.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// `reset_peak_memory_stats`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
        self.private.reset_stats(true, false);
    }

    /// Set the peak of `allocated_bytes` (every pool) to its current value,
    /// leaving every other statistic as it is (TensorFlow's `ClearStats`
    /// resets `peak_bytes_in_use` only; PyTorch's reset resets every peak).
    pub fn reset_peak_allocated_bytes(&mut self) {
        self.stats.allocated_bytes.reset_peak();
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
        self.private.reset_stats(false, true);
    }

    /// Each private pool's reserved bytes (live pools, then the deleted
    /// ones torch still reports): torch 2.13's
    /// `reserved_bytes_by_private_pools.<id0>_<id1>.{all,small_pool,large_pool}.*`.
    pub fn reserved_bytes_by_private_pools(
        &self,
        mut f: impl FnMut(crate::MempoolId, &crate::StatArray),
    ) {
        for (id, s) in self.private.reserved_stats() {
            f(id, &s);
        }
    }

    /// Cached bytes and the largest cached block.
    pub fn cache_info(&self) -> CacheInfo {
        let mut info = CacheInfo::default();
        for b in self.segments().flat_map(|seg| seg.blocks()) {
            if b.state == BlockState::Inactive {
                info.cached_bytes += b.size;
                info.largest_block = info.largest_block.max(b.size);
            }
        }
        info
    }

    /// The segment that contains `ptr`: its base and size (PyTorch's
    /// `getBaseAllocation`, for any address inside a reserved segment).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Res<(DevicePtr, u64), B> {
        let h = self.segment_of(ptr)?;
        if self.slot(h).has(Flags::EXPANDABLE) {
            // PyTorch: "Tensors allocated with expandable_segments=True
            // cannot be shared between processes".
            return Err(Error::Unsupported {
                what: "sharing memory of an expandable segment (getBaseAllocation)",
                backend: "expandable segments",
            });
        }
        Ok((DevicePtr(self.slot(h).addr), self.slot(h).seg_size))
    }

    /// Requested size, block size and id of a live allocation.
    pub fn allocation_info(&self, id: BlockId) -> Res<AllocationInfo<B::Stream>, B> {
        let i = self.validate(id)?;
        Ok(self.info_of(i))
    }

    /// [`allocation_info`](Self::allocation_info) by address.
    pub fn allocation_info_ptr(&self, ptr: DevicePtr) -> Res<AllocationInfo<B::Stream>, B> {
        let i = self.live_slot(ptr)?;
        Ok(self.info_of(i))
    }

    /// Segments in address order, each with its blocks: a snapshot that
    /// allocates nothing.
    pub fn segments(&self) -> Segments<'_, B::Stream> {
        Segments::new(self.arena.slots(), self.segments, self.private.entries())
    }

    /// Register a free-memory callback (at most 4); gives it back if full.
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// # use cachealloc_core::{BlockSlot, Config, DeviceAllocator, FreeAccess};
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// static CALLS: AtomicU32 = AtomicU32::new(0);
    /// fn count(_: &mut dyn FreeAccess) -> bool {
    ///     CALLS.fetch_add(1, Ordering::Relaxed);
    ///     false // freed nothing
    /// }
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 8], Config::DEFAULT);
    /// a.add_free_memory_callback(&count).ok();
    /// assert!(a.malloc(1, 0).is_ok());
    /// assert_eq!(CALLS.load(Ordering::Relaxed), 1); // no cached block fitted
    /// ```
    pub fn add_free_memory_callback(
        &mut self,
        callback: &'static dyn FreeMemoryCallback,
    ) -> Result<(), &'static dyn FreeMemoryCallback> {
        self.callbacks.push(callback)
    }

    /// Teardown: close every IPC handle opened here (whatever its use
    /// count), wait for every pending end-of-life event, return every
    /// cached segment to the device (and every expandable segment's
    /// reservation with no page mapped), and destroy the idle events. Live
    /// allocations stay (free them first to release everything); returns how
    /// many there are. With none, the device then holds nothing of this
    /// allocator. A backend error leaves the allocator consistent; call again
    /// to retry. (There is no `Drop` doing this: a drop cannot report a
    /// failure, and an allocator in a `static` is never dropped.) Refused
    /// with [`Error::CaptureUnderway`] while a capture is under way.
    pub fn release_all(&mut self) -> Res<u32, B> {
        if self.capturing() {
            return Err(Error::CaptureUnderway {
                what: "release_all (teardown)",
            });
        }
        self.give_back_later_ones();
        self.close_all_ipc_handles()?;
        self.release_cached_blocks()?;
        self.release_empty_reservations()?;
        self.release_idle_events()?;
        Ok(self.live.len())
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (a simulated device's clock, say).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Block slots the storage has.
    pub fn slot_capacity(&self) -> u32 {
        self.arena.capacity()
    }

    /// Block slots in use (blocks that exist).
    pub fn slots_in_use(&self) -> u32 {
        self.arena.in_use()
    }

    /// The most block slots ever in use at once (freed slots are reused
    /// before new ones are touched): how much storage this run needed.
    pub fn slots_high_water(&self) -> u32 {
        self.arena.high_water()
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> u32 {
        self.live.len()
    }

    /// Cached blocks the compact policy handed from the stream that freed
    /// them to another (each an event record and a device-side wait).
    pub fn stream_handovers(&self) -> u64 {
        self.handovers
    }

    /// Pending end-of-life events.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// Destroy the idle events kept for reuse (the device keeps them
    /// otherwise). Refused while a capture is under way.
    pub fn release_idle_events(&mut self) -> Res<(), B> {
        if self.capturing() {
            return Err(Error::CaptureUnderway {
                what: "release_idle_events",
            });
        }
        self.events
            .release_idle(&mut self.backend)
            .map_err(Error::Backend)
    }

    // ------------------------------------------------------------ helpers

    #[inline]
    fn slot(&self, i: u32) -> &BlockSlot {
        &self.arena.slots()[i as usize]
    }

    #[inline]
    fn slot_mut(&mut self, i: u32) -> &mut BlockSlot {
        &mut self.arena.slots_mut()[i as usize]
    }

    /// The free index of block `i`'s pool.
    #[inline]
    fn free_index_of(&self, i: u32) -> &crate::pool::BlockPool {
        let s = self.slot(i);
        block_pool(&self.pools, &self.private, s.owner, Pool::of(s.flags))
    }
}
