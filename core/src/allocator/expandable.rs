//! Expandable segments (`expandable_segments:True`): PyTorch's
//! `ExpandableSegment` with `find_expandable_block`, `map_block`,
//! `try_allocate_expandable_block`, `unmap_block` and
//! `release_expandable_segment`.
//!
//! An expandable segment is one reservation of address space per (stream,
//! pool kind, owner) of `page × ceil(1.125 × total / page)` bytes, pages of
//! 2 MiB (small pool) or 20 MiB (large pool), into which whole pages are
//! mapped as requests need them and unmapped when the cache is released.
//! Its blocks tile the reservation like any segment's and carry
//! `EXPANDABLE`; the ranges with no page behind them are blocks flagged
//! `UNMAPPED`, kept in their pool's unmapped index by (stream, address).
//! The reservation's lowest block is the segment head (its `seg_size` is the
//! reservation's size): pieces are always cut so that it keeps the lowest
//! address. Maps count as `num_device_alloc` and grow `reserved_bytes`;
//! unmaps count as `num_device_free`; `segment`, `oversize_segments` and the
//! `inactive_split` statistics never see expandable blocks.

use super::compact::{ANY_STREAM, COMPACT_PAGE};
use super::registry::Origin;
use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr, VmError};
use crate::error::Error;
use crate::history::{HistoryStorage, TraceAction};
use crate::index::{FreeKey, Links};
use crate::policy;
use crate::pool::Pool;
use crate::private_pool::{block_pool, block_pool_mut};

/// The page size of a pool's expandable segments (PyTorch's
/// `kSmallBuffer` / `kLargeBuffer`).
#[inline]
pub(crate) const fn page_size(pool: Pool) -> u64 {
    match pool {
        Pool::Small => policy::SMALL_BUFFER,
        Pool::Large => policy::LARGE_BUFFER,
    }
}

