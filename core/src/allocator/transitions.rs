//! The transitions every block goes through, each in one function that
//! changes the block, its index and the statistics it affects, with the
//! local invariants asserted in debug builds (the unit tests, the fuzz
//! targets and the loom models build in debug, so they check them at every
//! step; release builds compile the checks away):
//!
//! - cached / uncached: [`cache_insert`](DeviceAllocator::cache_insert),
//!   [`cache_remove`](DeviceAllocator::cache_remove);
//! - bytes joining or leaving the reserve (a new segment or mapped pages,
//!   a released segment or unmapped pages):
//!   [`reserve`](DeviceAllocator::reserve),
//!   [`unreserve`](DeviceAllocator::unreserve);
//! - a freed block leaving the active set once its frees are done:
//!   [`leave_active`](DeviceAllocator::leave_active);
//! - the counts of a block handed out and freed (`count_allocated`,
//!   `count_freed`), and of cached split blocks as blocks are split, cut
//!   and merged (`count_carve`, `count_split_in_place`, `count_cut`,
//!   `count_merge`).
//!
//! Every `DeviceStats` counter of blocks and of the reserve changes here
//! and nowhere else (a private pool's own segment count also changes where
//! an expandable segment's address space is reserved and released); the
//! links and
//! indexes change in the transitions that call these (`split.rs`,
//! `free.rs`, `aligned.rs`, `expandable.rs`), which assert their entry
//! states (`mark_allocated`, `free_slot`, `release_block`). The O(n)
//! [`check_invariants`](DeviceAllocator::check_invariants) re-derives
//! everything from the block lists; these checks are its O(1) local part.

