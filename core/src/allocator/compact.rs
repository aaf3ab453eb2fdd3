//! The compact policy (`policy:compact`): beyond PyTorch, for devices that
//! are nearly full and runtimes that change streams.
//!
//! - **One expandable segment per pool kind and owner**, for every stream,
//!   with 2 MiB pages for large requests too (PyTorch: one per stream, 20 MiB
//!   pages). Its blocks carry their own stream; free blocks merge only with
//!   free blocks of the same stream; its unmapped blocks belong to no stream
//!   ([`ANY_STREAM`]).
//! - **Reclaim before map.** When a request must map pages, free whole pages
//!   elsewhere (of the default pools and of private pools nobody uses) are
//!   unmapped first, up to as many as it maps: reserved memory grows only by
//!   what the live bytes need, plus the free pieces smaller than a page.
//! - **Cross-stream reuse.** A request whose stream has no cached block that
//!   fits takes the best-fitting free block of another stream: an event is
//!   recorded on that stream and the request's stream waits for it on the
//!   device ([`DeviceBackend::stream_wait_event`]), then the block belongs to
//!   the request's stream.
//!
//! Requests are placed as PyTorch places expandable ones: the smallest
//! cached block of the stream that fits, else the lowest address where free
//! blocks of the stream and unmapped space, in a row, hold the request.

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::policy;
use crate::pool::Pool;
use crate::private_pool::block_pool;

/// The stream key of the compact segments' unmapped blocks (a raw stream
/// handle of all ones is taken to be no stream).
pub(crate) const ANY_STREAM: u64 = u64::MAX;

/// A free block the compact policy unmaps pages of to make room: one of at
/// least this many bytes, or one of the small pool. Unmapping the pages of
/// smaller large-pool blocks costs more than it saves: later requests of
/// their size no longer fit there, and the layout drifts (8 pages did best
/// on the bundled traces; unmapping every block's pages did worst).
const RECLAIM_MIN_BLOCK: u64 = 8 * COMPACT_PAGE;

/// The compact segments' page size.
pub(crate) const COMPACT_PAGE: u64 = policy::SMALL_BUFFER;

/// The head slot of the compact segment of each owner and pool kind (`NIL`:
/// none yet).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompactHeads<const P: usize> {
    default: [u32; 2],
    private: [[u32; 2]; P],
}

impl<const P: usize> CompactHeads<P> {
    pub(crate) const NONE: Self = CompactHeads {
        default: [NIL; 2],
        private: [[NIL; 2]; P],
    };

    /// The head of owner `owner`'s compact segment of `pool`, or `NIL`.
    pub(crate) fn get(&self, owner: u8, pool: Pool) -> u32 {
        let row = match owner {
            0 => Some(&self.default),
            k => self.private.get(k as usize - 1),
        };
        row.map_or(NIL, |r| r[pool.index()])
    }

    pub(crate) fn set(&mut self, owner: u8, pool: Pool, head: u32) {
        let row = match owner {
            0 => Some(&mut self.default),
            k => self.private.get_mut(k as usize - 1),
        };
        if let Some(r) = row {
            r[pool.index()] = head;
        }
    }

    /// Every entry, as (owner, pool, head).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u8, Pool, u32)> + '_ {
        (0..=P as u8).flat_map(move |o| Pool::ALL.map(|k| (o, k, self.get(o, k))))
    }
}

