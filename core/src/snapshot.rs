//! Snapshots that allocate nothing: [`Segments`] walks the segments in
//! address order, each a [`SegmentInfo`] whose [`Blocks`] walk its blocks;
//! [`CacheInfo`] sums the cached ones. PyTorch's `snapshot()` segments, with
//! its state names.

use crate::arena::{BlockSlot, Flags};
use crate::backend::DevicePtr;
use crate::config::Config;
use crate::history::HistoryEntries;
use crate::pool::Pool;
use crate::private_pool::{id_of, MempoolId, PrivatePool};
use crate::segment_index::SegmentIndex;

/// Cached (free) device memory.
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// # use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
/// # let mut a = DeviceAllocator::new(MockDevice::new(None), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let x = a.malloc(512, 0)?;
/// assert_eq!(a.cache_info().largest_block, (2 << 20) - 512);
/// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CacheInfo {
    /// Bytes in cached blocks (reserved and not active).
    pub cached_bytes: u64,
    /// The largest cached block.
    pub largest_block: u64,
}

/// The state of a block in a snapshot (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
#[non_exhaustive]
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

/// One segment in a snapshot (PyTorch's `SegmentInfo`). An expandable
/// segment shows as one segment per run of mapped pages, as in PyTorch.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SegmentInfo<'a, St> {
    slots: &'a [BlockSlot],
    head: u32,
    /// Base address.
    pub address: DevicePtr,
    /// Segment size (of an expandable segment: the mapped run's).
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active (allocated or pending) blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// Allocation stream.
    pub stream: St,
    /// The pool.
    pub pool: Pool,
    /// The private pool that owns it (PyTorch's `owner_private_pool_id`;
    /// [`MempoolId::DEFAULT`] for the default pools).
    pub pool_id: MempoolId,
    /// Number of blocks.
    pub block_count: u32,
    /// Part of an expandable segment (PyTorch's `is_expandable`).
    pub is_expandable: bool,
}

impl<'a, St> SegmentInfo<'a, St> {
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
        let s = self
            .slots
            .get(self.cur as usize)
            .filter(|s| !s.has(Flags::UNMAPPED))?;
        self.cur = s.next;
        Some(BlockInfo {
            address: DevicePtr(s.addr),
            size: s.size,
            requested_size: s.requested,
            state: state_of(s),
        })
    }
}

pub(crate) fn state_of(s: &BlockSlot) -> BlockState {
    if s.has(Flags::ALLOCATED) {
        BlockState::ActiveAllocated
    } else if s.events > 0 || s.has(Flags::DEFERRED) {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    }
}

/// Iterator over segments in address order (no allocation: each step is a
/// successor search in the segment index, or the next mapped run of an
/// expandable segment).
#[derive(Clone, Debug)]
pub struct Segments<'a, St> {
    slots: &'a [BlockSlot],
    index: SegmentIndex,
    pools: &'a [Option<PrivatePool>],
    /// The segment being walked (its head slot).
    seg: u32,
    /// Where the next run of it starts (`NIL`: the segment is done).
    at: u32,
    _stream: core::marker::PhantomData<St>,
}

impl<'a, St> Segments<'a, St> {
    /// The segments of `index`, from the lowest base; `pools` names the
    /// owners.
    pub(crate) fn new(
        slots: &'a [BlockSlot],
        index: SegmentIndex,
        pools: &'a [Option<PrivatePool>],
    ) -> Self {
        let seg = index.first(slots);
        Segments {
            slots,
            index,
            pools,
            seg,
            at: seg,
            _stream: core::marker::PhantomData,
        }
    }
}

impl<'a, St: From<u64>> Iterator for Segments<'a, St> {
    type Item = SegmentInfo<'a, St>;
    fn next(&mut self) -> Option<SegmentInfo<'a, St>> {
        let slots = self.slots;
        let (head, h) = loop {
            let seg = slots.get(self.seg as usize)?;
            let mut b = self.at;
            while let Some(s) = slots.get(b as usize).filter(|s| s.has(Flags::UNMAPPED)) {
                b = s.next;
            }
            match slots.get(b as usize) {
                Some(s) => break (b, s),
                None => {
                    self.seg = self.index.successor(slots, seg.addr);
                    self.at = self.seg;
                }
            }
        };
        let mut info = SegmentInfo {
            slots,
            head,
            address: DevicePtr(h.addr),
            total_size: 0,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: St::from(h.stream),
            pool: Pool::of(h.flags),
            pool_id: id_of(self.pools, h.owner),
            block_count: 0,
            is_expandable: h.has(Flags::EXPANDABLE),
        };
        // Resume after this run: at the unmapped block that ends it.
        let mut end = head;
        while let Some(s) = slots.get(end as usize).filter(|s| !s.has(Flags::UNMAPPED)) {
            end = s.next;
        }
        self.at = end;
        for b in info.blocks() {
            info.total_size += b.size;
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

/// PyTorch's `snapshot()`: one device's segments with their blocks, its
/// memory history (oldest first) and its allocator settings. Made by
/// `DeviceAllocator::snapshot`; nothing in it allocates.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Snapshot<'a, St> {
    /// The device's ordinal.
    pub device: u32,
    /// The segments, in address order.
    pub segments: Segments<'a, St>,
    /// The trace entries kept.
    pub history: HistoryEntries<'a>,
    /// Entries the ring buffer had to drop.
    pub dropped: u64,
    /// The settings.
    pub settings: AllocatorSettings,
    /// cachealloc's accounting of the device's memory by pool (beside
    /// PyTorch's keys; the default stream's view).
    pub fragmentation: crate::fragmentation::Fragmentation,
}

/// The allocator settings of a snapshot (PyTorch's `AllocatorConfigInfo`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AllocatorSettings {
    /// The policy: `max_split_size`, `garbage_collection_threshold`,
    /// `roundup_power2_divisions`; its `Display` is the settings string.
    pub config: Config,
    /// Expandable segments.
    pub expandable_segments: bool,
    /// PyTorch's pinned-memory setting, as the settings set it (host memory
    /// is not ours: it changes nothing).
    pub pinned_num_register_threads: u32,
    /// PyTorch's `release_lock_on_cudamalloc` as in force: false whatever
    /// the settings asked for (the device's lock is held through a device
    /// malloc; `Config::release_lock_on_malloc` keeps what was asked).
    pub release_lock_on_cudamalloc: bool,
    /// PyTorch's pinned-memory setting, as the settings set it (it changes
    /// nothing here).
    pub pinned_use_cuda_host_register: bool,
    /// PyTorch's `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
}

impl AllocatorSettings {
    /// The settings of an allocator with the default policy.
    pub const DEFAULT: AllocatorSettings = AllocatorSettings::of(Config::DEFAULT);

    /// The settings of an allocator with this policy.
    pub(crate) const fn of(config: Config) -> AllocatorSettings {
        AllocatorSettings {
            config,
            expandable_segments: config.expandable_segments,
            pinned_num_register_threads: config.host.pinned_num_register_threads,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: config.host.pinned_use_host_register,
            graph_capture_record_stream_reuse: config.graph_capture_record_stream_reuse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot reports what is in force: the settings may ask to release
    /// the lock during a device malloc, and cachealloc does not.
    #[test]
    fn release_lock_on_cudamalloc_is_reported_as_in_force() {
        let asked = Config::parse("release_lock_on_cudamalloc:True").expect("parses");
        assert!(asked.release_lock_on_malloc);
        assert!(!AllocatorSettings::of(asked).release_lock_on_cudamalloc);
    }
}
