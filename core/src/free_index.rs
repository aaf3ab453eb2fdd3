//! A pool's free index: its cached blocks in PyTorch's exact order
//! (stream, size, address), as `BlockPool::blocks` keeps them, but flatter
//! than one tree. The blocks of one stream (the pool's main stream, in
//! practice the only one) sit in [`BINS`] size classes, each a small treap in
//! exact order, with a two-level bitmap of the non-empty classes; the blocks
//! of every other stream share one treap. A query searches one class and, if
//! that class has nothing at or above the key, takes the first block of the
//! next non-empty class from the bitmap: the answers are those of one treap
//! over every block (a property test compares them), with a search path
//! shorter by the log of the number of classes in use.
//!
//! A small index is one treap: below [`BINS_FROM`] blocks the classes cost
//! more than they save (the cache-hit pair of the benchmarks keeps a handful
//! of blocks). The index moves its main stream's blocks into the classes
//! when it grows to [`BINS_FROM`] blocks, and back when it shrinks to
//! [`BINS_UNTIL`]: far enough apart that no sequence pays for the moves
//! more often than once per 48 operations.
//!
//! All links live in the block slots (the treap links `left` / `right`); the
//! index itself is a fixed 1 KiB of bin roots. No allocation.

use crate::arena::{BlockSlot, NIL};
use crate::bin_map::{size_class, BinMap, BINS};
use crate::index::{self, FreeKey, Links};

/// Blocks at which a one-tree index moves into size classes.
pub(crate) const BINS_FROM: u32 = 64;
/// Blocks at which an index in size classes moves back into one tree.
pub(crate) const BINS_UNTIL: u32 = 16;

/// The key of a cached block: (stream, size, address).
pub(crate) type FreeIndexKey = <FreeKey as Links>::Key;

#[inline]
fn key(slots: &[BlockSlot], i: u32) -> FreeIndexKey {
    FreeKey::key(&slots[i as usize])
}

/// The smaller of two answers (`NIL` is no answer).
#[inline]
fn min_of(slots: &[BlockSlot], a: u32, b: u32) -> u32 {
    if a == NIL || (b != NIL && key(slots, b) < key(slots, a)) {
        b
    } else {
        a
    }
}

/// The larger of two answers.
#[inline]
fn max_of(slots: &[BlockSlot], a: u32, b: u32) -> u32 {
    if a == NIL || (b != NIL && key(slots, b) > key(slots, a)) {
        b
    } else {
        a
    }
}

/// The free index of one pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeIndex {
    /// The stream whose blocks are in the bins. With `use_bins`, none of
    /// its blocks is in `others`. It changes only while the bins are empty.
    stream: u64,
    /// Whether the main stream's blocks go to the bins (else the bins are
    /// empty and every block is in `others`).
    use_bins: bool,
    /// Blocks in the bins.
    binned: u32,
    /// Blocks in the index.
    len: u32,
    map: BinMap,
    /// Treap root of each size class.
    roots: [u32; BINS],
    /// Treap root of the blocks of every other stream.
    others: u32,
}

impl FreeIndex {
    pub(crate) const EMPTY: FreeIndex = FreeIndex {
        stream: 0,
        use_bins: false,
        binned: 0,
        len: 0,
        map: BinMap::EMPTY,
        roots: [NIL; BINS],
        others: NIL,
    };