/// What expandable segments are called in the error of a backend without
/// virtual memory.
const WHAT: &str = "expandable segments (expandable_segments:True)";

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// `alloc_block` with expandable segments on: room for `size` (rounded)
    /// bytes in an expandable segment, mapping pages as needed; the block
    /// returned is cached (`NIL` when the device has no room).
    pub(super) fn alloc_expandable(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<u32, B> {
        if !B::VIRTUAL_MEMORY {
            return Err(unsupported::<B>(if self.config.compact() {
                "the compact policy (policy:compact)"
            } else {
                WHAT
            }));
        }
        if self.config.compact() {
            return self.alloc_compact(owner, pool, skey, size);
        }
        self.try_allocate_expandable_block(owner, pool, skey, size)
    }

    /// `try_allocate_expandable_block`: find where `size` bytes fit (free
    /// and unmapped blocks in a row), map the unmapped part page by page
    /// (merging with the free blocks around), and return the cached block
    /// that now holds at least `size` bytes; `NIL` when a map fails for
    /// lack of memory (what was mapped before stays mapped and cached, as in
    /// PyTorch).
    fn try_allocate_expandable_block(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<u32, B> {
        let c = self.find_expandable_block(owner, pool, skey, size)?;
        self.grow_into(c, size, skey)
    }

    /// The second half of `try_allocate_expandable_block`: map the unmapped
    /// blocks of the place found at `c` until the cached block there holds
    /// `size` bytes for stream `skey`; that block, or `NIL` (no place, or a
    /// map failed for lack of memory).
    pub(super) fn grow_into(&mut self, mut c: u32, size: u64, skey: u64) -> Res<u32, B> {
        if c == NIL {
            return Ok(NIL);
        }
        if self.slot(c).has(Flags::UNMAPPED) {
            c = self.map_block(c, self.slot(c).size.min(size), skey)?;
            if c == NIL {
                return Ok(NIL);
            }
        }
        while self.slot(c).size < size {
            // Invariant: the candidate is free and mapped, an unmapped block
            // follows (merging took every free mapped block after it).
            let remaining = size - self.slot(c).size;
            let n = self.slot(c).next;
            if n == NIL || !self.slot(n).has(Flags::UNMAPPED) {
                // Only a request larger than the whole reservation gets
                // here (PyTorch dereferences a null block): no room.
                return Ok(NIL);
            }
            c = self.map_block(n, remaining.min(self.slot(n).size), skey)?;
            if c == NIL {
                return Ok(NIL);
            }
        }
        if self.arena.available() == 0 {
            // The split that follows needs a slot.
            return Err(self.exhausted());
        }
        Ok(c)
    }

    /// `find_expandable_block`: the lowest-address place of this stream
    /// (and pool) where blocks that are free or unmapped, in a row, add up
    /// to `size` bytes: an unmapped block, or the free block just before
    /// one. If there is none, a new reservation (`NIL` when the device
    /// refuses the address space).
    fn find_expandable_block(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<u32, B> {
        let slots = self.arena.slots();
        let index = block_pool(&self.pools, &self.private, owner, pool);
        let mut u = index.unmapped_lower_bound(slots, (skey, 0));
        while u != NIL && slots[u as usize].stream == skey {
            let p = slots[u as usize].prev;
            let c = if p != NIL && slots[p as usize].has(Flags::CACHED) {
                p
            } else {
                u
            };
            if self.has_address_space(c, size) {
                return Ok(c);
            }
            u = index.unmapped_successor(slots, (skey, slots[u as usize].addr));
        }
        self.reserve_expandable_segment(owner, pool, skey)
    }

    /// Whether the blocks from `c` on that are free or unmapped add up to
    /// `size` bytes.
    fn has_address_space(&self, mut c: u32, size: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < size && c != NIL {
            let s = self.slot(c);
            if !s.flags.intersects(Flags::CACHED.union(Flags::UNMAPPED)) {
                break;
            }
            bytes = bytes.saturating_add(s.size);
            c = s.next;
        }
        bytes >= size
    }

    /// A new expandable segment: `page × ceil((total + total / 8) / page)`
    /// bytes of address space (`total`: the device's memory), one unmapped
    /// block. `NIL` when the device refuses the reservation.
    fn reserve_expandable_segment(&mut self, owner: u8, pool: Pool, skey: u64) -> Res<u32, B> {
        self.reserve_segment(owner, pool, skey, page_size(pool), |total| {
            total.saturating_add(total / 8)
        })
    }

    /// Reserve address space for an expandable segment with pages of `page`
    /// bytes and room for `span(total)` bytes (whole pages), as one unmapped
    /// block of stream key `skey`; its head slot, or `NIL` when the device
    /// refuses the reservation.
    pub(super) fn reserve_segment(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        page: u64,
        span: fn(u64) -> u64,
    ) -> Res<u32, B> {
        if self.arena.available() == 0 {
            return Err(self.exhausted());
        }
        let granularity = self
            .backend
            .allocation_granularity()
            .map_err(vm_error::<B>)?;
        if granularity == 0 || !page.is_multiple_of(granularity) {
            return Err(unsupported::<B>(
                "expandable segments on a device whose allocation granularity does not divide 2 MiB",
            ));
        }
        let total = self.backend.device_total_memory().map_err(Error::Backend)?;
        let size = span(total).div_ceil(page).saturating_mul(page);
        if size == 0 {
            return Ok(NIL);
        }
        let ptr = match self.backend.reserve_address_space(size) {
            Ok(p) => p,
            Err(VmError::OutOfMemory) => return Ok(NIL),
            Err(e) => return Err(vm_error::<B>(e)),
        };
        self.check_new_segment(ptr, size, Origin::Reservation)?;
        let Some(i) = self.arena.alloc() else {
            self.give_back(ptr, size, Origin::Reservation);
            return Err(self.exhausted());
        };
        if let Err(e) = self.register_segment(ptr, size, Origin::Reservation) {
            self.arena.release(i);
            return Err(e);
        }
        let counter = self.segment_counter();
        let s = self.slot_mut(i);
        s.addr = ptr.0;
        s.size = size;
        s.seg_size = size;
        s.stream = skey;
        s.counter = counter;
        s.owner = owner;
        s.flags
            .insert(pool.flag() | Flags::EXPANDABLE | Flags::UNMAPPED);
        if let Some(p) = self.private.get_mut(owner) {
            p.segments += 1;
        }
        self.segments.insert(self.arena.slots_mut(), i);
        block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
            .insert_unmapped(self.arena.slots_mut(), i);
        Ok(i)
    }

    /// The base address and page size of the expandable segment of block `i`.
    pub(super) fn reservation_of(&self, i: u32) -> (u64, u64) {
        let slots = self.arena.slots();
        let s = &slots[i as usize];
        let h = self.segments.floor(slots, s.addr);
        let base = slots.get(h as usize).map_or(s.addr, |h| h.addr);
        (base, self.page_of(h, Pool::of(s.flags)))
    }

    /// The page size of the expandable segment whose head is `h`: 2 MiB in
    /// the compact policy's segments, else the pool's (PyTorch's).
    pub(super) fn page_of(&self, h: u32, pool: Pool) -> u64 {
        if self.is_compact_head(h) {
            COMPACT_PAGE
        } else {
            page_size(pool)
        }
    }

    /// `map_block`: back the low `size` bytes of unmapped block `i`, rounded
    /// up to whole pages, with memory, for stream `stream`; the rest stays
    /// unmapped. The mapped block merges with the free blocks of its stream
    /// around it; the cached result is returned, or `NIL` when the device
    /// has no room (nothing changes).
    fn map_block(&mut self, i: u32, size: u64, stream: u64) -> Res<u32, B> {
        let (base, page) = self.reservation_of(i);
        let (addr, bsize, ustream, pool, owner) = {
            let s = self.slot(i);
            (s.addr, s.size, s.stream, Pool::of(s.flags), s.owner)
        };
        let offset = addr - base;
        let pages = (offset + size).div_ceil(page) - offset / page;
        let mapped = pages * page;
        if pages == 0 || mapped > bsize {
            return Ok(NIL);
        }
        if mapped < bsize && self.arena.available() == 0 {
            return Err(self.exhausted());
        }
        match self.backend.map_pages(DevicePtr(addr), pages, page) {
            Ok(()) => {}
            Err(VmError::OutOfMemory) => return Ok(NIL),
            Err(e) => return Err(vm_error::<B>(e)),
        }
        block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
            .remove_unmapped(self.arena.slots_mut(), i);
        let s = self.slot_mut(i);
        s.flags.remove(Flags::UNMAPPED);
        s.stream = stream;
        if mapped < bsize {
            let r = self.arena.alloc().unwrap_or(NIL);
            let next = self.slot(i).next;
            let counter = self.piece_counter(self.slot(i).counter);
            let rs = self.slot_mut(r);
            rs.counter = counter;
            rs.addr = addr + mapped;
            rs.size = bsize - mapped;
            rs.stream = ustream;
            rs.owner = owner;
            rs.flags
                .insert(pool.flag() | Flags::EXPANDABLE | Flags::UNMAPPED);
            rs.prev = i;
            rs.next = next;
            if next != NIL {
                self.slot_mut(next).prev = r;
            }
            let s = self.slot_mut(i);
            s.next = r;
            s.size = mapped;
            block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
                .insert_unmapped(self.arena.slots_mut(), r);
        }
        let b = self.merge_cached_neighbours(i);
        self.cache_insert(b);
        self.reserve(owner, pool, mapped, false);
        self.record(TraceAction::SegmentMap, addr, mapped, stream, owner);
        Ok(b)
    }

    /// Merge block `i` (not cached) with the cached blocks of its stream on
    /// either side; the lowest slot survives and carries `i`'s last request.
    /// Returns the surviving slot.
    pub(super) fn merge_cached_neighbours(&mut self, i: u32) -> u32 {
        let (requested, stream) = (self.slot(i).requested, self.slot(i).stream);
        let mergeable = |s: &BlockSlot| s.has(Flags::CACHED) && s.stream == stream;
        let mut b = i;
        let p = self.slot(i).prev;
        if p != NIL && mergeable(self.slot(p)) {
            self.cache_remove(p);
            self.absorb_into_prev(p);
            b = p;
        }
        let n = self.slot(b).next;
        if n != NIL && mergeable(self.slot(n)) {
            self.cache_remove(n);
            self.absorb_next(b);
        }
        self.slot_mut(b).requested = requested;
        b
    }

    /// `unmap_block`: unmap the whole pages inside cached expandable block
    /// `i` (after waiting for its segment's stream); the free pieces before
    /// and after them stay cached (slot `i` keeps the lowest piece), the
    /// unmapped range merges with unmapped neighbours. Returns the unmapped
    /// block, or `NIL` when no whole page lies inside `i`.
    pub(super) fn unmap_block(&mut self, i: u32) -> Res<u32, B> {
        let (base, page) = self.reservation_of(i);
        let (addr, size, stream, pool, owner, requested) = {
            let s = self.slot(i);
            (
                s.addr,
                s.size,
                s.stream,
                Pool::of(s.flags),
                s.owner,
                s.requested,
            )
        };
        let offset = addr - base;
        let (first, end) = (offset.div_ceil(page), (offset + size) / page);
        if first >= end {
            return Ok(NIL);
        }
        let ustart = base + first * page;
        let usize = (end - first) * page;
        let before = ustart - addr;
        let after = size - before - usize;
        if self.arena.available() < (before > 0) as u32 + (after > 0) as u32 {
            return Err(self.exhausted());
        }
        self.backend
            .synchronize_stream(B::Stream::from(stream))
            .map_err(Error::Backend)?;
        self.backend
            .unmap_pages(DevicePtr(ustart), end - first, page)
            .map_err(vm_error::<B>)?;
        self.cache_remove(i);
        let u = if before > 0 {
            let u = self.new_piece(i, ustart, usize);
            // torch's unmapped block is the old `Block`; the mapped piece
            // before it the new one.
            let fresh = self.piece_counter(self.slot(i).counter);
            let s = self.slot_mut(i);
            s.counter = fresh;
            s.size = before;
            s.requested = 0;
            self.cache_insert(i);
            u
        } else {
            self.slot_mut(i).size = usize;
            i
        };
        let compact = self.is_compact_reservation(u);
        {
            let s = self.slot_mut(u);
            s.flags.insert(Flags::UNMAPPED);
            s.requested = requested;
            if compact {
                // Address space of the compact segment belongs to no stream.
                s.stream = ANY_STREAM;
            }
        }
        if after > 0 {
            let a = self.new_piece(u, ustart + usize, after);
            let fresh = self.piece_counter(self.slot(u).counter);
            let s = self.slot_mut(a);
            s.stream = stream;
            s.counter = fresh;
            self.cache_insert(a);
        }
        let u = self.merge_unmapped_neighbours(u, owner, pool);
        self.unreserve(owner, pool, usize, false);
        self.record(TraceAction::SegmentUnmap, ustart, usize, stream, owner);
        Ok(u)
    }

    /// A new block `[addr, addr + size)` of the expandable segment of `at`,
    /// linked right after it (a slot is known to be free).
    fn new_piece(&mut self, at: u32, addr: u64, size: u64) -> u32 {
        let (stream, owner, flags, next, counter) = {
            let s = self.slot(at);
            (s.stream, s.owner, s.flags, s.next, s.counter)
        };
        let n = self.arena.alloc().unwrap_or(NIL);
        let ns = self.slot_mut(n);
        ns.counter = counter;
        ns.addr = addr;
        ns.size = size;
        ns.stream = stream;
        ns.owner = owner;
        ns.flags.insert(flags & (Flags::SMALL | Flags::EXPANDABLE));
        ns.prev = at;
        ns.next = next;
        if next != NIL {
            self.slot_mut(next).prev = n;
        }
        self.slot_mut(at).next = n;
        n
    }

    /// Merge unmapped block `u` (not yet indexed) with the unmapped blocks
    /// on either side and index the result; the lowest slot survives and
    /// carries `u`'s last request.
    fn merge_unmapped_neighbours(&mut self, u: u32, owner: u8, pool: Pool) -> u32 {
        let requested = self.slot(u).requested;
        let mut b = u;
        let p = self.slot(u).prev;
        if p != NIL && self.slot(p).has(Flags::UNMAPPED) {
            block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
                .remove_unmapped(self.arena.slots_mut(), p);
            self.absorb_into_prev(p);
            b = p;
        }
        let n = self.slot(b).next;
        if n != NIL && self.slot(n).has(Flags::UNMAPPED) {
            block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
                .remove_unmapped(self.arena.slots_mut(), n);
            self.absorb_next(b);
        }
        self.slot_mut(b).requested = requested;
        block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
            .insert_unmapped(self.arena.slots_mut(), b);
        b
    }

    /// `release_expandable_segment`: give back the reservation of a segment
    /// that is one unmapped block `u`.
    pub(super) fn release_expandable_segment(&mut self, u: u32) -> Res<(), B> {
        let (addr, size, pool, owner) = {
            let s = self.slot(u);
            (s.addr, s.size, Pool::of(s.flags), s.owner)
        };
        self.unregistered(addr, |b| b.release_address_space(DevicePtr(addr), size))
            .map_err(vm_error::<B>)?;
        block_pool_mut(&mut self.pools, &mut self.private, owner, pool)
            .remove_unmapped(self.arena.slots_mut(), u);
        self.segments.remove(self.arena.slots_mut(), u);
        if let Some(p) = self.private.get_mut(owner) {
            p.segments -= 1;
        }
        self.forget_compact_head(u);
        self.arena.release(u);
        Ok(())
    }

    /// The second half of PyTorch's `release_blocks`: unmap the whole pages
    /// of every cached expandable block of `pool` of owner `owner`, in
    /// free-index order, releasing each segment left as one unmapped block.
    /// (Pieces an unmap leaves cached hold no whole page: visiting them
    /// later in the walk changes nothing.)
    pub(super) fn unmap_cached_expandable(&mut self, owner: u8, pool: Pool) -> Res<(), B> {
        self.coalesce_compact(owner, pool)?;
        let mut cur = self.next_cached(owner, pool, None);
        while cur != NIL {
            let key = self.key_of(cur);
            if self.slot(cur).has(Flags::EXPANDABLE) {
                let u = self.unmap_block(cur)?;
                if u != NIL && !self.slot(u).is_split() {
                    self.release_expandable_segment(u)?;
                }
            }
            cur = self.next_cached(owner, pool, Some(key));
        }
        Ok(())
    }

    /// Give back every reservation with no page mapped (teardown only: in
    /// PyTorch such a segment, left by a map that failed, keeps its address
    /// space until the process ends, and a later request reuses it).
    pub(super) fn release_empty_reservations(&mut self) -> Res<(), B> {
        let mut owner = 0u8;
        while (owner as usize) <= self.private.capacity() {
            if owner == 0 || self.private.get(owner).is_some() {
                for pool in Pool::ALL {
                    let mut key = (0u64, 0u64);
                    loop {
                        let slots = self.arena.slots();
                        let index = block_pool(&self.pools, &self.private, owner, pool);
                        let u = index.unmapped_lower_bound(slots, key);
                        let Some(s) = slots.get(u as usize) else {
                            break;
                        };
                        key = (s.stream, s.addr.saturating_add(1));
                        if !s.is_split() {
                            self.release_expandable_segment(u)?;
                        }
                    }
                }
            }
            owner += 1;
        }
        Ok(())
    }

    /// `get_free_block` when the smallest fitting block `b` is expandable:
    /// with the option on, best fit counts a block as big as it could grow
    /// (its size plus an unmapped block right after it) and moves on while
    /// the next block of the stream is smaller by that measure; with it off,
    /// the first block of the stream that is not expandable. `NIL` if none.
    #[cold]
    pub(super) fn expandable_best_fit(&self, owner: u8, pool: Pool, skey: u64, mut b: u32) -> u32 {
        let slots = self.arena.slots();
        let index = block_pool(&self.pools, &self.private, owner, pool);
        let key = |i: u32| FreeKey::key(&slots[i as usize]);
        if self.config.maps_pages() {
            let grown = |i: u32| {
                let s = &slots[i as usize];
                let tail = slots
                    .get(s.next as usize)
                    .filter(|n| n.has(Flags::UNMAPPED))
                    .map_or(0, |n| n.size);
                s.size.saturating_add(tail)
            };
            while slots[b as usize].has(Flags::EXPANDABLE) {
                let n = index.successor(slots, key(b));
                if n == NIL || slots[n as usize].stream != skey || grown(n) >= grown(b) {
                    break;
                }
                b = n;
            }
            b
        } else {
            loop {
                b = index.successor(slots, key(b));
                if b == NIL || slots[b as usize].stream != skey {
                    return NIL;
                }
                if !slots[b as usize].has(Flags::EXPANDABLE) {
                    return b;
                }
            }
        }
    }

    /// Metadata ran out.
    pub(super) fn exhausted(&self) -> Error<B::Error> {
        Error::MetadataExhausted {
            capacity: self.arena.capacity(),
        }
    }
}

/// The error of a backend that cannot do `what`.
pub(super) fn unsupported<B: DeviceBackend>(what: &'static str) -> Error<B::Error> {
    Error::Unsupported {
        what,
        backend: B::NAME,
    }
}

/// A failed virtual-memory call as the allocator reports it.
pub(super) fn vm_error<B: DeviceBackend>(e: VmError<B::Error>) -> Error<B::Error> {
    match e {
        VmError::Unsupported => unsupported::<B>(WHAT),
        VmError::OutOfMemory => Error::BackendContract {
            what: "a virtual-memory call other than a map failed for lack of memory",
            ptr: DevicePtr(0),
        },
        VmError::Other(e) => Error::Backend(e),
    }
}
