//! `check_invariants()`: every structure checks itself (`verify()` of the
//! arena, the free indexes, the segment index, the live-pointer index and the
//! event queue), then one walk over every segment's blocks re-derives what
//! they must agree on, and every `current` statistic is recounted.

use super::compact::ANY_STREAM;
use super::DeviceAllocator;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::history::HistoryStorage;
use crate::invariants::{ensure, expect, fail, InvariantViolation};
use crate::pool::Pool;
use crate::private_pool::block_pool;
use crate::stats::DeviceStats;
use crate::torch_version::BlockOrder;

/// What the walk over the segments counts.
struct Tally<const P: usize> {
    /// Every `current` statistic, recounted.
    stats: DeviceStats,
    /// Cached blocks of the default pools, per pool.
    cached: [u32; 2],
    /// Cached blocks of private pools.
    cached_private: u32,
    /// Unmapped blocks (expandable segments) of the default pools, per
    /// pool, and of private pools.
    unmapped: [u32; 2],
    unmapped_private: u32,
    /// Segments and their bytes, per private pool (table entry).
    pool_segments: [(u32, u64); P],
    /// Blocks parked by a capture.
    deferred: u32,
    /// Blocks in segments.
    blocks: u32,
}

/// Where the walk is inside one segment.
struct Cursor {
    pool: Pool,
    owner: u8,
    split: bool,
    addr: u64,
    prev: u32,
    prev_cached: bool,
    /// The previous block's stream.
    prev_stream: u64,
    /// A compact-policy segment: blocks of several streams.
    compact: bool,
    /// Expandable segments: the reservation's base and page size.
    expandable: Option<(u64, u64)>,
    prev_unmapped: bool,
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Check every structural and accounting invariant: the free-slot list,
    /// the three indexes and the event queue check themselves; segments tile
    /// exactly and do not overlap; every block is exactly one of allocated,
    /// pending or cached; no two adjacent blocks are both cached; the free
    /// index of each pool holds exactly the cached blocks and the live index
    /// exactly the allocated ones; every slot in use is in a segment; and
    /// every `current` statistic equals a recount.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let slots = self.arena.slots();
        let hw = self.arena.high_water();
        ensure(
            self.shape == super::ConfigShape::of(&self.config),
            "config shape: out of step with the config",
            None,
        )?;
        self.arena.verify()?;
        self.segments.verify(slots, hw)?;
        for pool in Pool::ALL {
            self.pools.get(pool).verify(slots, hw)?;
        }
        self.private.verify(slots, hw)?;
        self.live.verify(slots, hw)?;
        self.events.verify(slots, hw)?;
        // First: the walk trusts the table to tell compact segments apart.
        self.check_compact_heads()?;
        let t = self.walk_segments()?;
        self.check_pools(&t)?;
        self.check_ipc_shares()?;
        self.check_registry()?;
        expect(
            "segment list: every slot in use belongs to a segment",
            None,
            self.arena.in_use() as i64,
            t.blocks as i64,
        )?;
        for pool in Pool::ALL {
            expect(
                "free index: holds exactly the cached blocks",
                None,
                t.cached[pool.index()] as i64,
                self.pools.get(pool).len() as i64,
            )?;
            expect(
                "unmapped index: holds exactly the unmapped blocks",
                None,
                t.unmapped[pool.index()] as i64,
                self.pools.get(pool).unmapped_len() as i64,
            )?;
        }
        expect(
            "live-pointer index: holds exactly the allocated blocks",
            None,
            t.stats.allocation.all().current,
            self.live.len() as i64,
        )?;
        super::fragmentation::check_fragmentation(&self.fragmentation(0.into()), &t.stats)?;
        self.compare_stats(&t.stats)
    }

    /// With a segment registry attached, it holds exactly this allocator's
    /// segments (and reservations), each visible with its range. (Its
    /// entries of this device change only under this allocator's `&mut`.)
    fn check_registry(&self) -> Result<(), InvariantViolation> {
        let Some((registry, device)) = self.registry else {
            return Ok(());
        };
        let slots = self.arena.slots();
        let mut heads = 0i64;
        let mut h = self.segments.first(slots);
        while h != NIL {
            let s = &slots[h as usize];
            ensure(
                registry.holds(device, s.addr, s.seg_size),
                "segment registry: a held segment is not registered with its range",
                Some(h),
            )?;
            heads += 1;
            h = self.segments.successor(slots, s.addr);
        }
        expect(
            "segment registry: holds exactly this device's segments",
            None,
            heads,
            registry.count(device) as i64,
        )
    }

    /// Each compact segment named in the table is the head of a held
    /// expandable segment of that owner and pool kind.
    fn check_compact_heads(&self) -> Result<(), InvariantViolation> {
        let slots = self.arena.slots();
        for (owner, pool, h) in self.compact.entries() {
            if h == NIL {
                continue;
            }
            let ok = slots.get(h as usize).is_some_and(|s| {
                s.has(Flags::IN_USE)
                    && s.has(Flags::EXPANDABLE)
                    && s.prev == NIL
                    && s.owner == owner
                    && Pool::of(s.flags) == pool
                    && self.segments.containing(slots, s.addr) == h
            });
            ensure(
                ok,
                "compact segment: the table names a slot that is not such a segment's head",
                Some(h),
            )?;
        }
        Ok(())
    }

    /// The private pools agree with their blocks: each pool's free indexes
    /// hold exactly its cached blocks, its segment count and bytes are its
    /// segments', the routing list names existing pools (once each) and
    /// counts its captures, and the deferred list holds exactly the parked
    /// blocks.
    fn check_pools(&self, t: &Tally<P>) -> Result<(), InvariantViolation> {
        let private_sum = |count: fn(&crate::pool::BlockPool) -> u32| -> i64 {
            self.private
                .iter()
                .flat_map(|(_, p)| Pool::ALL.map(|k| count(p.blocks.get(k))))
                .sum::<u32>() as i64
        };
        expect(
            "private pools: free indexes hold exactly their cached blocks",
            None,
            t.cached_private as i64,
            private_sum(|b| b.len()),
        )?;
        expect(
            "private pools: unmapped indexes hold exactly their unmapped blocks",
            None,
            t.unmapped_private as i64,
            private_sum(|b| b.unmapped_len()),
        )?;
        for (owner, p) in self.private.iter() {
            let (n, bytes) = t.pool_segments[owner as usize - 1];
            expect(
                "private pool: segment count",
                None,
                n as i64,
                p.segments as i64,
            )?;
            expect(
                "private pool: reserved bytes",
                None,
                bytes as i64,
                p.reserved as i64,
            )?;
        }
        let mut captures = 0u32;
        for (k, r) in self.routes.iter().enumerate() {
            ensure(
                self.private.get(r.owner).is_some_and(|p| p.id == r.id),
                "routing: names a pool that does not exist",
                None,
            )?;
            ensure(
                !self.routes[..k].iter().any(|q| q.id == r.id),
                "routing: a pool routed to twice",
                None,
            )?;
            captures += r.capture as u32;
        }
        expect(
            "routing: captures under way",
            None,
            captures as i64,
            self.captures as i64,
        )?;
        let (mut n, mut marked, mut i) = (0u32, 0u32, self.deferred.head);
        while i != NIL && n <= t.deferred {
            let s = self.arena.slots().get(i as usize).ok_or(fail(
                "deferred list: link out of range",
                Some(i),
                0,
                1,
            ))?;
            ensure(
                s.has(Flags::DEFERRED),
                "deferred list: holds a block that is not parked",
                Some(i),
            )?;
            n += 1;
            marked += (s.right != crate::backend::NO_MARKER) as u32;
            i = s.hash_next();
        }
        expect("deferred list: length", None, t.deferred as i64, n as i64)?;
        expect(
            "deferred list: blocks with a free marker",
            None,
            marked as i64,
            self.deferred.marked as i64,
        )?;
        expect(
            "deferred list: count",
            None,
            t.deferred as i64,
            self.deferred.len as i64,
        )
    }

    /// Walk the segments in address order, checking each and counting.
    fn walk_segments(&self) -> Result<Tally<P>, InvariantViolation> {
        let slots = self.arena.slots();
        let mut t = Tally {
            stats: DeviceStats::new(None),
            cached: [0; 2],
            cached_private: 0,
            unmapped: [0; 2],
            unmapped_private: 0,
            pool_segments: [(0, 0); P],
            deferred: 0,
            blocks: 0,
        };
        let mut prev_end = 0u64;
        let mut h = self.segments.first(slots);
        while h != NIL {
            let head = &slots[h as usize];
            expect(
                "segment list: a segment head has a predecessor",
                Some(h),
                NIL as i64,
                head.prev as i64,
            )?;
            if head.addr < prev_end {
                return Err(fail(
                    "segments overlap",
                    Some(h),
                    prev_end as i64,
                    head.addr as i64,
                ));
            }
            prev_end = head.end_of_segment();
            self.check_segment(h, &mut t)?;
            h = self.segments.successor(slots, head.addr);
        }
        Ok(t)
    }

    /// One segment: its blocks tile it, and each is counted.
    fn check_segment(&self, h: u32, t: &mut Tally<P>) -> Result<(), InvariantViolation> {
        let head = self.slot(h);
        let pool = Pool::of(head.flags);
        let expandable = head.has(Flags::EXPANDABLE);
        let page = self.page_of(h, pool);
        let compact = self.is_compact_head(h);
        ensure(
            !expandable || head.seg_size.is_multiple_of(page),
            "expandable segment: not a whole number of pages",
            Some(h),
        )?;
        if head.owner != 0 {
            let e = t
                .pool_segments
                .get_mut(head.owner as usize - 1)
                .filter(|_| self.private.get(head.owner).is_some())
                .ok_or(fail(
                    "private pool: a segment of a pool that does not exist",
                    Some(h),
                    0,
                    head.owner as i64,
                ))?;
            e.0 += 1;
            if !expandable {
                e.1 += head.seg_size;
            }
            ensure(
                !(expandable
                    && self
                        .private
                        .get(head.owner)
                        .is_some_and(|p| p.source.is_some())),
                "private pool: an expandable segment in a pool with a segment source",
                Some(h),
            )?;
        }
        // An expandable segment counts its mapped bytes (in check_block),
        // never as a segment.
        if !expandable {
            t.stats.segment.increase(pool, 1);
            t.stats.reserved_bytes.increase(pool, head.seg_size);
            if head.seg_size >= self.config.max_split_size {
                t.stats.oversize_segments.increase(1);
            }
        }
        let mut c = Cursor {
            pool,
            owner: head.owner,
            split: head.next != NIL,
            addr: head.addr,
            prev: NIL,
            prev_cached: false,
            prev_stream: head.stream,
            compact,
            expandable: expandable.then_some((head.addr, page)),
            prev_unmapped: false,
        };
        let mut cur = h;
        while cur != NIL {
            t.blocks += 1;
            if t.blocks > self.arena.high_water() {
                return Err(fail(
                    "segment list: block lists have a cycle",
                    Some(cur),
                    0,
                    1,
                ));
            }
            let b = self.arena.slots().get(cur as usize).ok_or(fail(
                "segment list: link out of range",
                Some(cur),
                0,
                1,
            ))?;
            if !compact {
                expect(
                    "block state: stream != its segment's stream",
                    Some(cur),
                    head.stream as i64,
                    b.stream as i64,
                )?;
            }
            self.check_counter(cur, b, head.counter)?;
            self.check_block(cur, b, &mut c, t)?;
            c.addr = c.addr.wrapping_add(b.size);
            c.prev = cur;
            cur = b.next;
        }
        expect(
            "blocks tile the segment (size)",
            Some(h),
            head.end_of_segment() as i64,
            c.addr as i64,
        )
    }

    /// A block's number, as the torch version's rules give it
    /// (`counters.rs`): none under 2.11's order, its segment's from 2.13 on,
    /// one already handed out under 2.12 (read as below the next one: true
    /// until the 2^32nd number, after which the counter wraps, as torch's
    /// int32 does, and this part of the check would need the numbers' age).
    fn check_counter(&self, i: u32, b: &BlockSlot, head: u32) -> Result<(), InvariantViolation> {
        let (want, got) = match self.config.block_order() {
            BlockOrder::SizeAddress => (0, b.counter),
            BlockOrder::RegistrationCounter => (0, u32::from(b.counter >= self.next_counter)),
            _ => (head, b.counter),
        };
        expect(
            "block number (torch's registration counter)",
            Some(i),
            want as i64,
            got as i64,
        )
    }

    /// One block of a segment: linked, placed and in exactly one state, in
    /// the index its state needs, and counted.
    fn check_block(
        &self,
        i: u32,
        b: &BlockSlot,
        c: &mut Cursor,
        t: &mut Tally<P>,
    ) -> Result<(), InvariantViolation> {
        ensure(
            b.has(Flags::IN_USE),
            "segment list: a block sits in a free slot",
            Some(i),
        )?;
        expect(
            "segment list: block prev link",
            Some(i),
            c.prev as i64,
            b.prev as i64,
        )?;
        expect(
            "blocks tile the segment (address)",
            Some(i),
            c.addr as i64,
            b.addr as i64,
        )?;
        if Pool::of(b.flags) != c.pool || b.size == 0 {
            return Err(fail("block state: pool or size", Some(i), 0, b.size as i64));
        }
        expect(
            "block state: owner pool != its segment's",
            Some(i),
            c.owner as i64,
            b.owner as i64,
        )?;
        ensure(
            b.has(Flags::EXPANDABLE) == c.expandable.is_some(),
            "block state: expandable flag != its segment's",
            Some(i),
        )?;
        if b.has(Flags::UNMAPPED) {
            return self.check_unmapped(i, b, c, t);
        }
        c.prev_unmapped = false;
        let deferred = b.has(Flags::DEFERRED);
        ensure(
            !deferred || (b.events == 0 && b.has(Flags::HAS_USES)),
            "block state: a parked block with events or without stream uses",
            Some(i),
        )?;
        t.deferred += deferred as u32;
        let (cached, allocated, pending) = (
            b.has(Flags::CACHED),
            b.has(Flags::ALLOCATED),
            b.events > 0 || deferred,
        );
        if cached as u8 + allocated as u8 + pending as u8 != 1 {
            return Err(fail(
                "block state: not exactly one of allocated / pending / cached",
                Some(i),
                1,
                b.flags.bits() as i64,
            ));
        }
        ensure(
            !b.has(Flags::HAS_USES) || allocated || deferred,
            "block state: stream uses on a block that is neither allocated nor parked",
            Some(i),
        )?;
        ensure(
            !(cached && c.prev_cached && c.prev_stream == b.stream),
            "two adjacent cached blocks (missed merge)",
            Some(i),
        )?;
        c.prev_cached = cached;
        c.prev_stream = b.stream;
        ensure(
            !c.compact || b.stream != ANY_STREAM,
            "compact segment: a mapped block of no stream",
            Some(i),
        )?;
        let (pool, st) = (c.pool, &mut t.stats);
        if c.expandable.is_some() {
            st.reserved_bytes.increase(pool, b.size);
            if let Some(e) = t.pool_segments.get_mut((c.owner as usize).wrapping_sub(1)) {
                e.1 += b.size;
            }
        }
        if allocated {
            st.allocation.increase(pool, 1);
            st.allocated_bytes.increase(pool, b.size);
            if b.size >= self.config.max_split_size {
                st.oversize_allocations.increase(1);
            }
            expect(
                "live-pointer index: misses an allocated block",
                Some(i),
                i as i64,
                self.live.find(self.arena.slots(), b.addr) as i64,
            )?;
        }
        if allocated || pending {
            st.active.increase(pool, 1);
            st.active_bytes.increase(pool, b.size);
            st.requested_bytes.increase(pool, b.requested);
        }
        if cached {
            if c.owner == 0 {
                t.cached[pool.index()] += 1;
            } else {
                t.cached_private += 1;
            }
            ensure(
                self.free_index_of(i).contains(self.arena.slots(), i),
                "free index: misses a cached block",
                Some(i),
            )?;
            if c.split && c.expandable.is_none() {
                st.inactive_split.increase(pool, 1);
                st.inactive_split_bytes.increase(pool, b.size);
            }
        }
        Ok(())
    }

    /// An unmapped block of an expandable segment: in no other state,
    /// whole pages, not next to another unmapped block, in its pool's
    /// unmapped index.
    fn check_unmapped(
        &self,
        i: u32,
        b: &BlockSlot,
        c: &mut Cursor,
        t: &mut Tally<P>,
    ) -> Result<(), InvariantViolation> {
        ensure(
            b.flags & (Flags::CACHED | Flags::ALLOCATED | Flags::DEFERRED | Flags::HAS_USES)
                == Flags::empty()
                && b.events == 0,
            "block state: an unmapped block is cached, allocated or pending",
            Some(i),
        )?;
        let (base, page) = c.expandable.unwrap_or((b.addr, 1));
        ensure(
            (b.addr - base).is_multiple_of(page) && b.size.is_multiple_of(page),
            "expandable segment: an unmapped block is not whole pages",
            Some(i),
        )?;
        ensure(
            !c.prev_unmapped,
            "two adjacent unmapped blocks (missed merge)",
            Some(i),
        )?;
        ensure(
            block_pool(&self.pools, &self.private, b.owner, c.pool)
                .contains_unmapped(self.arena.slots(), i),
            "unmapped index: misses an unmapped block",
            Some(i),
        )?;
        if c.owner == 0 {
            t.unmapped[c.pool.index()] += 1;
        } else {
            t.unmapped_private += 1;
        }
        c.prev_unmapped = true;
        c.prev_cached = false;
        ensure(
            !c.compact || b.stream == ANY_STREAM,
            "compact segment: an unmapped block of a stream",
            Some(i),
        )?;
        Ok(())
    }

    /// Every `current` statistic equals its recount (`oversize_*` only while
    /// `max_split_size` is the one the allocator was created with: after a
    /// run-time change they drift, as in PyTorch), and PyTorch's
    /// `total_allocated_memory` equals the reserved bytes.
    fn compare_stats(&self, recount: &DeviceStats) -> Result<(), InvariantViolation> {
        let same_mss = self.config.max_split_size == self.initial_config.max_split_size;
        for ((key, want), (_, have)) in recount.currents().iter().zip(self.stats.currents()) {
            if same_mss || !key.starts_with("oversize") {
                expect(key, None, *want, have)?;
            }
        }
        expect(
            "total_allocated_memory == reserved bytes",
            None,
            recount.reserved_bytes.all().current,
            self.total_allocated_memory as i64,
        )
    }
}
