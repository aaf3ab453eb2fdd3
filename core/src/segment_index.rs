//! [`SegmentIndex`]: every segment's head block, by base address (a treap
//! over the slots' segment links). It answers "which segment holds this
//! address" and walks segments in address order for snapshots, releases
//! and the invariant checker.

use crate::arena::{BlockSlot, NIL};
use crate::index::{self, SegmentKey};
use crate::invariants::{expect, fail, InvariantViolation};

/// The segment heads, by base address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SegmentIndex {
    root: u32,
    len: u32,
}

impl SegmentIndex {
    pub(crate) const EMPTY: SegmentIndex = SegmentIndex { root: NIL, len: 0 };

    /// Add the head slot `i` of a new segment.
    pub(crate) fn insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        index::insert::<SegmentKey>(slots, &mut self.root, i);
        self.len += 1;
    }

    /// Remove the head slot `i` of a released segment.
    pub(crate) fn remove(&mut self, slots: &mut [BlockSlot], i: u32) {
        if index::remove::<SegmentKey>(slots, &mut self.root, i) {
            self.len -= 1;
        }
    }

    /// The head of the segment with the lowest base, or `NIL`.
    pub(crate) fn first(&self, slots: &[BlockSlot]) -> u32 {
        index::first::<SegmentKey>(slots, self.root)
    }

    /// The head of the segment with the next base above `addr`, or `NIL`.
    pub(crate) fn successor(&self, slots: &[BlockSlot], addr: u64) -> u32 {
        index::successor::<SegmentKey>(slots, self.root, addr)
    }

    /// The head of the segment with the highest base `<= addr`, or `NIL`.
    pub(crate) fn floor(&self, slots: &[BlockSlot], addr: u64) -> u32 {
        index::floor::<SegmentKey>(slots, self.root, addr)
    }

    /// The head of the segment containing `addr`, or `NIL`.
    pub(crate) fn containing(&self, slots: &[BlockSlot], addr: u64) -> u32 {
        let h = self.floor(slots, addr);
        match slots.get(h as usize) {
            Some(s) if addr - s.addr < s.seg_size => h,
            _ => NIL,
        }
    }

    /// The tree is a valid treap of at most `limit` nodes holding `len` heads.
    pub(crate) fn verify(&self, slots: &[BlockSlot], limit: u32) -> Result<(), InvariantViolation> {
        let n = index::verify::<SegmentKey>(slots, self.root, limit)
            .map_err(|w| fail(w, None, 0, 1))?;
        expect(
            "segment index: size == segment count",
            None,
            self.len as i64,
            n as i64,
        )
    }
}