/// The address space of a compact segment: four times the device's memory
/// (free: virtual), so that holes left by unmapping never run it out.
fn compact_span(total: u64) -> u64 {
    total.saturating_mul(4)
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Whether `h` is the head of a compact segment.
    pub(super) fn is_compact_head(&self, h: u32) -> bool {
        self.arena
            .slots()
            .get(h as usize)
            .is_some_and(|s| self.compact.get(s.owner, Pool::of(s.flags)) == h)
    }

    /// Whether block `i` lies in a compact segment.
    pub(super) fn is_compact_reservation(&self, i: u32) -> bool {
        let slots = self.arena.slots();
        let h = self.segments.floor(slots, slots[i as usize].addr);
        self.is_compact_head(h)
    }

    /// Slot `h` (being released) is no compact segment's head any more.
    pub(super) fn forget_compact_head(&mut self, h: u32) {
        if self.is_compact_head(h) {
            let s = self.slot(h);
            let (owner, pool) = (s.owner, Pool::of(s.flags));
            self.compact.set(owner, pool, NIL);
        }
    }

    /// `alloc_block` under the compact policy: the place for `size` bytes of
    /// stream `skey` (after unmapping free pages elsewhere for the pages it
    /// needs), its unmapped part mapped; the cached block, or `NIL`.
    pub(super) fn alloc_compact(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<u32, B> {
        let mut c = self.find_compact_place(owner, pool, skey, size)?;
        if c == NIL {
            return Ok(NIL);
        }
        // Reclaim only what would take reserved memory above its high-water
        // mark: below it, mapping is what a steady state does, and unmapping
        // there would only churn.
        let need = self.bytes_to_map(c, size);
        let excess = (self.total_allocated_memory + need).saturating_sub(self.reserved_high);
        // Unmapping waits for streams: never while a capture is under way.
        if excess > 0 && !self.capturing() {
            let lo = self.slot(c).addr;
            let kept = (lo, lo.saturating_add(size));
            if self.reclaim(excess.min(need), kept)? > 0 {
                // The unmapped space changed: look again (the place may now
                // be lower, where pages were just unmapped).
                c = self.find_compact_place(owner, pool, skey, size)?;
            }
        }
        self.grow_into(c, size, skey)
    }

    /// The lowest address of owner `owner`'s compact segment of `pool` where
    /// free blocks of stream `skey` and unmapped space, in a row, hold
    /// `size` bytes (the segment is made when there is none yet); `NIL`
    /// when there is no such place or the device refuses the reservation.
    fn find_compact_place(&mut self, owner: u8, pool: Pool, skey: u64, size: u64) -> Res<u32, B> {
        let slots = self.arena.slots();
        let index = block_pool(&self.pools, &self.private, owner, pool);
        let mut u = index.unmapped_lower_bound(slots, (ANY_STREAM, 0));
        while let Some(us) = slots.get(u as usize) {
            let p = us.prev;
            let c = match slots.get(p as usize) {
                Some(ps) if ps.has(Flags::CACHED) && ps.stream == skey => p,
                _ => u,
            };
            if self.run_holds(c, size, skey) {
                return Ok(c);
            }
            u = index.unmapped_successor(slots, (ANY_STREAM, us.addr));
        }
        if self.compact.get(owner, pool) != NIL {
            return Ok(NIL);
        }
        let h = self.reserve_segment(owner, pool, ANY_STREAM, COMPACT_PAGE, compact_span)?;
        if h != NIL {
            self.compact.set(owner, pool, h);
        }
        Ok(h)
    }

    /// Whether the blocks from `c` on that are free blocks of stream `skey`
    /// or unmapped add up to `size` bytes.
    fn run_holds(&self, mut c: u32, size: u64, skey: u64) -> bool {
        let mut bytes = 0u64;
        while let Some(s) = self.arena.slots().get(c as usize) {
            if bytes >= size
                || !(s.has(Flags::UNMAPPED) || (s.has(Flags::CACHED) && s.stream == skey))
            {
                break;
            }
            bytes = bytes.saturating_add(s.size);
            c = s.next;
        }
        bytes >= size
    }

    /// The bytes of pages `grow_into` would map to hold `size` bytes at `c`.
    fn bytes_to_map(&self, mut c: u32, size: u64) -> u64 {
        let (mut have, mut mapped) = (0u64, 0u64);
        while have < size {
            let Some(s) = self.arena.slots().get(c as usize) else {
                break;
            };
            let add = if s.has(Flags::UNMAPPED) {
                let m = (size - have).min(s.size).div_ceil(COMPACT_PAGE) * COMPACT_PAGE;
                mapped += m;
                m
            } else {
                s.size
            };
            have = have.saturating_add(add);
            c = s.next;
        }
        mapped
    }

    /// Unmap free whole pages of cached expandable blocks, outside `kept`
    /// (an address range), of the default pools and of private pools nobody
    /// uses (a pool in use keeps its memory, as in PyTorch), until `need`
    /// bytes are unmapped; the bytes unmapped. Running out of block slots
    /// only ends the reclaim early.
    fn reclaim(&mut self, need: u64, kept: (u64, u64)) -> Res<u64, B> {
        let before = self.total_allocated_memory;
        let mut owner = 0u8;
        while (owner as usize) <= self.private.capacity() {
            if owner == 0 || self.private.get(owner).is_some_and(|p| p.use_count == 0) {
                for pool in [Pool::Large, Pool::Small] {
                    let mut cur = self.next_cached(owner, pool, None);
                    while cur != NIL && before - self.total_allocated_memory < need {
                        let key = self.key_of(cur);
                        let s = self.slot(cur);
                        let outside = s.end() <= kept.0 || s.addr >= kept.1;
                        let victim = s.size >= RECLAIM_MIN_BLOCK || pool == Pool::Small;
                        if s.has(Flags::EXPANDABLE) && outside && victim {
                            match self.unmap_block(cur) {
                                Ok(u) if u != NIL && !self.slot(u).is_split() => {
                                    self.release_expandable_segment(u)?;
                                }
                                Ok(_) => {}
                                Err(Error::MetadataExhausted { .. }) => {
                                    return Ok(before - self.total_allocated_memory);
                                }
                                Err(e) => return Err(e),
                            }
                        }
                        cur = self.next_cached(owner, pool, Some(key));
                    }
                }
            }
            owner += 1;
        }
        Ok(before - self.total_allocated_memory)
    }

    /// Before a release unmaps free pages: in owner `owner`'s compact
    /// segment of `pool`, merge neighbouring free blocks of different
    /// streams (after waiting on the host for both streams, so neither has
    /// work left on them), so that the pages they share can be unmapped.
    pub(super) fn coalesce_compact(&mut self, owner: u8, pool: Pool) -> Res<(), B> {
        let mut b = self.compact.get(owner, pool);
        let mut synced = ANY_STREAM;
        while b != NIL {
            let n = self.slot(b).next;
            let pair =
                n != NIL && self.slot(b).has(Flags::CACHED) && self.slot(n).has(Flags::CACHED);
            if !pair {
                b = n;
                continue;
            }
            // (A merge can bring a block of `b`'s own stream next to it.)
            let (sb, sn) = (self.slot(b).stream, self.slot(n).stream);
            for st in [sb, sn].into_iter().filter(|_| sb != sn) {
                if st != synced {
                    self.backend
                        .synchronize_stream(B::Stream::from(st))
                        .map_err(Error::Backend)?;
                    synced = st;
                }
            }
            self.cache_remove(b);
            self.cache_remove(n);
            self.absorb_next(b);
            self.cache_insert(b);
        }
        Ok(())
    }

    /// What the compact policy tries when the request's own pool and stream
    /// have no cached block that fits: for a small request, a free piece of
    /// the large pool smaller than a page (memory that is mapped anyway and
    /// could not be unmapped); then a block of another stream. The block
    /// (`NIL`: none) and the pool it is in.
    pub(super) fn compact_fallbacks(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<(u32, Pool), B> {
        if pool == Pool::Small {
            let b = self.large_remnant(owner, skey, size);
            if b != NIL {
                return Ok((b, Pool::Large));
            }
        }
        // A hand-over records an event on the other stream and makes this
        // one wait for it: a capturing stream may not wait on work from
        // outside its capture, so not while a capture is under way.
        if self.capturing() {
            return Ok((NIL, pool));
        }
        Ok((
            self.take_from_another_stream(owner, pool, skey, size)?,
            pool,
        ))
    }

    /// The smallest free piece of the large pool of stream `skey` that
    /// holds `size` bytes and is smaller than a page, or `NIL`.
    pub(super) fn large_remnant(&self, owner: u8, skey: u64, size: u64) -> u32 {
        let slots = self.arena.slots();
        let b = block_pool(&self.pools, &self.private, owner, Pool::Large)
            .lower_bound(slots, (skey, size, 0));
        match slots.get(b as usize) {
            Some(s) if s.stream == skey && s.size < COMPACT_PAGE => b,
            _ => NIL,
        }
    }

    /// Cross-stream reuse: the best-fitting cached block of another stream
    /// (in a compact segment, of this owner and pool, within the oversize
    /// rules) for a request of `size` bytes on stream `skey`: its stream
    /// hands it over (an event it records, which `skey` waits for on the
    /// device), it joins `skey`'s free blocks around it, and the result is
    /// returned (cached); `NIL` if there is none.
    pub(super) fn take_from_another_stream(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<u32, B> {
        let slots = self.arena.slots();
        let index = block_pool(&self.pools, &self.private, owner, pool);
        let mut best = NIL;
        let mut at = index.lower_bound(slots, (0, 0, 0));
        while let Some(first) = slots.get(at as usize) {
            let t = first.stream;
            if t != skey {
                let b = index.lower_bound(slots, (t, size, 0));
                if let Some(s) = slots.get(b as usize).filter(|s| s.stream == t) {
                    let fits = !self.refuses_oversize(size, s.size);
                    let better = slots
                        .get(best as usize)
                        .is_none_or(|o| (s.size, s.addr) < (o.size, o.addr));
                    if fits && better && s.has(Flags::EXPANDABLE) && self.is_compact_reservation(b)
                    {
                        best = b;
                    }
                }
            }
            if t == u64::MAX {
                break;
            }
            at = index.lower_bound(slots, (t + 1, 0, 0));
        }
        if best == NIL {
            return Ok(NIL);
        }
        let from = B::Stream::from(self.slot(best).stream);
        self.events
            .hand_over(&mut self.backend, from, B::Stream::from(skey))?;
        self.handovers += 1;
        self.cache_remove(best);
        self.slot_mut(best).stream = skey;
        let b = self.merge_cached_neighbours(best);
        self.cache_insert(b);
        Ok(b)
    }
}
