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
/// # use cachealloc_core::{testing::TinyBackend, BlockSlot, Config, DeviceAllocator};
/// # let mut a = DeviceAllocator::new(TinyBackend::default(), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let x = a.malloc(512, 0)?;
/// assert_eq!(a.cache_info().largest_block, (2 << 20) - 512);
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
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

/// One segment in a snapshot (PyTorch's `SegmentInfo`).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct SegmentInfo<'a, St> {
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
    /// Allocation stream.
    pub stream: St,
    /// The pool.
    pub pool: Pool,
    /// The private pool that owns it (PyTorch's `owner_private_pool_id`;
    /// [`MempoolId::DEFAULT`] for the default pools).
    pub pool_id: MempoolId,
    /// Number of blocks.
    pub block_count: u32,
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
/// successor search in the segment index).
#[derive(Clone, Debug)]
pub struct Segments<'a, St> {
    slots: &'a [BlockSlot],
    index: SegmentIndex,
    pools: &'a [Option<PrivatePool>],
    cur: u32,
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
        Segments {
            slots,
            index,
            pools,
            cur: index.first(slots),
            _stream: core::marker::PhantomData,
        }
    }
}

impl<'a, St: From<u64>> Iterator for Segments<'a, St> {
    type Item = SegmentInfo<'a, St>;
    fn next(&mut self) -> Option<SegmentInfo<'a, St>> {
        let head = self.cur;
        let h = self.slots.get(head as usize)?;
        self.cur = self.index.successor(self.slots, h.addr);
        let mut info = SegmentInfo {
            slots: self.slots,
            head,
            address: DevicePtr(h.addr),
            total_size: h.seg_size,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: St::from(h.stream),
            pool: Pool::of(h.flags),
            pool_id: id_of(self.pools, h.owner),
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
}

/// The allocator settings of a snapshot (PyTorch's `AllocatorConfigInfo`).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct AllocatorSettings {
    /// The policy: `max_split_size`, `garbage_collection_threshold`,
    /// `roundup_power2_divisions`; its `Display` is the settings string.
    pub config: Config,
    /// Expandable segments (not supported: false).
    pub expandable_segments: bool,
    /// PyTorch's pinned-memory setting (host memory is not ours: 1).
    pub pinned_num_register_threads: u32,
    /// PyTorch's `release_lock_on_cudamalloc` (as configured; it changes
    /// nothing here).
    pub release_lock_on_cudamalloc: bool,
    /// PyTorch's pinned-memory setting (false).
    pub pinned_use_cuda_host_register: bool,
    /// PyTorch's `graph_capture_record_stream_reuse` (false).
    pub graph_capture_record_stream_reuse: bool,
}

impl AllocatorSettings {
    /// The settings of an allocator with the default policy.
    pub const DEFAULT: AllocatorSettings = AllocatorSettings::of(Config::DEFAULT);

    /// The settings of an allocator with this policy.
    pub(crate) const fn of(config: Config) -> AllocatorSettings {
        AllocatorSettings {
            config,
            expandable_segments: false,
            pinned_num_register_threads: 1,
            release_lock_on_cudamalloc: config.release_lock_on_malloc,
            pinned_use_cuda_host_register: false,
            graph_capture_record_stream_reuse: false,
        }
    }
}
