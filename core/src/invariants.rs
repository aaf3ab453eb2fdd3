//! `check_invariants()`: re-derive everything from the block lists and
//! compare. One checker, shared by unit tests, integration tests, loom models
//! and fuzz targets.

use crate::allocator::DeviceAllocator;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::index::{self, FreeIndex, SegmentIndex};
use crate::policy::Pool;
use crate::pool::pool_of;
use crate::stats::StatArray;
use core::fmt;

/// A broken invariant: what, where (a slot index, or `u32::MAX`), and the
/// expected and found values where numbers are involved.
///
/// ```
/// use cachealloc_core::InvariantViolation;
/// let v = InvariantViolation { what: "example", slot: 3, expected: 1, found: 2 };
/// assert!(format!("{v}").contains("example"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvariantViolation {
    /// The invariant.
    pub what: &'static str,
    /// The slot involved, or `u32::MAX`.
    pub slot: u32,
    /// The value it should have.
    pub expected: i64,
    /// The value it has.
    pub found: i64,
}

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant broken: {}", self.what)?;
        if self.slot != NIL {
            write!(f, " (slot {})", self.slot)?;
        }
        write!(f, ": expected {}, found {}", self.expected, self.found)
    }
}

impl core::error::Error for InvariantViolation {}

fn fail(what: &'static str, slot: u32, expected: i64, found: i64) -> InvariantViolation {
    InvariantViolation {
        what,
        slot,
        expected,
        found,
    }
}

fn expect(
    what: &'static str,
    slot: u32,
    expected: i64,
    found: i64,
) -> Result<(), InvariantViolation> {
    if expected == found {
        Ok(())
    } else {
        Err(fail(what, slot, expected, found))
    }
}

#[derive(Default)]
struct Tally {
    segment: [i64; 3],
    reserved: [i64; 3],
    allocation: [i64; 3],
    allocated_bytes: [i64; 3],
    active: [i64; 3],
    active_bytes: [i64; 3],
    requested: [i64; 3],
    inactive_split: [i64; 3],
    inactive_split_bytes: [i64; 3],
    cached: [u32; 2],
    oversize_allocations: i64,
    oversize_segments: i64,
    blocks: u32,
    live: u32,
}

/// Counts wrap like the statistics themselves (sizes near 2^60 can add up
/// past `i64::MAX`).
fn add(a: &mut [i64; 3], pool: Pool, x: i64) {
    a[0] = a[0].wrapping_add(x);
    let i = match pool {
        Pool::Small => 1,
        Pool::Large => 2,
    };
    a[i] = a[i].wrapping_add(x);
}

fn compare(
    what: &'static str,
    tally: &[i64; 3],
    stat: &StatArray,
) -> Result<(), InvariantViolation> {
    for (k, t) in tally.iter().enumerate() {
        expect(what, NIL, *t, stat.0[k].current)?;
    }
    Ok(())
}