use super::DeviceAllocator;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::history::HistoryStorage;
use crate::pool::Pool;
use crate::private_pool::block_pool_mut;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Put block `i` in its pool's free index (it is cached from now, at the
    /// pool's current GC clock). It must be free: not cached already, not
    /// allocated, not unmapped, no free pending on events or a capture,
    /// linked with its neighbours.
    #[inline]
    pub(super) fn cache_insert(&mut self, i: u32) {
        debug_assert!(
            self.may_be_cached(i),
            "cache_insert: block {i} is not a free block ({:?}, {} events)",
            self.slot(i).flags,
            self.slot(i).events
        );
        let s = &self.arena.slots()[i as usize];
        let (owner, kind) = (s.owner, Pool::of(s.flags));
        let pool = block_pool_mut(&mut self.pools, &mut self.private, owner, kind);
        let s = &mut self.arena.slots_mut()[i as usize];
        s.aux = pool.gc_clock();
        s.flags.insert(Flags::CACHED);
        pool.insert(self.arena.slots_mut(), i);
    }

    /// Take block `i` out of its pool's free index (it must be in it).
    #[inline]
    pub(super) fn cache_remove(&mut self, i: u32) {
        debug_assert!(
            self.slot(i).has(Flags::CACHED),
            "cache_remove: block {i} is not cached ({:?})",
            self.slot(i).flags
        );
        let s = &self.arena.slots()[i as usize];
        let (owner, kind) = (s.owner, Pool::of(s.flags));
        let pool = block_pool_mut(&mut self.pools, &mut self.private, owner, kind);
        self.arena.slots_mut()[i as usize]
            .flags
            .remove(Flags::CACHED);
        let found = pool.remove(self.arena.slots_mut(), i);
        debug_assert!(found, "cache_remove: block {i} was not in its free index");
    }

    /// `bytes` of `pool` (of private pool `owner`) join the reserve: a new
    /// segment (`segment`: it counts in `segment` and may be oversize), or
    /// pages mapped into an expandable segment (they raise the high-water
    /// mark of the reserve `policy:compact` keeps).
    #[inline]
    pub(super) fn reserve(&mut self, owner: u8, pool: Pool, bytes: u64, segment: bool) {
        if let Some(p) = self.private.get_mut(owner) {
            p.segments += u32::from(segment);
            p.reserved += bytes;
            p.peak = p.peak.max(p.reserved);
            p.reserved_stats.increase(pool, bytes);
        }
        self.total_allocated_memory += bytes;
        if segment {
            self.stats.segment.increase(pool, 1);
            if bytes >= self.config.max_split_size {
                self.stats.oversize_segments.increase(1);
            }
        } else {
            self.reserved_high = self.reserved_high.max(self.total_allocated_memory);
        }
        self.stats.reserved_bytes.increase(pool, bytes);
        self.stats.num_device_alloc += 1;
        self.debug_reserve_matches();
    }

    /// `bytes` of `pool` (of private pool `owner`) leave the reserve: a
    /// released segment (`segment`), or pages unmapped from an expandable
    /// one.
    #[inline]
    pub(super) fn unreserve(&mut self, owner: u8, pool: Pool, bytes: u64, segment: bool) {
        if let Some(p) = self.private.get_mut(owner) {
            p.segments -= u32::from(segment);
            p.reserved -= bytes;
            p.reserved_stats.decrease(pool, bytes);
        }
        debug_assert!(
            self.total_allocated_memory >= bytes,
            "unreserve: {bytes} bytes leave a reserve of {}",
            self.total_allocated_memory
        );
        self.total_allocated_memory -= bytes;
        if segment {
            self.stats.segment.decrease(pool, 1);
            if bytes >= self.config.max_split_size {
                self.stats.oversize_segments.decrease(1);
            }
        }
        self.stats.reserved_bytes.decrease(pool, bytes);
        self.stats.num_device_free += 1;
        self.debug_reserve_matches();
    }

    /// A freed block of `size` bytes (its last request `requested`) stops
    /// being active: its frees are done and it is cached (PyTorch counts a
    /// block pending on events as active).
    #[inline]
    pub(super) fn leave_active(&mut self, pool: Pool, size: u64, requested: u64) {
        let st = &mut self.stats;
        st.active.decrease(pool, 1);
        st.active_bytes.decrease(pool, size);
        st.requested_bytes.decrease(pool, requested);
        debug_assert!(
            st.active.all().current >= 0
                && st.active_bytes.all().current >= 0
                && st.requested_bytes.all().current >= 0,
            "leave_active: the active counts went negative"
        );
        debug_assert!(
            st.allocated_bytes.all().current <= st.active_bytes.all().current,
            "leave_active: more bytes allocated ({}) than active ({})",
            st.allocated_bytes.all().current,
            st.active_bytes.all().current
        );
    }

    /// A block of `size` bytes of `pool` is handed out for a request of
    /// `requested` bytes.
    #[inline]
    pub(super) fn count_allocated(&mut self, pool: Pool, size: u64, requested: u64) {
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.allocated_bytes.increase(pool, size);
        st.active.increase(pool, 1);
        st.active_bytes.increase(pool, size);
        st.requested_bytes.increase(pool, requested);
        if size >= self.config.max_split_size {
            st.oversize_allocations.increase(1);
        }
    }

    /// A block of `size` bytes of `pool` is freed by its user (it stays
    /// active until its frees are done: [`leave_active`](Self::leave_active)).
    #[inline]
    pub(super) fn count_freed(&mut self, pool: Pool, size: u64) {
        let st = &mut self.stats;
        st.allocation.decrease(pool, 1);
        st.allocated_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            st.oversize_allocations.decrease(1);
        }
        debug_assert!(
            st.allocation.all().current >= 0 && st.allocated_bytes.all().current >= 0,
            "count_freed: the allocated counts went negative"
        );
    }

    /// A cached block of `bsize` bytes (a split one: `already_split`) is
    /// handed out whole, or (`kept`: the bytes handed out) with its rest
    /// cached as a new split block. Not for expandable segments, which
    /// PyTorch leaves out of `inactive_split`.
    #[inline]
    pub(super) fn count_carve(
        &mut self,
        pool: Pool,
        already_split: bool,
        bsize: u64,
        kept: Option<u64>,
    ) {
        let st = &mut self.stats;
        match kept {
            Some(size) if already_split => st.inactive_split_bytes.decrease(pool, size),
            Some(size) => {
                st.inactive_split_bytes.increase(pool, bsize - size);
                st.inactive_split.increase(pool, 1);
            }
            None if already_split => {
                st.inactive_split_bytes.decrease(pool, bsize);
                st.inactive_split.decrease(pool, 1);
            }
            None => {}
        }
        self.debug_split_counts();
    }

    /// The fast split: `size` bytes leave a cached split block, which stays
    /// cached.
    #[inline]
    pub(super) fn count_split_in_place(&mut self, pool: Pool, size: u64) {
        self.stats.inactive_split_bytes.decrease(pool, size);
        self.debug_split_counts();
    }

    /// An aligned allocation cut the low end off a block of `bsize` bytes:
    /// both pieces count as cached split blocks until `carve` takes the
    /// high one (`counted`: the block was a cached split block already).
    #[inline]
    pub(super) fn count_cut(&mut self, pool: Pool, counted: bool, bsize: u64) {
        if counted {
            self.stats.inactive_split.increase(pool, 1);
        } else {
            self.stats.inactive_split.increase(pool, 2);
            self.stats.inactive_split_bytes.increase(pool, bsize);
        }
    }

    /// A freed block merged with its cached neighbours: the net change of
    /// cached split blocks and bytes.
    #[inline]
    pub(super) fn count_merge(&mut self, pool: Pool, blocks: i64, bytes: i64) {
        self.stats.inactive_split.apply(pool, blocks);
        self.stats.inactive_split_bytes.apply(pool, bytes);
        self.debug_split_counts();
    }

    /// The cached split counts are not negative (debug checks; a cut
    /// counts ahead and is settled by the carve that follows it).
    #[inline]
    fn debug_split_counts(&self) {
        debug_assert!(
            self.stats.inactive_split.all().current >= 0
                && self.stats.inactive_split_bytes.all().current >= 0,
            "the inactive_split counts went negative"
        );
    }

    /// Whether block `i` may go into the free index (debug checks).
    fn may_be_cached(&self, i: u32) -> bool {
        let s = self.slot(i);
        !s.flags
            .intersects(Flags::CACHED | Flags::ALLOCATED | Flags::UNMAPPED | Flags::DEFERRED)
            && s.events == 0
            && self.linked(i)
    }

    /// Whether block `i`'s neighbours point back at it and touch it
    /// (debug checks).
    pub(super) fn linked(&self, i: u32) -> bool {
        let slots = self.arena.slots();
        let s = &slots[i as usize];
        let prev_ok = s.prev == NIL || {
            let p = &slots[s.prev as usize];
            p.next == i && p.addr + p.size == s.addr
        };
        let next_ok = s.next == NIL || {
            let n = &slots[s.next as usize];
            n.prev == i && s.addr + s.size == n.addr
        };
        prev_ok && next_ok
    }

    /// The reserve the statistics count is the reserve the allocator holds
    /// (debug checks).
    #[inline]
    fn debug_reserve_matches(&self) {
        debug_assert_eq!(
            self.stats.reserved_bytes.all().current,
            self.total_allocated_memory as i64,
            "reserved_bytes differs from the bytes the device holds"
        );
    }
}
