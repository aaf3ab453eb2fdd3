//! [`DeviceAllocator`]: one device's caching allocator, single-threaded
//! (`&mut self`). The policy is PyTorch's `DeviceCachingAllocator`.

use crate::arena::{Arena, BlockId, BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr, EventStatus, MallocError};
use crate::config::Config;
use crate::error::{Error, OomReport};
use crate::events::{PendingEvent, StreamUse};
use crate::index::{self, FreeIndex, SegmentIndex};
use crate::policy::{self, Pool};
use crate::pool::{pool_flag, pool_of, BlockPool};
use crate::stats::DeviceStats;

bitflags::bitflags! {
    /// Per-call options of [`DeviceAllocator::malloc_with`].
    ///
    /// ```
    /// use cachealloc_core::MallocFlags;
    /// assert!(MallocFlags::NO_RETRY.contains(MallocFlags::NO_RETRY));
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct MallocFlags: u8 {
        /// Fail at once when neither the cache nor one device malloc can serve
        /// the request: no release of cached segments, no retry (TensorFlow's
        /// `no_retry_on_failure`). The failure still counts in `num_ooms`.
        const NO_RETRY = 1 << 0;
    }
}

/// A function the allocator calls when no cached block fits, before it asks
/// the device for memory (PyTorch's `FreeMemoryCallback`). It may free
/// allocations; it returns whether it freed anything, and if so the cache is
/// searched again.
pub type FreeMemoryCallback<B, S, const E: usize> = fn(&mut DeviceAllocator<B, S, E>) -> bool;

/// A successful allocation.
///
/// ```
/// use cachealloc_core::Allocation;
/// assert!(Allocation::NULL.ptr.is_null() && Allocation::NULL.id.is_none());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The device address (null for a zero-byte request).
    pub ptr: DevicePtr,
    /// The handle to free it with (`None` for a zero-byte request).
    pub id: Option<BlockId>,
    /// The block size (rounded; may exceed the request by up to 1 MiB of unsplit slack).
    pub size: u64,
    /// The bytes asked for.
    pub requested: u64,
    /// A number unique to this allocation (TensorFlow's `AllocationId`).
    pub allocation_id: u64,
}

impl Allocation {
    /// What a zero-byte request returns: a null pointer, nothing to free.
    pub const NULL: Allocation = Allocation {
        ptr: DevicePtr::NULL,
        id: None,
        size: 0,
        requested: 0,
        allocation_id: 0,
    };
}

/// What the allocator knows of a live allocation.
///
/// ```
/// # use cachealloc_core::{testing::TinyBackend, BlockSlot, Config, DeviceAllocator};
/// # let mut a: DeviceAllocator<TinyBackend, _> =
/// #     DeviceAllocator::new(TinyBackend::default(), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let x = a.malloc(1000, 0)?;
/// let info = a.allocation_info_ptr(x.ptr)?;
/// assert_eq!((info.requested_size, info.allocated_size), (1000, 1024));
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    /// Its start.
    pub ptr: DevicePtr,
    /// The bytes asked for (TensorFlow's `RequestedSize`).
    pub requested_size: u64,
    /// The block size (TensorFlow's `AllocatedSize`).
    pub allocated_size: u64,
    /// Its unique number (TensorFlow's `AllocationId`).
    pub allocation_id: u64,
    /// Its allocation stream (raw handle value).
    pub stream: u64,
    /// Its handle.
    pub id: BlockId,
}

/// Cached (free) device memory.
///
/// ```
/// # use cachealloc_core::{testing::TinyBackend, BlockSlot, Config, DeviceAllocator};
/// # let mut a: DeviceAllocator<TinyBackend, _> =
/// #     DeviceAllocator::new(TinyBackend::default(), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let x = a.malloc(512, 0)?;
/// assert_eq!(a.cache_info().largest_block, (2 << 20) - 512);
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheInfo {
    /// Bytes in cached blocks (reserved and not active).
    pub cached_bytes: u64,
    /// The largest cached block.
    pub largest_block: u64,
}

/// The state of a block in a snapshot (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out (`active_allocated`).
    ActiveAllocated,
    /// Freed, waiting for events of other streams (`active_pending_free`).
    ActivePendingFree,
    /// Cached (`inactive`).
    Inactive,
}

impl BlockState {
    /// PyTorch's snapshot string.
    pub const fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment in a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Block size.
    pub size: u64,
    /// Unrounded size of the last allocation that used it (stale for cached blocks).
    pub requested_size: u64,
    /// Allocated, pending or cached.
    pub state: BlockState,
}

/// One segment in a snapshot (PyTorch's `SegmentInfo`).
#[derive(Clone, Copy, Debug)]
pub struct SegmentInfo<'a> {
    slots: &'a [BlockSlot],
    head: u32,
    /// Base address.
    pub address: DevicePtr,
    /// Segment size.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active (allocated or pending) blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// Allocation stream (raw handle value).
    pub stream: u64,
    /// The pool.
    pub pool: Pool,
    /// Number of blocks.
    pub block_count: u32,
}

impl<'a> SegmentInfo<'a> {
    /// The blocks of the segment in address order.
    pub fn blocks(&self) -> Blocks<'a> {
        Blocks {
            slots: self.slots,
            cur: self.head,
        }
    }
}

/// Iterator over the blocks of a segment.
#[derive(Clone, Debug)]
pub struct Blocks<'a> {
    slots: &'a [BlockSlot],
    cur: u32,
}