impl<B, S, const E: usize> DeviceAllocator<B, S, E>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    /// Check every structural and accounting invariant:
    /// segments tile exactly and do not overlap; no two adjacent blocks are
    /// both cached; the free index of each pool holds exactly the cached
    /// blocks, in (stream, size, address) order; the live-pointer index holds
    /// exactly the allocated blocks; pending blocks have as many queued events
    /// as they count; every slot is either in a segment or on the free-slot
    /// list; and every `current` statistic equals a recount.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let slots = self.arena.slots();
        let hw = self.arena.high_water();
        let free_slots =
            self.arena
                .free_list_len()
                .ok_or(fail("free-slot list has a cycle", NIL, 0, 1))?;
        expect(
            "slots in use + free slots == slots ever used",
            NIL,
            hw as i64,
            (self.arena.in_use() + free_slots) as i64,
        )?;

        let nseg = index::verify::<SegmentIndex>(slots, self.seg_root, hw)
            .map_err(|w| fail(w, NIL, 0, 1))?;
        expect("segment index size", NIL, self.segments as i64, nseg as i64)?;

        let mss = self.config.max_split_size;
        let mut t = Tally::default();
        let mut prev_end = 0u64;
        let mut h = index::first::<SegmentIndex>(slots, self.seg_root);
        while h != NIL {
            let head = &slots[h as usize];
            let pool = pool_of(head.flags);
            if head.prev != NIL {
                return Err(fail(
                    "segment head has a predecessor",
                    h,
                    NIL as i64,
                    head.prev as i64,
                ));
            }
            if head.addr < prev_end {
                return Err(fail(
                    "segments overlap",
                    h,
                    prev_end as i64,
                    head.addr as i64,
                ));
            }
            prev_end = head.addr.wrapping_add(head.seg_size);
            add(&mut t.segment, pool, 1);
            add(&mut t.reserved, pool, head.seg_size as i64);
            if head.seg_size >= mss {
                t.oversize_segments += 1;
            }
            let split = head.next != NIL;
            let mut addr = head.addr;
            let mut cur = h;
            let mut prev = NIL;
            let mut prev_cached = false;
            while cur != NIL {
                t.blocks += 1;
                if t.blocks > hw {
                    return Err(fail(
                        "segment block lists have a cycle",
                        cur,
                        hw as i64,
                        t.blocks as i64,
                    ));
                }
                let b =
                    slots
                        .get(cur as usize)
                        .ok_or(fail("block link out of range", cur, 0, 1))?;
                if !b.has(Flags::IN_USE) {
                    return Err(fail("block in a segment sits in a free slot", cur, 1, 0));
                }
                expect("block prev link", cur, prev as i64, b.prev as i64)?;
                expect(
                    "blocks tile the segment (address)",
                    cur,
                    addr as i64,
                    b.addr as i64,
                )?;
                expect(
                    "block stream == segment stream",
                    cur,
                    head.stream as i64,
                    b.stream as i64,
                )?;
                if pool_of(b.flags) != pool || b.size == 0 {
                    return Err(fail("block pool or size", cur, 0, b.size as i64));
                }
                let cached = b.has(Flags::CACHED);
                let allocated = b.has(Flags::ALLOCATED);
                let pending = b.events > 0;
                if (cached as u8 + allocated as u8 + pending as u8) != 1 {
                    return Err(fail(
                        "block is not exactly one of allocated / pending / cached",
                        cur,
                        1,
                        b.flags.bits() as i64,
                    ));
                }
                if b.has(Flags::HAS_USES) && !allocated {
                    return Err(fail(
                        "stream uses on a block that is not allocated",
                        cur,
                        0,
                        1,
                    ));
                }
                if cached && prev_cached {
                    return Err(fail("two adjacent cached blocks (missed merge)", cur, 0, 1));
                }
                prev_cached = cached;
                if allocated {
                    add(&mut t.allocation, pool, 1);
                    add(&mut t.allocated_bytes, pool, b.size as i64);
                    if b.size >= mss {
                        t.oversize_allocations += 1;
                    }
                    t.live += 1;
                    expect(
                        "allocated block in the live-pointer index",
                        cur,
                        cur as i64,
                        self.live_find(b.addr) as i64,
                    )?;
                }
                if allocated || pending {
                    add(&mut t.active, pool, 1);
                    add(&mut t.active_bytes, pool, b.size as i64);
                    add(&mut t.requested, pool, b.requested as i64);
                }
                if cached {
                    t.cached[if pool == Pool::Small { 0 } else { 1 }] += 1;
                    let root = self.pools[if pool == Pool::Small { 0 } else { 1 }].root;
                    let found =
                        index::lower_bound::<FreeIndex>(slots, root, (b.stream, b.size, b.addr));
                    expect(
                        "cached block in its pool's free index",
                        cur,
                        cur as i64,
                        found as i64,
                    )?;
                    if split {
                        add(&mut t.inactive_split, pool, 1);
                        add(&mut t.inactive_split_bytes, pool, b.size as i64);
                    }
                }
                addr = addr.wrapping_add(b.size);
                prev = cur;
                cur = b.next;
            }
            expect(
                "blocks tile the segment (size)",
                h,
                head.addr.wrapping_add(head.seg_size) as i64,
                addr as i64,
            )?;
            h = index::successor::<SegmentIndex>(slots, self.seg_root, head.addr);
        }
        expect(
            "every slot in use belongs to a segment",
            NIL,
            self.arena.in_use() as i64,
            t.blocks as i64,
        )?;

        for (p, pool) in self.pools.iter().enumerate() {
            let n =
                index::verify::<FreeIndex>(slots, pool.root, hw).map_err(|w| fail(w, NIL, 0, 1))?;
            expect(
                "free index size == its count",
                NIL,
                pool.len as i64,
                n as i64,
            )?;
            expect(
                "free index == the set of cached blocks",
                NIL,
                t.cached[p] as i64,
                n as i64,
            )?;
        }
        expect(
            "live-pointer index size",
            NIL,
            t.live as i64,
            self.live as i64,
        )?;

        let mut queued_total = 0i64;
        for pe in self.pending.iter() {
            let s = slots.get(pe.slot as usize).ok_or(fail(
                "pending event for a missing slot",
                pe.slot,
                0,
                1,
            ))?;
            let queued = self.pending.iter().filter(|q| q.slot == pe.slot).count() as i64;
            expect(
                "block event count == its queued events",
                pe.slot,
                queued,
                s.events as i64,
            )?;
        }
        for s in &slots[..hw as usize] {
            queued_total += s.events as i64;
        }
        expect(
            "pending events == sum of block event counts",
            NIL,
            self.pending.len() as i64,
            queued_total,
        )?;
        for (k, q) in self.queue_order.iter().enumerate() {
            if !self.pending.iter().any(|pe| pe.stream.into() == *q)
                || self.queue_order[..k].contains(q)
            {
                return Err(fail(
                    "event queue order lists a stream without events, or twice",
                    NIL,
                    0,
                    *q as i64,
                ));
            }
        }
        for pe in self.pending.iter() {
            if !self.queue_order.contains(&pe.stream.into()) {
                return Err(fail(
                    "pending event on a stream missing from the queue order",
                    pe.slot,
                    1,
                    0,
                ));
            }
        }
        for u in self.uses.iter() {
            let s = slots.get(u.slot as usize).ok_or(fail(
                "stream use of a missing slot",
                u.slot,
                0,
                1,
            ))?;
            if !s.has(Flags::HAS_USES) || !s.has(Flags::ALLOCATED) {
                return Err(fail(
                    "stream use of a block that is not allocated",
                    u.slot,
                    1,
                    0,
                ));
            }
        }

        let st = &self.stats;
        compare("segment == recount", &t.segment, &st.segment)?;
        compare("reserved_bytes == recount", &t.reserved, &st.reserved_bytes)?;
        compare("allocation == recount", &t.allocation, &st.allocation)?;
        compare(
            "allocated_bytes == recount",
            &t.allocated_bytes,
            &st.allocated_bytes,
        )?;
        compare("active == recount", &t.active, &st.active)?;
        compare("active_bytes == recount", &t.active_bytes, &st.active_bytes)?;
        compare(
            "requested_bytes == recount",
            &t.requested,
            &st.requested_bytes,
        )?;
        compare(
            "inactive_split == recount",
            &t.inactive_split,
            &st.inactive_split,
        )?;
        compare(
            "inactive_split_bytes == recount",
            &t.inactive_split_bytes,
            &st.inactive_split_bytes,
        )?;
        expect(
            "total allocated memory == reserved bytes",
            NIL,
            t.reserved[0],
            self.total_allocated_memory as i64,
        )?;
        if self.config.max_split_size == self.initial_config.max_split_size {
            // After a run-time max_split_size change these drift, as in PyTorch.
            expect(
                "oversize_allocations == recount",
                NIL,
                t.oversize_allocations,
                st.oversize_allocations.current,
            )?;
            expect(
                "oversize_segments == recount",
                NIL,
                t.oversize_segments,
                st.oversize_segments.current,
            )?;
        }
        Ok(())
    }
}
