//! [`LiveIndex`]: the allocated blocks by start address, for `free_ptr`,
//! `record_stream_ptr` and `allocation_info_ptr` in O(1). A hash table with
//! one bucket per slot and chains through the slots: bucket `b`'s head is
//! `slots[b].hash_head`, a block's successor in its chain `hash_next`. No
//! storage of its own beyond a count.

use crate::arena::{usable, BlockSlot, Flags, NIL};
use crate::invariants::{ensure, expect, fail, InvariantViolation};

/// The live-pointer index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveIndex {
    len: u32,
}

/// The bucket of `addr` among `buckets` (multiplicative hash of the address
/// above the 512-byte alignment, scaled without a division).
#[inline]
fn bucket(addr: u64, buckets: u32) -> u32 {
    let h = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ((h * buckets as u64) >> 32) as u32
}

impl LiveIndex {
    pub(crate) const EMPTY: LiveIndex = LiveIndex { len: 0 };

    /// Add the allocated block in slot `i`.
    #[inline]
    pub(crate) fn insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        let b = bucket(slots[i as usize].addr, usable(slots)) as usize;
        slots[i as usize].set_hash_next(slots[b].hash_head);
        slots[b].hash_head = i;
        self.len += 1;
    }

    /// Remove the block in slot `i` (it must be in the index).
    #[inline]
    pub(crate) fn remove(&mut self, slots: &mut [BlockSlot], i: u32) {
        let b = bucket(slots[i as usize].addr, usable(slots)) as usize;
        let next = slots[i as usize].hash_next();
        let mut cur = slots[b].hash_head;
        if cur == i {
            slots[b].hash_head = next;
        } else {
            while cur != NIL {
                let n = slots[cur as usize].hash_next();
                if n == i {
                    slots[cur as usize].set_hash_next(next);
                    break;
                }
                cur = n;
            }
        }
        slots[i as usize].set_hash_next(NIL);
        self.len -= 1;
    }

    /// The slot of the live allocation starting at `addr`, or `NIL`.
    #[inline]
    pub(crate) fn find(&self, slots: &[BlockSlot], addr: u64) -> u32 {
        let buckets = usable(slots);
        if buckets == 0 {
            return NIL;
        }
        let mut cur = slots[bucket(addr, buckets) as usize].hash_head;
        while cur != NIL {
            let s = &slots[cur as usize];
            if s.addr == addr {
                return cur;
            }
            cur = s.hash_next();
        }
        NIL
    }

    /// Live allocations.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Every chain ends, holds only allocated blocks hashed to its bucket,
    /// and the chains hold `len` blocks in all (that every allocated block is
    /// found is the allocator's cross-check). Visits every bucket: O(slots).
    pub(crate) fn verify(
        &self,
        slots: &[BlockSlot],
        high_water: u32,
    ) -> Result<(), InvariantViolation> {
        let buckets = usable(slots);
        let mut total = 0u32;
        for b in 0..buckets {
            let mut cur = slots[b as usize].hash_head;
            while cur != NIL {
                total += 1;
                ensure(
                    total <= high_water,
                    "live-pointer index: a chain has a cycle",
                    Some(cur),
                )?;
                let s = slots
                    .get(cur as usize)
                    .filter(|_| cur < high_water)
                    .ok_or(fail(
                        "live-pointer index: link out of range",
                        Some(cur),
                        0,
                        1,
                    ))?;
                ensure(
                    s.flags.contains(Flags::ALLOCATED),
                    "live-pointer index: holds a block that is not allocated",
                    Some(cur),
                )?;
                expect(
                    "live-pointer index: block in the wrong bucket",
                    Some(cur),
                    b as i64,
                    bucket(s.addr, buckets) as i64,
                )?;
                cur = s.hash_next();
            }
        }
        expect(
            "live-pointer index: size == chained blocks",
            None,
            self.len as i64,
            total as i64,
        )
    }
}
