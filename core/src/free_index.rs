//! A pool's free index: its cached blocks in PyTorch's exact order
//! (stream, size, address), as `BlockPool::blocks` keeps them, but flatter
//! than one tree. A large index puts the blocks of one stream (the pool's
//! main stream, in practice the only one) in [`BINS`] size classes, each a
//! small treap in exact order, with a two-level bitmap of the non-empty
//! classes; every other block is in one more treap. A query searches one
//! class and, if that class has nothing at or above the key, takes the first
//! block of the next non-empty class from the bitmap, then compares with the
//! other treap's answer: the answers are those of one treap over every block
//! (a property test compares them), with a search path shorter by the log
//! of the number of classes in use.
//!
//! A small index is one treap: below [`BINS_FROM`] blocks the classes cost
//! more than they save (a cache-hit loop over a handful of blocks runs more
//! instructions with classes; a pool of a few dozen blocks already runs
//! faster with them). New blocks go to the classes from [`BINS_FROM`] blocks on,
//! and to the one treap again from [`BINS_UNTIL`] down. Nothing moves when
//! the mode changes: a block stays where it was put until it leaves, and
//! queries always consult both parts, so a workload that hovers around a
//! threshold pays nothing for crossing it.
//!
//! All links live in the block slots (the treap links `left` / `right`); the
//! index itself is a fixed 1 KiB of bin roots. No allocation.

use crate::arena::{BlockSlot, NIL};
use crate::bin_map::{size_class, BinMap, BINS};
use crate::index::{self, FreeKey, Links};