impl Iterator for Blocks<'_> {
    type Item = BlockInfo;
    fn next(&mut self) -> Option<BlockInfo> {
        let s = self.slots.get(self.cur as usize)?;
        self.cur = s.next;
        Some(BlockInfo {
            address: DevicePtr(s.addr),
            size: s.size,
            requested_size: s.requested,
            state: state_of(s),
        })
    }
}

fn state_of(s: &BlockSlot) -> BlockState {
    if s.has(Flags::ALLOCATED) {
        BlockState::ActiveAllocated
    } else if s.events > 0 {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    }
}

/// Iterator over segments in address order (no allocation: each step is a
/// successor search in the segment index).
#[derive(Clone, Debug)]
pub struct Segments<'a> {
    slots: &'a [BlockSlot],
    root: u32,
    cur: u32,
}

impl<'a> Iterator for Segments<'a> {
    type Item = SegmentInfo<'a>;
    fn next(&mut self) -> Option<SegmentInfo<'a>> {
        let head = self.cur;
        let h = self.slots.get(head as usize)?;
        self.cur = index::successor::<SegmentIndex>(self.slots, self.root, h.addr);
        let mut info = SegmentInfo {
            slots: self.slots,
            head,
            address: DevicePtr(h.addr),
            total_size: h.seg_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: h.stream,
            pool: pool_of(h.flags),
            block_count: 0,
        };
        for b in info.blocks() {
            info.block_count += 1;
            if b.state == BlockState::ActiveAllocated {
                info.allocated_size += b.size;
            }
            if b.state != BlockState::Inactive {
                info.active_size += b.size;
                info.requested_size += b.requested_size;
            }
        }
        Some(info)
    }
}

