//! `alloc_found_block`: hand out a cached block or a new segment, splitting
//! off the remainder when the policy says so (the allocation takes the low
//! end), and count it.

use super::DeviceAllocator;
use crate::allocation::Allocation;
use crate::arena::{BlockId, BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::history::HistoryStorage;
use crate::history::TraceAction;
use crate::policy;
use crate::pool::Pool;
use crate::torch_version::BlockOrder;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Serve a request of `orig` bytes (rounded: `size`) from block `found`.
    pub(super) fn alloc_found_block(
        &mut self,
        found: u32,
        orig: u64,
        size: u64,
        pool: Pool,
    ) -> Allocation {
        let split = self.wants_split(found, size, pool);
        self.carve(found, orig, size, pool, split)
    }

    /// Whether serving `size` bytes from block `i` splits off the rest:
    /// PyTorch's rule, never in a pool whose blocks are not split, and by
    /// the rule of plain segments in a pool with a segment source (whose
    /// requests PyTorch never counts as expandable).
    #[inline]
    pub(super) fn wants_split(&self, i: u32, size: u64, pool: Pool) -> bool {
        let (bsize, owner) = (self.slot(i).size, self.slot(i).owner);
        let maps_pages = self.shape.maps_pages;
        if owner == 0 {
            return policy::should_split_as(pool, bsize, size, &self.config, maps_pages);
        }
        match self.private.get(owner) {
            Some(p) if p.options.no_split => false,
            Some(p) => policy::should_split_as(
                pool,
                bsize,
                size,
                &self.config,
                maps_pages && p.source.is_none(),
            ),
            None => policy::should_split_as(pool, bsize, size, &self.config, maps_pages),
        }
    }

    /// Hand out the low `size` bytes of block `found` for a request of `orig`
    /// bytes, splitting off the rest if `split` (and a slot is free).
    pub(super) fn carve(
        &mut self,
        found: u32,
        orig: u64,
        size: u64,
        pool: Pool,
        split: bool,
    ) -> Allocation {
        let i = found;
        let bsize = self.slot(i).size;
        if split && self.can_split_in_place(i, size) {
            if let Some(n) = self.arena.alloc() {
                self.split_in_place(i, n, size, pool);
                return self.mark_allocated(n, orig, pool);
            }
        }
        let already_split = self.slot(i).is_split();
        let expandable = self.slot(i).has(Flags::EXPANDABLE);
        if self.slot(i).has(Flags::CACHED) {
            self.cache_remove(i);
        }
        let remainder = if split { self.arena.alloc() } else { None };
        if let Some(r) = remainder {
            self.split_off_remainder(i, r, size, pool);
            self.cache_insert(r);
        }
        if !expandable {
            self.count_carve(
                pool,
                already_split,
                bsize,
                remainder.is_some().then_some(size),
            );
        }
        self.mark_allocated(i, orig, pool)
    }

    /// Whether block `i` can stay in the free index as the remainder of a
    /// split, re-keyed in place: it is cached, not a segment head (heads
    /// never move), and the remainder is at least as large as the request.
    /// Its new key (same stream, smaller size, higher address) is then still
    /// above every key below it: it was the lower bound of (stream, size, 0)
    /// and the remainder's key is not below that. This saves a remove and an
    /// insert. The remainder must also stay in the block's size class of
    /// the free index. (An expandable block may not be the lower bound: best fit
    /// can pass over smaller blocks to reach it.)
    pub(super) fn can_split_in_place(&self, i: u32, size: u64) -> bool {
        let s = self.slot(i);
        s.has(Flags::CACHED)
            && s.prev != NIL
            && s.size - size >= size
            && !s.has(Flags::EXPANDABLE)
            && self.free_index_of(i).may_resize(s.size, s.size - size)
    }

    /// The fast split: the allocation takes a new slot `n` at the low end of
    /// cached block `i`; `i` keeps the remainder and its place in the index.
    fn split_in_place(&mut self, i: u32, n: u32, size: u64, pool: Pool) {
        let clock = self.free_index_of(i).gc_clock();
        let (addr, stream, prev, bsize, owner, expandable, parent) = {
            let s = self.slot(i);
            (
                s.addr,
                s.stream,
                s.prev,
                s.size,
                s.owner,
                s.flags & Flags::EXPANDABLE,
                s.counter,
            )
        };
        // The allocation is torch's new `Block`; the remainder the old one.
        let counter = self.piece_counter(parent);
        let ns = self.slot_mut(n);
        ns.addr = addr;
        ns.size = size;
        ns.stream = stream;
        ns.counter = counter;
        ns.owner = owner;
        ns.flags.insert(pool.flag() | expandable);
        ns.prev = prev;
        ns.next = i;
        self.slot_mut(prev).next = n;
        let rs = self.slot_mut(i);
        rs.prev = n;
        rs.addr = addr + size;
        rs.size = bsize - size;
        rs.aux = clock; // re-cached now, as PyTorch re-inserts the remainder
        if expandable.is_empty() {
            self.count_split_in_place(pool, size);
        }
    }

    /// The general split: block `i` keeps the low `size` bytes, the new slot
    /// `r` the rest (not yet cached). The rest keeps the block's last
    /// request: in PyTorch the remainder is the old block object, which a
    /// snapshot shows.
    pub(super) fn split_off_remainder(&mut self, i: u32, r: u32, size: u64, pool: Pool) {
        let (addr, stream, next, bsize, requested, owner, expandable, old) = {
            let s = self.slot(i);
            (
                s.addr,
                s.stream,
                s.next,
                s.size,
                s.requested,
                s.owner,
                s.flags & Flags::EXPANDABLE,
                s.counter,
            )
        };
        // The remainder is torch's old `Block` (its number); the part kept
        // here is the new one (a number of its own under torch 2.12).
        if self.config.block_order() == BlockOrder::RegistrationCounter {
            let fresh = self.piece_counter(old);
            self.slot_mut(i).counter = fresh;
        }
        let rs = self.slot_mut(r);
        rs.counter = old;
        rs.requested = requested;
        rs.owner = owner;
        rs.addr = addr + size;
        rs.size = bsize - size;
        rs.stream = stream;
        rs.flags.insert(pool.flag() | expandable);
        rs.prev = i;
        rs.next = next;
        if next != NIL {
            self.slot_mut(next).prev = r;
        }
        let s = self.slot_mut(i);
        s.next = r;
        s.size = size;
    }

    /// Hand block `i` out: allocated, live-indexed, counted.
    #[inline]
    fn mark_allocated(&mut self, i: u32, orig: u64, pool: Pool) -> Allocation {
        debug_assert!(
            !self.slot(i).flags.intersects(Flags::ALLOCATED | Flags::CACHED | Flags::UNMAPPED)
                && self.slot(i).events == 0
                && Pool::of(self.slot(i).flags) == pool,
            "mark_allocated: block {i} is not a free, mapped, uncached block of the {pool:?} pool ({:?})",
            self.slot(i).flags
        );
        let allocation_id = self.next_allocation_id;
        self.next_allocation_id += 1;
        let s = self.slot_mut(i);
        s.flags.insert(Flags::ALLOCATED);
        s.requested = orig;
        s.aux = allocation_id;
        let (addr, bs, generation) = (s.addr, s.size, s.generation);
        self.live.insert(self.arena.slots_mut(), i);
        self.record_block(TraceAction::Alloc, i);
        self.count_allocated(pool, bs, orig);
        Allocation {
            ptr: DevicePtr(addr),
            handle: Some(BlockId::new(i, generation)),
            size: bs,
            requested_size: orig,
            allocation_id,
        }
    }
}