/// Blocks from which new blocks go to the size classes (chosen on the
/// bundled traces: lower thresholds did as well, higher ones were slower).
pub(crate) const BINS_FROM: u32 = 16;
/// Blocks from which new blocks go to the one treap again.
pub(crate) const BINS_UNTIL: u32 = 4;

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
    /// The stream whose blocks go to the bins. It changes only while the
    /// bins are empty.
    stream: u64,
    /// Whether new blocks of `stream` go to the bins.
    use_bins: bool,
    /// Blocks in the bins.
    binned: u32,
    /// Blocks in the index.
    len: u32,
    map: BinMap,
    /// Treap root of each size class.
    roots: [u32; BINS],
    /// Treap root of every other block.
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
            if self.len < BINS_FROM {
                index::insert::<FreeKey>(slots, &mut self.others, i);
                return;
            }
            self.use_bins = true;
        }
        self.binned_insert(slots, i);
    }

    fn binned_insert(&mut self, slots: &mut [BlockSlot], i: u32) {
        let stream = slots[i as usize].stream;
        if self.binned == 0 {
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

    /// Take slot `i` out; `false` if it is not in.
    #[inline]
    pub(crate) fn remove(&mut self, slots: &mut [BlockSlot], i: u32) -> bool {
        let found = if self.binned == 0 {
            index::remove::<FreeKey>(slots, &mut self.others, i)
        } else {
            self.binned_remove(slots, i)
        };
        if found {
            self.len -= 1;
            if self.len <= BINS_UNTIL {
                self.use_bins = false;
            }
        }
        found
    }

    fn binned_remove(&mut self, slots: &mut [BlockSlot], i: u32) -> bool {
        let (stream, size) = {
            let s = &slots[i as usize];
            (s.stream, s.size)
        };
        if stream == self.stream {
            let c = size_class(size);
            if index::remove::<FreeKey>(slots, &mut self.roots[c], i) {
                if self.roots[c] == NIL {
                    self.map.clear(c);
                }
                self.binned -= 1;
                return true;
            }
        }
        index::remove::<FreeKey>(slots, &mut self.others, i)
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
        if key.0 > self.stream {
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
        if key.0 < self.stream {
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
        let o = index::lower_bound::<FreeKey>(slots, self.others, key);
        if self.binned == 0 {
            return o;
        }
        min_of(slots, self.bins_above(slots, key, false), o)
    }

    /// The block with the smallest key `> key`, or `NIL`.
    #[inline]
    pub(crate) fn successor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        let o = index::successor::<FreeKey>(slots, self.others, key);
        if self.binned == 0 {
            return o;
        }
        min_of(slots, self.bins_above(slots, key, true), o)
    }

    /// The block with the largest key `< key`, or `NIL`.
    pub(crate) fn predecessor(&self, slots: &[BlockSlot], key: FreeIndexKey) -> u32 {
        let o = index::predecessor::<FreeKey>(slots, self.others, key);
        if self.binned == 0 {
            return o;
        }
        max_of(slots, self.bins_below(slots, key), o)
    }

    /// Whether a cached block of `size` may change its size to `new_size`
    /// in place (its neighbours in the exact order unchanged): with no
    /// block in the bins, yes; else only within its size class (the block
    /// may be in one).
    #[inline]
    pub(crate) fn may_resize(&self, size: u64, new_size: u64) -> bool {
        self.binned == 0 || size_class(size) == size_class(new_size)
    }

    /// Check the whole index: each class a valid treap of blocks of the
    /// binned stream and of that class, the bitmap set exactly for the
    /// non-empty classes, the other treap valid, the counts right, at most
    /// `limit` blocks in all. Returns the count.
    pub(crate) fn verify(&self, slots: &[BlockSlot], limit: u32) -> Result<u32, &'static str> {
        if !self.map.consistent() {
            return Err("free index: the bitmap's two levels disagree");
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
        if binned as u64 + others as u64 > limit as u64 {
            return Err(FreeKey::DEFECTS[0]);
        }
        if binned + others != self.len {
            return Err("free index: its count is wrong");
        }
        if self.use_bins && self.len <= BINS_UNTIL || !self.use_bins && self.len >= BINS_FROM {
            return Err("free index: bins in use against their thresholds");
        }
        // A block both binned and in the other treap is found twice: the
        // counts above then exceed the blocks marked cached (the pool's
        // caller checks that).
        Ok(binned + others)
    }

    /// Test hook: use the bins now, for `stream`, and move its blocks there.
    #[cfg(test)]
    pub(crate) fn force_bins(&mut self, slots: &mut [BlockSlot], stream: u64) {
        assert!(self.binned == 0);
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

    /// The property test: the index and one treap over the
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
                let grow = (step / (2 * n + 50)).is_multiple_of(2);
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
                        let c = r.below(4);
                        for v in [&mut a, &mut b] {
                            v[i as usize].size = s;
                            v[i as usize].stream = t;
                            v[i as usize].counter = c as u32;
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
                    index::tie(r.below(4) as u32, r.below(1 << 30)),
                );
                for q in [
                    exact,
                    q,
                    (exact.0, exact.1, 0),
                    (exact.0, exact.1, exact.2 >> 64 << 64),
                    (exact.0, 0, 0),
                    (exact.0, u64::MAX, u128::MAX),
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
    }

    #[test]
    fn bins_from_and_until_their_thresholds() {
        let (from, until) = (BINS_FROM, BINS_UNTIL);
        let (mut ix, mut a) = filled(100, 3);
        let mut ix2 = FreeIndex::EMPTY;
        let mut b = a.clone();
        for i in 0..from - 1 {
            ix2.insert(&mut b, i);
        }
        assert!(!ix2.use_bins && ix2.binned == 0);
        ix2.insert(&mut b, from - 1);
        assert!(
            ix2.use_bins && ix2.binned == 1,
            "the block that reaches BINS_FROM is binned"
        );
        assert_eq!(ix2.verify(&b, 100), Ok(from));
        for i in 0..100 - until - 1 {
            assert!(ix.remove(&mut a, i));
            assert!(ix.use_bins, "still in bins at {} blocks", ix.len);
        }
        assert!(ix.remove(&mut a, 100 - until - 1));
        assert_eq!((ix.use_bins, ix.len), (false, until));
        assert!(ix.binned > 0, "binned blocks stay where they are");
        assert_eq!(ix.verify(&a, 100), Ok(until));
        ix.insert(&mut a, 0);
        assert_eq!(ix.verify(&a, 100), Ok(until + 1));
        // The mode against the thresholds.
        ix.use_bins = true;
        assert!(ix.remove(&mut a, 0));
        assert!(!ix.use_bins);
        ix.use_bins = true;
        assert_eq!(
            ix.verify(&a, 100),
            Err("free index: bins in use against their thresholds")
        );
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