#[inline]
fn pool_idx(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

/// One device's caching allocator.
///
/// `B` is the device, `S` the block-slot storage (any
/// `AsRef<[BlockSlot]> + AsMut<[BlockSlot]>`), `E` the capacity of the
/// pending-event queue, of the idle-event pool and of the `record_stream`
/// table (at most 65535).
///
/// ```
/// use cachealloc_core::{testing::TinyBackend, BlockSlot, Config, DeviceAllocator};
/// let mut a: DeviceAllocator<TinyBackend, _> =
///     DeviceAllocator::new(TinyBackend::default(), [BlockSlot::VACANT; 32], Config::DEFAULT);
/// let x = a.malloc(3 << 20, 0)?;                       // large pool, 20 MiB segment
/// assert_eq!(a.stats().reserved_bytes.all().current, 20 << 20);
/// a.free(x.id.unwrap())?;
/// a.empty_cache()?;
/// assert_eq!(a.stats().reserved_bytes.all().current, 0);
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
/// ```
pub struct DeviceAllocator<B: DeviceBackend, S, const E: usize = 64> {
    pub(crate) backend: B,
    pub(crate) arena: Arena<S>,
    pub(crate) pools: [BlockPool; 2],
    pub(crate) seg_root: u32,
    pub(crate) segments: u32,
    pub(crate) live: u32,
    pub(crate) config: Config,
    pub(crate) initial_config: Config,
    pub(crate) stats: DeviceStats,
    pub(crate) set_fraction: bool,
    pub(crate) allowed_memory_maximum: u64,
    pub(crate) total_allocated_memory: u64,
    pub(crate) pending: heapless::Vec<PendingEvent<B::Event, B::Stream>, E>,
    pub(crate) uses: heapless::Vec<StreamUse<B::Stream>, E>,
    /// Streams with queued events, in the order their queues were created
    /// (PyTorch keeps one FIFO per stream in a hash map; see `process_events`).
    pub(crate) queue_order: heapless::Vec<u64, E>,
    idle_events: heapless::Vec<B::Event, E>,
    next_allocation_id: u64,
    callbacks: heapless::Vec<FreeMemoryCallback<B, S, E>, 4>,
}

type Res<T, B> = Result<T, Error<<B as DeviceBackend>::Error>>;

impl<B, S, const E: usize> DeviceAllocator<B, S, E>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    /// A new allocator over `backend`, keeping block metadata in `storage`.
    /// `const`, so a `no_std` program can build it in a `static`.
    pub const fn new(backend: B, storage: S, config: Config) -> Self {
        const { assert!(E <= u16::MAX as usize, "E must fit a u16") };
        DeviceAllocator {
            backend,
            arena: Arena::new(storage),
            pools: [BlockPool::EMPTY; 2],
            seg_root: NIL,
            segments: 0,
            live: 0,
            config,
            initial_config: config,
            stats: DeviceStats::new(if config.max_split_size == u64::MAX {
                None
            } else {
                Some(config.max_split_size)
            }),
            set_fraction: false,
            allowed_memory_maximum: 0,
            total_allocated_memory: 0,
            pending: heapless::Vec::new(),
            uses: heapless::Vec::new(),
            queue_order: heapless::Vec::new(),
            idle_events: heapless::Vec::new(),
            next_allocation_id: 1,
            callbacks: heapless::Vec::new(),
        }
    }

    // ------------------------------------------------------------------ API

    /// Allocate `size` bytes for use on `stream`. Zero bytes give
    /// [`Allocation::NULL`] without touching the allocator.
    #[inline]
    pub fn malloc(&mut self, size: u64, stream: B::Stream) -> Res<Allocation, B> {
        self.malloc_with(size, stream, MallocFlags::empty())
    }

    /// [`malloc`](Self::malloc) with per-call options.
    pub fn malloc_with(
        &mut self,
        orig: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> Res<Allocation, B> {
        if orig == 0 {
            return Ok(Allocation::NULL);
        }
        if orig >= policy::ONE_EIB {
            return Err(Error::TooLarge { requested: orig });
        }
        self.reserve_slots()?;
        if !self.queue_order.is_empty() {
            self.process_events()?;
        }
        let size = policy::round_size(orig, &self.config)
            .ok_or(Error::SizeOverflow { requested: orig })?;
        let alloc_size =
            policy::allocation_size(size).ok_or(Error::SizeOverflow { requested: orig })?;
        let pool = policy::pool_for(size);
        let skey: u64 = stream.into();

        let mut found = self.get_free_block(pool, skey, size);
        if found == NIL && !self.callbacks.is_empty() && self.trigger_free_memory_callbacks() {
            self.reserve_slots()?;
            found = self.get_free_block(pool, skey, size);
        }
        if found == NIL {
            if self.set_fraction && self.config.garbage_collection_threshold > 0.0 {
                self.garbage_collect_cached_blocks()?;
            }
            found = self.alloc_block(pool, skey, alloc_size, false)?;
            if found == NIL && !flags.contains(MallocFlags::NO_RETRY) {
                if self.release_available_cached_blocks(pool, skey, size)? {
                    found = self.alloc_block(pool, skey, alloc_size, false)?;
                }
                if found == NIL {
                    self.release_cached_blocks()?;
                    found = self.alloc_block(pool, skey, alloc_size, true)?;
                }
            }
            if found == NIL {
                return Err(self.out_of_memory(orig, size, alloc_size));
            }
        }
        Ok(self.alloc_found_block(found, orig, size, pool))
    }

    /// Free an allocation by its handle. If other streams used it
    /// (`record_stream`), its memory returns to the cache only once their
    /// work queued so far is done, noticed at a later `malloc` or `empty_cache`.
    #[inline]
    pub fn free(&mut self, id: BlockId) -> Res<(), B> {
        let i = self.validate(id)?;
        self.free_slot(i)
    }

    /// Free an allocation by its address (null is a no-op).
    pub fn free_ptr(&mut self, ptr: DevicePtr) -> Res<(), B> {
        if ptr.is_null() {
            return Ok(());
        }
        let i = self.live_slot(ptr)?;
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
    pub fn empty_cache(&mut self) -> Res<(), B> {
        self.release_cached_blocks()
    }

    /// `set_per_process_memory_fraction`: from now on no new segment may take
    /// reserved memory above `fraction × total device memory`.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Res<(), B> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::InvalidFraction);
        }
        let total = self.backend.mem_info().map_err(Error::Backend)?.total;
        self.allowed_memory_maximum = (fraction * total as f64) as u64;
        self.set_fraction = true;
        Ok(())
    }

    /// Limit reserved memory to `bytes` (a memory fraction given in bytes).
    pub fn set_memory_limit(&mut self, bytes: u64) {
        self.allowed_memory_maximum = bytes;
        self.set_fraction = true;
    }

    /// Remove the memory limit (and with it garbage collection).
    pub fn clear_memory_limit(&mut self) {
        self.set_fraction = false;
        self.allowed_memory_maximum = 0;
    }

    /// The memory limit, if one is set.
    pub fn memory_limit(&self) -> Option<u64> {
        self.set_fraction.then_some(self.allowed_memory_maximum)
    }

    /// Replace the policy (like `_set_allocator_settings`; the
    /// `max_split_size` statistic keeps its value from creation, as in PyTorch).
    pub fn set_config(&mut self, config: Config) {
        self.config = config;
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
    }

    /// `reset_accumulated_memory_stats`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Cached bytes and the largest cached block.
    pub fn cache_info(&self) -> CacheInfo {
        let mut info = CacheInfo::default();
        for seg in self.segments() {
            for b in seg.blocks() {
                if b.state == BlockState::Inactive {
                    info.cached_bytes += b.size;
                    info.largest_block = info.largest_block.max(b.size);
                }
            }
        }
        info
    }

    /// The segment that contains `ptr`: its base and size (PyTorch's
    /// `getBaseAllocation`, for any address inside a reserved segment).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Res<(DevicePtr, u64), B> {
        let h = self.segment_of(ptr.0);
        if h == NIL {
            return Err(Error::UnknownPointer { ptr });
        }
        let s = self.slot(h);
        Ok((DevicePtr(s.addr), s.seg_size))
    }

    /// Requested size, block size and id of a live allocation.
    pub fn allocation_info(&self, id: BlockId) -> Res<AllocationInfo, B> {
        let i = self.validate(id)?;
        Ok(self.info_of(i))
    }

    /// [`allocation_info`](Self::allocation_info) by address.
    pub fn allocation_info_ptr(&self, ptr: DevicePtr) -> Res<AllocationInfo, B> {
        let i = self.live_slot(ptr)?;
        Ok(self.info_of(i))
    }

    /// Segments in address order, each with its blocks: a snapshot that
    /// allocates nothing.
    pub fn segments(&self) -> Segments<'_> {
        let slots = self.arena.slots();
        Segments {
            slots,
            root: self.seg_root,
            cur: index::first::<SegmentIndex>(slots, self.seg_root),
        }
    }

    /// Register a free-memory callback (at most 4); gives it back if full.
    pub fn add_free_memory_callback(
        &mut self,
        callback: FreeMemoryCallback<B, S, E>,
    ) -> Result<(), FreeMemoryCallback<B, S, E>> {
        self.callbacks.push(callback)
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

    /// Live allocations.
    pub fn live_allocations(&self) -> u32 {
        self.live
    }

    /// Pending end-of-life events.
    pub fn pending_events(&self) -> usize {
        self.pending.len()
    }

    /// Destroy the idle events kept for reuse (the device keeps them otherwise).
    pub fn release_idle_events(&mut self) -> Res<(), B> {
        while let Some(ev) = self.idle_events.pop() {
            self.backend.event_destroy(ev).map_err(Error::Backend)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ helpers

    #[inline]
    pub(crate) fn slot(&self, i: u32) -> &BlockSlot {
        &self.arena.slots()[i as usize]
    }

    #[inline]
    fn slot_mut(&mut self, i: u32) -> &mut BlockSlot {
        &mut self.arena.slots_mut()[i as usize]
    }

    fn reserve_slots(&self) -> Res<(), B> {
        if self.arena.available() < 2 {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        }
        Ok(())
    }

    fn validate(&self, id: BlockId) -> Res<u32, B> {
        let i = id.index();
        let Some(s) = self
            .arena
            .slots()
            .get(i as usize)
            .filter(|_| i < self.arena.high_water())
        else {
            return Err(Error::InvalidHandle { index: i });
        };
        if s.generation != id.generation() {
            return Err(Error::StaleHandle {
                index: i,
                generation: id.generation(),
            });
        }
        if !s.has(Flags::ALLOCATED) {
            return Err(Error::InvalidHandle { index: i });
        }
        Ok(i)
    }

    fn info_of(&self, i: u32) -> AllocationInfo {
        let s = self.slot(i);
        AllocationInfo {
            ptr: DevicePtr(s.addr),
            requested_size: s.requested,
            allocated_size: s.size,
            allocation_id: s.aux,
            stream: s.stream,
            id: BlockId::new(i, s.generation),
        }
    }

    // ------------------------------------------ live-pointer hash (O(1))

    #[inline]
    fn bucket(&self, addr: u64) -> u32 {
        let h = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        ((h * self.arena.capacity() as u64) >> 32) as u32
    }

    #[inline]
    fn live_insert(&mut self, i: u32) {
        let b = self.bucket(self.slot(i).addr);
        let head = self.slot(b).hash_head;
        self.slot_mut(i).hash_next = head;
        self.slot_mut(b).hash_head = i;
        self.live += 1;
    }

    #[inline]
    fn live_remove(&mut self, i: u32) {
        let b = self.bucket(self.slot(i).addr);
        let next = self.slot(i).hash_next;
        let mut cur = self.slot(b).hash_head;
        if cur == i {
            self.slot_mut(b).hash_head = next;
        } else {
            while cur != NIL {
                let n = self.slot(cur).hash_next;
                if n == i {
                    self.slot_mut(cur).hash_next = next;
                    break;
                }
                cur = n;
            }
        }
        self.slot_mut(i).hash_next = NIL;
        self.live -= 1;
    }

    /// The slot of the live allocation starting at `addr`, or `NIL`.
    #[inline]
    pub(crate) fn live_find(&self, addr: u64) -> u32 {
        if self.arena.capacity() == 0 {
            return NIL;
        }
        let mut cur = self.slot(self.bucket(addr)).hash_head;
        while cur != NIL {
            let s = self.slot(cur);
            if s.addr == addr {
                return cur;
            }
            cur = s.hash_next;
        }
        NIL
    }

    fn live_slot(&self, ptr: DevicePtr) -> Res<u32, B> {
        let i = self.live_find(ptr.0);
        if i != NIL {
            return Ok(i);
        }
        let h = self.segment_of(ptr.0);
        if h == NIL {
            return Err(Error::UnknownPointer { ptr });
        }
        let mut cur = h;
        while cur != NIL {
            let s = self.slot(cur);
            if s.addr <= ptr.0 && ptr.0 < s.end() {
                if s.has(Flags::ALLOCATED) {
                    return Err(Error::InteriorPointer {
                        ptr,
                        base: DevicePtr(s.addr),
                    });
                }
                break;
            }
            cur = s.next;
        }
        Err(Error::NotAllocated { ptr })
    }

    /// The head of the segment containing `addr`, or `NIL`.
    fn segment_of(&self, addr: u64) -> u32 {
        let slots = self.arena.slots();
        let h = index::floor::<SegmentIndex>(slots, self.seg_root, addr);
        if h != NIL && addr - slots[h as usize].addr < slots[h as usize].seg_size {
            h
        } else {
            NIL
        }
    }

    // ------------------------------------------------------ index upkeep

    #[inline]
    fn cache_insert(&mut self, i: u32) {
        let p = pool_idx(pool_of(self.slot(i).flags));
        let clock = self.pools[p].gc_clock;
        let s = self.slot_mut(i);
        s.aux = clock;
        s.flags.insert(Flags::CACHED);
        index::insert::<FreeIndex>(self.arena.slots_mut(), &mut self.pools[p].root, i);
        self.pools[p].len += 1;
    }

    #[inline]
    fn cache_remove(&mut self, i: u32) {
        let p = pool_idx(pool_of(self.slot(i).flags));
        self.slot_mut(i).flags.remove(Flags::CACHED);
        if index::remove::<FreeIndex>(self.arena.slots_mut(), &mut self.pools[p].root, i) {
            self.pools[p].len -= 1;
        }
    }

    // ------------------------------------------------------------ malloc

    /// `get_free_block`: the smallest cached block of this stream and pool
    /// that fits, subject to the oversize rules; removed from the index.
    #[inline]
    fn get_free_block(&mut self, pool: Pool, skey: u64, size: u64) -> u32 {
        let p = pool_idx(pool);
        if self.set_fraction && self.config.garbage_collection_threshold > 0.0 {
            self.pools[p].gc_clock += 1;
        }
        let b = index::lower_bound::<FreeIndex>(
            self.arena.slots(),
            self.pools[p].root,
            (skey, size, 0),
        );
        if b == NIL {
            return NIL;
        }
        let s = self.slot(b);
        let mss = self.config.max_split_size;
        if s.stream != skey
            || (size < mss && s.size >= mss)
            || (size >= mss && s.size >= size.saturating_add(self.config.max_non_split_rounding))
        {
            return NIL;
        }
        // Still in the free index: `alloc_found_block` takes it out, or
        // re-keys it in place as the remainder of a split.
        b
    }

    fn trigger_free_memory_callbacks(&mut self) -> bool {
        let mut freed = false;
        let mut k = 0;
        while k < self.callbacks.len() {
            let cb = self.callbacks[k];
            freed |= cb(self);
            k += 1;
        }
        freed
    }

    /// `alloc_block`: a new segment from the device, or `NIL` when the device
    /// or the memory limit refuses.
    fn alloc_block(
        &mut self,
        pool: Pool,
        skey: u64,
        alloc_size: u64,
        is_retry: bool,
    ) -> Res<u32, B> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        if self.set_fraction
            && self.total_allocated_memory.saturating_add(alloc_size) > self.allowed_memory_maximum
        {
            return Ok(NIL);
        }
        if self.arena.available() == 0 {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        }
        let ptr = match self.backend.malloc(alloc_size) {
            Ok(p) => p,
            Err(MallocError::OutOfMemory) => return Ok(NIL),
            Err(MallocError::Other(e)) => return Err(Error::Backend(e)),
        };
        if ptr.is_null() {
            return Err(Error::BackendContract {
                what: "malloc returned null",
                ptr,
            });
        }
        // Segments must not overlap: the held segment with the highest base
        // below the new end is the only one that could.
        let Some(end) = ptr.0.checked_add(alloc_size) else {
            return Err(Error::BackendContract {
                what: "malloc returned a range past the address space",
                ptr,
            });
        };
        let h = index::floor::<SegmentIndex>(self.arena.slots(), self.seg_root, end - 1);
        if h != NIL && self.slot(h).addr + self.slot(h).seg_size > ptr.0 {
            return Err(Error::BackendContract {
                what: "malloc returned memory overlapping a held segment",
                ptr,
            });
        }
        let Some(i) = self.arena.alloc() else {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        };
        let s = self.slot_mut(i);
        s.addr = ptr.0;
        s.size = alloc_size;
        s.seg_size = alloc_size;
        s.stream = skey;
        s.flags.insert(pool_flag(pool));
        index::insert::<SegmentIndex>(self.arena.slots_mut(), &mut self.seg_root, i);
        self.segments += 1;
        self.total_allocated_memory += alloc_size;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, alloc_size);
        if alloc_size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        Ok(i)
    }

    /// `alloc_found_block`: split if the policy says so (the allocation takes
    /// the low end), mark allocated, count.
    fn alloc_found_block(&mut self, found: u32, orig: u64, size: u64, pool: Pool) -> Allocation {
        let i = found;
        let already_split = self.slot(i).is_split();
        let bsize = self.slot(i).size;
        let split = policy::should_split(pool, bsize, size, &self.config);
        // Fast split: a cached block that is not a segment head, with a
        // remainder at least as large as the request, stays in the free
        // index as the remainder, re-keyed in place: its new key (same
        // stream, smaller size, higher address) is still above every key
        // below it, because it was the lower bound of (stream, size, 0) and
        // the remainder's key is not below that. The allocation takes a new
        // slot at the low end. This saves a remove and an insert; segment
        // heads never move.
        let in_place = split
            && self.slot(i).has(Flags::CACHED)
            && self.slot(i).prev != NIL
            && bsize - size >= size;
        let fast = if in_place { self.arena.alloc() } else { None };
        if let Some(n) = fast {
            let clock = self.pools[pool_idx(pool)].gc_clock;
            let (addr, stream, prev) = {
                let s = self.slot(i);
                (s.addr, s.stream, s.prev)
            };
            let ns = self.slot_mut(n);
            ns.addr = addr;
            ns.size = size;
            ns.stream = stream;
            ns.flags.insert(pool_flag(pool));
            ns.prev = prev;
            ns.next = i;
            self.slot_mut(prev).next = n;
            let rs = self.slot_mut(i);
            rs.prev = n;
            rs.addr = addr + size;
            rs.size = bsize - size;
            rs.aux = clock; // re-cached now, as PyTorch re-inserts the remainder
            self.stats.inactive_split_bytes.decrease(pool, size);
            return self.mark_allocated(n, orig, pool);
        }
        if self.slot(i).has(Flags::CACHED) {
            self.cache_remove(i);
        }
        let remainder = if split { self.arena.alloc() } else { None };
        if let Some(r) = remainder {
            let (addr, stream, next) = {
                let s = self.slot(i);
                (s.addr, s.stream, s.next)
            };
            let rs = self.slot_mut(r);
            rs.addr = addr + size;
            rs.size = bsize - size;
            rs.stream = stream;
            rs.flags.insert(pool_flag(pool));
            rs.prev = i;
            rs.next = next;
            if next != NIL {
                self.slot_mut(next).prev = r;
            }
            let s = self.slot_mut(i);
            s.next = r;
            s.size = size;
            self.cache_insert(r);
            if already_split {
                self.stats.inactive_split_bytes.decrease(pool, size);
            } else {
                self.stats.inactive_split_bytes.increase(pool, bsize - size);
                self.stats.inactive_split.increase(pool, 1);
            }
        } else if already_split {
            self.stats.inactive_split_bytes.decrease(pool, bsize);
            self.stats.inactive_split.decrease(pool, 1);
        }
        self.mark_allocated(i, orig, pool)
    }

    /// Hand block `i` out: allocated, live-indexed, counted.
    #[inline]
    fn mark_allocated(&mut self, i: u32, orig: u64, pool: Pool) -> Allocation {
        let allocation_id = self.next_allocation_id;
        self.next_allocation_id += 1;
        let s = self.slot_mut(i);
        s.flags.insert(Flags::ALLOCATED);
        s.requested = orig;
        s.aux = allocation_id;
        let (addr, bs, generation) = (s.addr, s.size, s.generation);
        self.live_insert(i);
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.allocated_bytes.increase(pool, bs);
        st.active.increase(pool, 1);
        st.active_bytes.increase(pool, bs);
        st.requested_bytes.increase(pool, orig);
        if bs >= self.config.max_split_size {
            st.oversize_allocations.increase(1);
        }
        Allocation {
            ptr: DevicePtr(addr),
            id: Some(BlockId::new(i, generation)),
            size: bs,
            requested: orig,
            allocation_id,
        }
    }

    fn out_of_memory(&mut self, orig: u64, size: u64, alloc_size: u64) -> Error<B::Error> {
        let info = self.backend.mem_info().unwrap_or_default();
        self.stats.num_ooms += 1;
        Error::OutOfMemory(OomReport {
            device: self.backend.ordinal(),
            requested: orig,
            rounded: size,
            alloc_size,
            device_total: info.total,
            device_free: info.free,
            allowed: self.memory_limit(),
            allocated: self.stats.allocated_bytes.all().current.max(0) as u64,
            reserved: self.stats.reserved_bytes.all().current.max(0) as u64,
        })
    }

    // -------------------------------------------------------------- free

    fn record_stream_slot(&mut self, i: u32, stream: B::Stream) -> Res<(), B> {
        let key: u64 = stream.into();
        if key == self.slot(i).stream || self.uses.iter().any(|u| u.slot == i && u.stream == stream)
        {
            return Ok(());
        }
        self.uses
            .push(StreamUse { slot: i, stream })
            .map_err(|_| Error::StreamUsesFull { capacity: E })?;
        self.slot_mut(i).flags.insert(Flags::HAS_USES);
        Ok(())
    }

    fn recycle_event(&mut self, ev: B::Event) {
        if let Err(ev) = self.idle_events.push(ev) {
            // Unreachable while events in existence <= E; destroy rather than leak.
            let _ = self.backend.event_destroy(ev);
        }
    }

    fn unwind_pending(&mut self, len: usize, queues: usize) {
        while self.pending.len() > len {
            if let Some(pe) = self.pending.pop() {
                self.recycle_event(pe.event);
            }
        }
        self.queue_order.truncate(queues);
    }

    /// PyTorch's `free`: allocation stats drop now; the block returns to the
    /// cache now, or after its end-of-life events (`insert_events`).
    fn free_slot(&mut self, i: u32) -> Res<(), B> {
        let has_uses = self.slot(i).has(Flags::HAS_USES);
        let mut events = 0u16;
        if has_uses {
            // Record one event per other stream first, so a failure leaves the
            // allocation live and untouched.
            let needed = self.uses.iter().filter(|u| u.slot == i).count();
            if self.pending.len() + needed > E {
                // Make room from events that have completed (PyTorch's queues
                // are unbounded; ours drain before they refuse).
                self.process_events()?;
                if self.pending.len() + needed > E {
                    return Err(Error::EventQueueFull { capacity: E });
                }
            }
            let start = self.pending.len();
            let start_queues = self.queue_order.len();
            // One event per stream, in increasing stream order (as the
            // reference model does; PyTorch iterates a hash set).
            let mut last: Option<u64> = None;
            while let Some(u) = self
                .uses
                .iter()
                .filter(|u| u.slot == i && last.is_none_or(|l| u.stream.into() > l))
                .min_by_key(|u| u.stream.into())
                .copied()
            {
                last = Some(u.stream.into());
                let ev = match self.idle_events.pop() {
                    Some(ev) => ev,
                    None => match self.backend.event_create() {
                        Ok(ev) => ev,
                        Err(e) => {
                            self.unwind_pending(start, start_queues);
                            return Err(Error::Backend(e));
                        }
                    },
                };
                if let Err(e) = self.backend.event_record(&ev, u.stream) {
                    self.recycle_event(ev);
                    self.unwind_pending(start, start_queues);
                    return Err(Error::Backend(e));
                }
                let key: u64 = u.stream.into();
                if !self.queue_order.contains(&key) && self.queue_order.push(key).is_err() {
                    self.recycle_event(ev);
                    self.unwind_pending(start, start_queues);
                    return Err(Error::EventQueueFull { capacity: E });
                }
                if let Err(pe) = self.pending.push(PendingEvent {
                    event: ev,
                    slot: i,
                    stream: u.stream,
                }) {
                    self.recycle_event(pe.event);
                    self.unwind_pending(start, start_queues);
                    return Err(Error::EventQueueFull { capacity: E });
                }
                events += 1;
            }
            self.uses.retain(|u| u.slot != i);
        }
        self.live_remove(i);
        let s = self.slot_mut(i);
        s.flags.remove(Flags::ALLOCATED | Flags::HAS_USES);
        s.generation = s.generation.wrapping_add(1).max(1);
        s.events = events;
        let (pool, size) = (pool_of(s.flags), s.size);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if events == 0 {
            self.free_block(i);
        }
        Ok(())
    }

    /// `free_block`: merge with cached neighbours and cache the result. The
    /// lower block survives a merge, so a segment's head slot never changes.
    fn free_block(&mut self, i: u32) {
        let (pool, orig_size, requested) = {
            let s = self.slot(i);
            (pool_of(s.flags), s.size, s.requested)
        };
        // Fast merge: the block below is not cached and the block above, T,
        // is. T absorbs the freed block in place when its grown key (same
        // stream, larger size, lower address) stays below T's successor in
        // the free index: one search instead of a remove and an insert.
        // Segment heads never move (the freed block has a predecessor).
        let (p, n) = (self.slot(i).prev, self.slot(i).next);
        if p != NIL
            && !self.slot(p).has(Flags::CACHED)
            && n != NIL
            && self.slot(n).has(Flags::CACHED)
        {
            let key = {
                let t = self.slot(n);
                (t.stream, t.size, t.addr)
            };
            let grown = (key.0, key.1 + orig_size, key.2 - orig_size);
            let pi = pool_idx(pool);
            let succ = index::successor::<FreeIndex>(self.arena.slots(), self.pools[pi].root, key);
            if succ == NIL || {
                let s = self.slot(succ);
                (s.stream, s.size, s.addr) > grown
            } {
                let clock = self.pools[pi].gc_clock;
                let ts = self.slot_mut(n);
                ts.addr = grown.2;
                ts.size = grown.1;
                ts.prev = p;
                ts.aux = clock; // re-cached now
                self.slot_mut(p).next = n;
                self.arena.release(i);
                // One cached block absorbed the freed one: the split count is
                // unchanged and the cached bytes grow by the freed block.
                let st = &mut self.stats;
                st.inactive_split_bytes.increase(pool, orig_size);
                st.active.decrease(pool, 1);
                st.active_bytes.decrease(pool, orig_size);
                st.requested_bytes.decrease(pool, requested);
                return;
            }
        }
        let mut net_blocks = 0i64;
        let mut net_bytes = 0i64;
        let mut b = i;
        if p != NIL && self.slot(p).has(Flags::CACHED) {
            let psize = self.slot(p).size;
            self.cache_remove(p);
            let (bsize, bnext) = (self.slot(b).size, self.slot(b).next);
            let ps = self.slot_mut(p);
            ps.size += bsize;
            ps.next = bnext;
            if bnext != NIL {
                self.slot_mut(bnext).prev = p;
            }
            self.arena.release(b);
            b = p;
            net_blocks -= 1;
            net_bytes -= psize as i64;
        }
        let n = self.slot(b).next;
        if n != NIL && self.slot(n).has(Flags::CACHED) {
            let (nsize, nnext) = (self.slot(n).size, self.slot(n).next);
            self.cache_remove(n);
            let bs = self.slot_mut(b);
            bs.size += nsize;
            bs.next = nnext;
            if nnext != NIL {
                self.slot_mut(nnext).prev = b;
            }
            self.arena.release(n);
            net_blocks -= 1;
            net_bytes -= nsize as i64;
        }
        self.cache_insert(b);
        if self.slot(b).is_split() {
            net_blocks += 1;
            net_bytes += self.slot(b).size as i64;
        }
        let st = &mut self.stats;
        st.inactive_split.apply(pool, net_blocks);
        st.inactive_split_bytes.apply(pool, net_bytes);
        st.active.decrease(pool, 1);
        st.active_bytes.decrease(pool, orig_size);
        st.requested_bytes.decrease(pool, requested);
    }

    fn event_done(&mut self, slot: u32) {
        let s = self.slot_mut(slot);
        s.events = s.events.saturating_sub(1);
        if s.events == 0 {
            self.free_block(slot);
        }
    }

    /// The position in `pending` of the first event of stream `key` at or after `from`.
    fn next_of_stream(&self, key: u64, from: usize) -> Option<usize> {
        (from..self.pending.len()).find(|&k| self.pending[k].stream.into() == key)
    }

    /// `process_events`: stream queue by stream queue (in the order the
    /// queues were created), complete events in FIFO order until the first
    /// that is still pending. The order matters for the accumulated
    /// `inactive_split*` counters when neighbouring blocks complete together;
    /// it is the reference model's (PyTorch's is its hash map's order).
    fn process_events(&mut self) -> Res<(), B> {
        let mut q = 0;
        while q < self.queue_order.len() {
            let key = self.queue_order[q];
            let mut k = 0;
            while let Some(at) = self.next_of_stream(key, k) {
                match self
                    .backend
                    .event_query(&self.pending[at].event)
                    .map_err(Error::Backend)?
                {
                    EventStatus::Pending => break,
                    EventStatus::Ready => {
                        let pe = self.pending.remove(at);
                        self.recycle_event(pe.event);
                        self.event_done(pe.slot);
                        k = at;
                    }
                }
            }
            if self.next_of_stream(key, 0).is_none() {
                self.queue_order.remove(q);
            } else {
                q += 1;
            }
        }
        Ok(())
    }

    /// `synchronize_and_free_events`: wait for every pending event, queue by
    /// queue.
    fn synchronize_and_free_events(&mut self) -> Res<(), B> {
        self.stats.num_sync_all_streams += 1;
        while let Some(&key) = self.queue_order.first() {
            while let Some(at) = self.next_of_stream(key, 0) {
                self.backend
                    .event_synchronize(&self.pending[at].event)
                    .map_err(Error::Backend)?;
                let pe = self.pending.remove(at);
                self.recycle_event(pe.event);
                self.event_done(pe.slot);
            }
            self.queue_order.remove(0);
        }
        Ok(())
    }

    // ----------------------------------------------------------- release

    /// `release_block`: give a whole cached segment back to the device. On a
    /// backend failure nothing changes.
    fn release_block(&mut self, i: u32) -> Res<(), B> {
        let (addr, size, pool) = {
            let s = self.slot(i);
            (s.addr, s.size, pool_of(s.flags))
        };
        self.backend
            .free(DevicePtr(addr), size)
            .map_err(Error::Backend)?;
        self.cache_remove(i);
        index::remove::<SegmentIndex>(self.arena.slots_mut(), &mut self.seg_root, i);
        self.segments -= 1;
        self.total_allocated_memory -= size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.arena.release(i);
        Ok(())
    }

    /// Whether a head slot is a cached whole segment.
    #[inline]
    fn is_whole_free(&self, h: u32) -> bool {
        let s = self.slot(h);
        s.has(Flags::CACHED) && s.next == NIL
    }

    /// `release_available_cached_blocks`: free cached oversize segments of
    /// this stream and pool, one big enough or several largest-first.
    ///
    /// Deliberate difference: PyTorch may hand a block that is only part of a
    /// split segment to `cudaFree` here (after a run-time `max_split_size`
    /// change); such blocks are skipped.
    fn release_available_cached_blocks(
        &mut self,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<bool, B> {
        let mss = self.config.max_split_size;
        if mss == u64::MAX {
            return Ok(false);
        }
        let p = pool_idx(pool);
        let key = size.max(mss);
        let b =
            index::lower_bound::<FreeIndex>(self.arena.slots(), self.pools[p].root, (skey, key, 0));
        if b != NIL && self.slot(b).stream == skey {
            if self.slot(b).is_split() {
                return Ok(false);
            }
            self.release_block(b)?;
            return Ok(true);
        }
        let mut released = 0u64;
        let mut cur =
            index::predecessor::<FreeIndex>(self.arena.slots(), self.pools[p].root, (skey, key, 0));
        while released < key && cur != NIL {
            let s = self.slot(cur);
            if s.size < mss || s.stream != skey {
                break;
            }
            let k = (s.stream, s.size, s.addr);
            if !s.is_split() {
                released += s.size;
                self.release_block(cur)?;
            }
            cur = index::predecessor::<FreeIndex>(self.arena.slots(), self.pools[p].root, k);
        }
        Ok(released >= key)
    }

    /// `release_cached_blocks`: wait for all events, then release every
    /// whole cached segment, large pool first.
    fn release_cached_blocks(&mut self) -> Res<(), B> {
        self.synchronize_and_free_events()?;
        self.release_whole_segments(Pool::Large)?;
        self.release_whole_segments(Pool::Small)
    }

    fn release_whole_segments(&mut self, pool: Pool) -> Res<(), B> {
        let mut cur = index::first::<SegmentIndex>(self.arena.slots(), self.seg_root);
        while cur != NIL {
            let next = index::successor::<SegmentIndex>(
                self.arena.slots(),
                self.seg_root,
                self.slot(cur).addr,
            );
            if pool_of(self.slot(cur).flags) == pool && self.is_whole_free(cur) {
                self.release_block(cur)?;
            }
            cur = next;
        }
        Ok(())
    }

    /// `garbage_collect_cached_blocks`: free whole cached large segments
    /// whose age (large-pool lookups since they were cached) is at least the
    /// average, pass after pass, until reserved memory is under the threshold.
    fn garbage_collect_cached_blocks(&mut self) -> Res<(), B> {
        let gc_threshold =
            (self.config.garbage_collection_threshold * self.allowed_memory_maximum as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - gc_threshold;
        let clock = self.pools[pool_idx(Pool::Large)].gc_clock;
        let age = |s: &BlockSlot| clock.wrapping_sub(s.aux);
        let (mut total_age, mut count) = (0u64, 0u64);
        let mut cur = index::first::<SegmentIndex>(self.arena.slots(), self.seg_root);
        while cur != NIL {
            let s = self.slot(cur);
            if pool_of(s.flags) == Pool::Large && self.is_whole_free(cur) {
                total_age += age(s);
                count += 1;
            }
            cur = index::successor::<SegmentIndex>(self.arena.slots(), self.seg_root, s.addr);
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let mut cur = index::first::<SegmentIndex>(self.arena.slots(), self.seg_root);
            while cur != NIL {
                let s = self.slot(cur);
                let next =
                    index::successor::<SegmentIndex>(self.arena.slots(), self.seg_root, s.addr);
                if pool_of(s.flags) == Pool::Large
                    && self.is_whole_free(cur)
                    && age(s) as f64 >= threshold
                {
                    let (a, size) = (age(s), s.size);
                    self.release_block(cur)?;
                    freed = true;
                    reclaimed += size;
                    total_age -= a;
                    count -= 1;
                }
                cur = next;
            }
        }
        Ok(())
    }
}