    /// Add slot `i` (its key must not be in the index).
    #[inline]
    pub(crate) fn insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        self.len += 1;
        if !self.use_bins {
            index::insert::<FreeKey>(slots, &mut self.others, i);
            if self.len >= BINS_FROM {
                self.move_into_bins(slots, slots[i as usize].stream);
            }
            return;
        }
        self.binned_insert(slots, i);
    }

    fn binned_insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        let stream = slots[i as usize].stream;
        if stream != self.stream && self.binned == 0 && !self.others_have(slots, stream) {
            self.stream = stream;
        }
        if stream == self.stream {
            self.bin_insert(slots, i);
        } else {
            index::insert::<FreeKey>(slots, &mut self.others, i);
        }
    }

    #[inline]
    fn bin_insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        let c = size_class(slots[i as usize].size);
        index::insert::<FreeKey>(slots, &mut self.roots[c], i);
        self.map.set(c);
        self.binned += 1;
    }

    /// Use the bins, for `stream`: its blocks move out of the one tree.
    #[cold]
    fn move_into_bins(&mut self, slots: &mut [BlockSlot], stream: u64) {
        self.use_bins = true;
        self.stream = stream;
        loop {
            let b = index::lower_bound::<FreeKey>(slots, self.others, (stream, 0, 0));
            if b == NIL || slots[b as usize].stream != stream {
                return;
            }
            index::remove::<FreeKey>(slots, &mut self.others, b);
            self.bin_insert(slots, b);
        }
    }

    /// Stop using the bins: their blocks move into the one tree.
    #[cold]
    fn move_out_of_bins(&mut self, slots: &mut [BlockSlot]) {
        while let Some(c) = self.map.next_from(0) {
            let b = index::first::<FreeKey>(slots, self.roots[c]);
            index::remove::<FreeKey>(slots, &mut self.roots[c], b);
            if self.roots[c] == NIL {
                self.map.clear(c);
            }
            self.binned -= 1;
            index::insert::<FreeKey>(slots, &mut self.others, b);
        }
        self.use_bins = false;
    }

    /// Take slot `i` out; `false` if it is not in.
    #[inline]
    pub(crate) fn remove(&mut self, slots: &mut [BlockSlot], i: u32) -> bool {
        if !self.use_bins {
            let found = index::remove::<FreeKey>(slots, &mut self.others, i);
            self.len -= found as u32;
            return found;
        }
        self.binned_remove(slots, i)
    }

    fn binned_remove(&mut self, slots: &mut [BlockSlot], i: u32) -> bool {
        let (stream, size) = {
            let s = &slots[i as usize];
            (s.stream, s.size)
        };
        if stream != self.stream || self.binned == 0 {
            if !index::remove::<FreeKey>(slots, &mut self.others, i) {
                return false;
            }
        } else {
            let c = size_class(size);
            if !index::remove::<FreeKey>(slots, &mut self.roots[c], i) {
                return false;
            }
            if self.roots[c] == NIL {
                self.map.clear(c);
            }
            self.binned -= 1;
        }
        self.len -= 1;
        if self.len <= BINS_UNTIL {
            self.move_out_of_bins(slots);
        }
        true
    }

    /// Whether the other streams' treap holds a block of `stream`.
    fn others_have(&self, slots: &[BlockSlot], stream: u64) -> bool {
        let b = index::lower_bound::<FreeKey>(slots, self.others, (stream, 0, 0));
        b != NIL && slots[b as usize].stream == stream
    }

    /// The first binned block, or `NIL`.
    fn bins_first(&self, slots: &[BlockSlot]) -> u32 {
        match self.map.next_from(0) {
            Some(c) => index::first::<FreeKey>(slots, self.roots[c]),
            None => NIL,
        }
    }

    /// The last binned block, or `NIL`.
    fn bins_last(&self, slots: &[BlockSlot]) -> u32 {
        match self.map.prev_from(BINS - 1) {
            Some(c) => index::last::<FreeKey>(slots, self.roots[c]),
            None => NIL,
        }
    }

    /// The first binned block with key `>= key` (`strict`: `> key`).
    #[inline]
    fn bins_above(&self, slots: &[BlockSlot], key: FreeIndexKey, strict: bool) -> u32 {
        if self.binned == 0 || key.0 > self.stream {
            return NIL;
        }
        if key.0 < self.stream {
            return self.bins_first(slots);
        }
        let c = size_class(key.1);
        if self.map.get(c) {
            let b = if strict {
                index::successor::<FreeKey>(slots, self.roots[c], key)
            } else {
                index::lower_bound::<FreeKey>(slots, self.roots[c], key)
            };
            if b != NIL {
                return b;
            }
        }
        match self.map.next_from(c + 1) {
            Some(d) => index::first::<FreeKey>(slots, self.roots[d]),
            None => NIL,
        }
    }

    /// The last binned block with key `< key`.
    fn bins_below(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        if self.binned == 0 || key.0 < self.stream {
            return NIL;
        }
        if key.0 > self.stream {
            return self.bins_last(slots);
        }
        let c = size_class(key.1);
        if self.map.get(c) {
            let b = index::predecessor::<FreeKey>(slots, self.roots[c], key);
            if b != NIL {
                return b;
            }
        }
        match c.checked_sub(1).and_then(|c| self.map.prev_from(c)) {
            Some(d) => index::last::<FreeKey>(slots, self.roots[d]),
            None => NIL,
        }
    }

    /// The block with the smallest key `>= key`, or `NIL`.
    #[inline]
    pub(crate) fn lower_bound(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        if !self.use_bins {
            return index::lower_bound::<FreeKey>(slots, self.others, key);
        }
        self.binned_lower_bound(slots, key)
    }

    fn binned_lower_bound(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        let b = self.bins_above(slots, key, false);
        if self.others == NIL || (b != NIL && key.0 == self.stream) {
            return b; // no other stream's block lies between
        }
        min_of(
            slots,
            b,
            index::lower_bound::<FreeKey>(slots, self.others, key),
        )
    }

    /// The block with the smallest key `> key`, or `NIL`.
    #[inline]
    pub(crate) fn successor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        if !self.use_bins {
            return index::successor::<FreeKey>(slots, self.others, key);
        }
        self.binned_successor(slots, key)
    }

    fn binned_successor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        let b = self.bins_above(slots, key, true);
        if self.others == NIL || (b != NIL && key.0 == self.stream) {
            return b;
        }
        min_of(
            slots,
            b,
            index::successor::<FreeKey>(slots, self.others, key),
        )
    }

    /// The block with the largest key `< key`, or `NIL`.
    pub(crate) fn predecessor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        let b = self.bins_below(slots, key);
        if self.others == NIL {
            return b;
        }
        max_of(
            slots,
            b,
            index::predecessor::<FreeKey>(slots, self.others, key),
        )
    }

    /// Whether a cached block of `size` may change its size to `new_size`
    /// in place (its neighbours in the exact order unchanged): in a one-tree
    /// index, yes; with bins, only within its size class.
    #[inline]
    pub(crate) fn may_resize(&self, size: u64, new_size: u64) -> bool {
        !self.use_bins || size_class(size) == size_class(new_size)
    }

    /// Check the whole index: each class a valid treap of blocks of the
    /// binned stream and of that class, the bitmap set exactly for the
    /// non-empty classes, the other streams' treap valid and free of the
    /// binned stream, at most `limit` blocks in all. Returns the count.
    pub(crate) fn verify(&self, slots: &[BlockSlot], limit: u32) -> Result<u32, &'static str> {
        if !self.map.consistent() {
            return Err("free index: the bitmap's two levels disagree");
        }
        if !self.use_bins && self.map.next_from(0).is_some() {
            return Err("free index: blocks in the bins of a one-tree index");
        }
        let mut binned = 0u32;
        for c in 0..BINS {
            let root = self.roots[c];
            if (root != NIL) != self.map.get(c) {
                return Err("free index: a bin's bit disagrees with its contents");
            }
            binned += index::verify::<FreeKey>(slots, root, limit)?;
            if binned > limit {
                return Err(FreeKey::DEFECTS[0]);
            }
            let mut b = index::first::<FreeKey>(slots, root);
            while b != NIL {
                let s = &slots[b as usize];
                if s.stream != self.stream {
                    return Err("free index: a binned block of another stream");
                }
                if size_class(s.size) != c {
                    return Err("free index: a block in the wrong size class");
                }
                b = index::successor::<FreeKey>(slots, root, FreeKey::key(s));
            }
        }
        if binned != self.binned {
            return Err("free index: the binned count is wrong");
        }
        let others = index::verify::<FreeKey>(slots, self.others, limit)?;
        if self.use_bins && self.others_have(slots, self.stream) {
            return Err("free index: the binned stream also in the other streams' tree");
        }
        if binned as u64 + others as u64 > limit as u64 {
            return Err(FreeKey::DEFECTS[0]);
        }
        if binned + others != self.len {
            return Err("free index: its count is wrong");
        }
        if self.use_bins && self.len <= BINS_UNTIL || !self.use_bins && self.len >= BINS_FROM {
            return Err("free index: bins in use against their thresholds");
        }
        Ok(binned + others)
    }

    /// Test hook: use the bins now, whatever the count.
    #[cfg(test)]
    pub(crate) fn force_bins(&mut self, slots: &mut [BlockSlot], stream: u64) {
        self.move_into_bins(slots, stream);
    }

    /// Test hook: flip one bin's bit.
    #[cfg(test)]
    pub(crate) fn corrupt_bitmap(&mut self, c: usize) {
        self.map.corrupt(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Sizes from every part of the class range: exact classes, the
    /// log-linear ones, the shared last class; many equal sizes.
    fn random_size(r: &mut Rng) -> u64 {
        match r.below(6) {
            0 => (1 + r.below(15)) * 512,
            1 => (1 + r.below(4096)) * 512,
            2 => [4096u64, 20 << 20, 2 << 20, 1 << 20][r.below(4) as usize],
            3 => (1 + r.below(1 << 20)) * (2 << 20),
            4 => u64::MAX - r.below(1 << 30) * 512,
            _ => r.below(1 << 40) * 512,
        }
    }

    fn random_stream(r: &mut Rng, streams: u64) -> u64 {
        match r.below(streams) {
            0 => 0,
            1 => 7,
            2 => u64::MAX,
            k => k * 1000,
        }
    }

    fn check_answers(ix: &FreeIndex, a: &[BlockSlot], root: u32, b: &[BlockSlot], q: FreeIndexKey) {
        assert_eq!(
            ix.lower_bound(a, q),
            index::lower_bound::<FreeKey>(b, root, q),
            "lower_bound({q:?})"
        );
        assert_eq!(
            ix.successor(a, q),
            index::successor::<FreeKey>(b, root, q),
            "successor({q:?})"
        );
        assert_eq!(
            ix.predecessor(a, q),
            index::predecessor::<FreeKey>(b, root, q),
            "predecessor({q:?})"
        );
    }

    /// The property test of the issue: the index and one treap over the
    /// same blocks (each in its own copy of the slots) give the same answer
    /// to every query, over random insert / remove sequences with one to
    /// five streams, growing and shrinking through the bins' thresholds.
    #[test]
    fn same_answers_as_one_treap() {
        for seed in 1..=24u64 {
            let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let streams = 1 + seed % 5;
            let n = 64 + (seed * 37 % 400) as usize;
            let mut a: Vec<BlockSlot> = (0..n)
                .map(|k| BlockSlot {
                    addr: k as u64 * (1 << 21) + r.below(4) * 512,
                    size: random_size(&mut r),
                    stream: random_stream(&mut r, streams),
                    ..BlockSlot::VACANT
                })
                .collect();
            let mut b = a.clone();
            let mut ix = FreeIndex::EMPTY;
            let mut root = NIL;
            let mut inside = std::vec![false; n];
            let mut switches = 0;
            let mut was = false;
            for step in 0..3000 {
                // Phases that grow or shrink the index, long enough for it
                // to cross the bins' thresholds both ways.
                let grow = (step / (2 * n + 50)) % 2 == 0;
                // Mostly the phase's operation: the next slot from a random
                // one that is out of the index (grow) or in it (shrink).
                let want_in = if r.below(5) == 0 { grow } else { !grow };
                let from = r.below(n as u64) as usize;
                let i = (0..n)
                    .map(|k| (from + k) % n)
                    .find(|&k| inside[k] == want_in)
                    .unwrap_or(from) as u32;
                if inside[i as usize] {
                    assert!(ix.remove(&mut a, i));
                    assert!(index::remove::<FreeKey>(&mut b, &mut root, i));
                } else {
                    assert!(!ix.remove(&mut a, i), "removed a block not in it");
                    // Sometimes come back with a new size or stream.
                    if r.below(4) == 0 {
                        let s = random_size(&mut r);
                        let t = random_stream(&mut r, streams);
                        for v in [&mut a, &mut b] {
                            v[i as usize].size = s;
                            v[i as usize].stream = t;
                        }
                    }
                    ix.insert(&mut a, i);
                    index::insert::<FreeKey>(&mut b, &mut root, i);
                }
                inside[i as usize] = !inside[i as usize];
                if ix.use_bins != was {
                    switches += 1;
                    was = ix.use_bins;
                }
                let some = &a[r.below(n as u64) as usize];
                let exact = FreeKey::key(some);
                let q = (
                    random_stream(&mut r, streams),
                    random_size(&mut r),
                    r.below(1 << 30),
                );
                for q in [
                    exact,
                    q,
                    (exact.0, exact.1, 0),
                    (exact.0, 0, 0),
                    (exact.0, u64::MAX, u64::MAX),
                ] {
                    check_answers(&ix, &a, root, &b, q);
                }
                if step % 100 == 0 || step == 2999 {
                    let want = inside.iter().filter(|&&x| x).count() as u32;
                    assert_eq!(ix.verify(&a, n as u32), Ok(want), "seed {seed} step {step}");
                }
            }
            assert!(
                switches >= 2,
                "seed {seed}: the bins were switched {switches} times"
            );
        }
    }

    fn filled(n: u64, streams: u64) -> (FreeIndex, Vec<BlockSlot>) {
        let mut a: Vec<BlockSlot> = (0..n)
            .map(|k| BlockSlot {
                addr: k << 21,
                size: (1 + k % 40) * 4096,
                stream: k % streams,
                ..BlockSlot::VACANT
            })
            .collect();
        let mut ix = FreeIndex::EMPTY;
        for i in 0..n as u32 {
            ix.insert(&mut a, i);
        }
        assert_eq!(ix.verify(&a, n as u32), Ok(n as u32));
        (ix, a)
    }

    #[test]
    fn verify_finds_a_wrong_bitmap() {
        let (mut ix, a) = filled(100, 1);
        let c = size_class(4096 * 3);
        ix.corrupt_bitmap(c);
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: a bin's bit disagrees with its contents")
        );
        let (mut ix, a) = filled(100, 1);
        ix.corrupt_bitmap(BINS - 1);
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: the bitmap's two levels disagree")
        );
    }

    #[test]
    fn verify_finds_a_block_in_the_wrong_class_or_stream() {
        // A binned block whose size moved to another class without leaving
        // its bin (an in-place re-key that crossed a class boundary).
        let (ix, mut a) = filled(100, 1);
        // Block 90 is the last of its class (blocks 10, 50, 90 are 44 KiB),
        // so a larger size keeps the class's treap in order.
        a[90].size = 1 << 30;
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: a block in the wrong size class")
        );
        // A binned block that changed stream.
        let (ix, mut a) = filled(100, 1);
        let last = 99;
        a[last].stream = 0;
        a[last].addr += 1; // unchanged order
        assert_eq!(ix.verify(&a, 100), Ok(100));
        a[last].stream = 1;
        assert!(ix.verify(&a, 100).is_err());
        // The other streams' tree holding a block of the binned stream
        // (stream 1: block 63 made the index move into bins).
        let (mut ix, mut a) = filled(100, 2);
        assert!(ix.use_bins && ix.stream == 1);
        let even = 2; // stream 0, in the other streams' tree
        assert!(ix.remove(&mut a, even));
        a[even as usize].stream = 2;
        ix.insert(&mut a, even);
        a[even as usize].stream = 1; // still above every stream-0 block
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: the binned stream also in the other streams' tree")
        );
    }

    #[test]
    fn bins_from_64_blocks_until_16() {
        let (mut ix, mut a) = filled(100, 3);
        let mut ix2 = FreeIndex::EMPTY;
        let mut b = a.clone();
        for i in 0..63 {
            ix2.insert(&mut b, i);
        }
        assert!(!ix2.use_bins && ix2.binned == 0);
        ix2.insert(&mut b, 63);
        assert!(ix2.use_bins && ix2.binned > 0);
        assert_eq!(ix2.verify(&b, 100), Ok(64));
        for i in 0..83 {
            assert!(ix.remove(&mut a, i));
            assert!(ix.use_bins, "still in bins at {} blocks", ix.len);
        }
        assert!(ix.remove(&mut a, 83));
        assert_eq!((ix.use_bins, ix.binned, ix.len), (false, 0, 16));
        assert_eq!(ix.verify(&a, 100), Ok(16));
        // A one-tree index with a block left in a bin.
        ix.map.set(3);
        ix.roots[3] = 90;
        assert!(ix.verify(&a, 100).is_err());
    }

    #[test]
    fn verify_finds_a_wrong_count_and_a_cycle() {
        let (mut ix, a) = filled(100, 1);
        ix.binned += 1;
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: the binned count is wrong")
        );
        let (mut ix, a) = filled(100, 1);
        ix.len += 1;
        assert_eq!(ix.verify(&a, 100), Err("free index: its count is wrong"));
        let (ix, mut a) = filled(100, 1);
        // A child linked back to the root of its bin.
        let c = (0..BINS).find(|&c| {
            ix.roots[c] != NIL && {
                let r = ix.roots[c] as usize;
                a[r].left != NIL || a[r].right != NIL
            }
        });
        let c = c.expect("a bin with two blocks");
        let root = ix.roots[c];
        let child = if a[root as usize].left != NIL {
            a[root as usize].left
        } else {
            a[root as usize].right
        };
        a[child as usize].left = root;
        assert!(ix.verify(&a, 100).is_err());
    }
}
