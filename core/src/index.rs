//! Ordered indexes over block slots, allocation-free: treaps whose links live
//! in the slots themselves, and whose priorities are a hash of the slot index
//! (expected depth O(log n), no recursion, no parent links).
//!
//! Two link sets use this code: the free index of each pool, keyed by
//! (stream, size, address) like PyTorch's `BlockPool::blocks`, and the
//! segment index, keyed by the segment's base address.

use crate::arena::{BlockSlot, NIL};

/// Which links and which key a treap uses.
pub(crate) trait Links {
    type Key: Ord + Copy;
    /// How `verify` names each defect of this index, in [`Defect`] order.
    const DEFECTS: [&'static str; 6];
    fn key(s: &BlockSlot) -> Self::Key;
    fn left(s: &BlockSlot) -> u32;
    fn right(s: &BlockSlot) -> u32;
    fn set_left(s: &mut BlockSlot, v: u32);
    fn set_right(s: &mut BlockSlot, v: u32);
}

/// The links and key of a pool's free index: (stream, size, address).
pub(crate) struct FreeKey;

/// The last part of a free-index key: the block's counter (torch's
/// `int32_t`, ordered as signed), then its address, as one number (one
/// comparison instead of two).
#[inline(always)]
pub(crate) const fn tie(counter: u32, addr: u64) -> u128 {
    (((counter ^ 0x8000_0000) as u128) << 64) | addr as u128
}

impl Links for FreeKey {
    type Key = (u64, u64, u128);
    const DEFECTS: [&'static str; 6] = [
        "free index: larger than the storage (a cycle?)",
        "free index: link out of range",
        "free index: keys out of order or duplicated",
        "free index: heap order broken",
        "free index: child on the wrong side",
        "free index: node not reachable by its key",
    ];
    #[inline]
    fn key(s: &BlockSlot) -> Self::Key {
        (s.stream, s.size, tie(s.counter, s.addr))
    }
    #[inline]
    fn left(s: &BlockSlot) -> u32 {
        s.left
    }
    #[inline]
    fn right(s: &BlockSlot) -> u32 {
        s.right
    }
    #[inline]
    fn set_left(s: &mut BlockSlot, v: u32) {
        s.left = v
    }
    #[inline]
    fn set_right(s: &mut BlockSlot, v: u32) {
        s.right = v
    }
}

/// The links and key of a pool's unmapped index (expandable segments):
/// (stream, address), like PyTorch's `BlockPool::unmapped`. An unmapped
/// block is never cached, so it borrows the free index's links.
pub(crate) struct UnmappedKey;

impl Links for UnmappedKey {
    type Key = (u64, u64);
    const DEFECTS: [&'static str; 6] = [
        "unmapped index: larger than the storage (a cycle?)",
        "unmapped index: link out of range",
        "unmapped index: keys out of order or duplicated",
        "unmapped index: heap order broken",
        "unmapped index: child on the wrong side",
        "unmapped index: node not reachable by its key",
    ];
    #[inline]
    fn key(s: &BlockSlot) -> Self::Key {
        (s.stream, s.addr)
    }
    #[inline]
    fn left(s: &BlockSlot) -> u32 {
        s.left
    }
    #[inline]
    fn right(s: &BlockSlot) -> u32 {
        s.right
    }
    #[inline]
    fn set_left(s: &mut BlockSlot, v: u32) {
        s.left = v
    }
    #[inline]
    fn set_right(s: &mut BlockSlot, v: u32) {
        s.right = v
    }
}

/// The links and key of the segment index: head blocks by base address.
pub(crate) struct SegmentKey;

impl Links for SegmentKey {
    type Key = u64;
    const DEFECTS: [&'static str; 6] = [
        "segment index: larger than the storage (a cycle?)",
        "segment index: link out of range",
        "segment index: keys out of order or duplicated",
        "segment index: heap order broken",
        "segment index: child on the wrong side",
        "segment index: node not reachable by its key",
    ];
    #[inline]
    fn key(s: &BlockSlot) -> Self::Key {
        s.addr
    }
    #[inline]
    fn left(s: &BlockSlot) -> u32 {
        s.seg_left
    }
    #[inline]
    fn right(s: &BlockSlot) -> u32 {
        s.seg_right
    }
    #[inline]
    fn set_left(s: &mut BlockSlot, v: u32) {
        s.seg_left = v
    }
    #[inline]
    fn set_right(s: &mut BlockSlot, v: u32) {
        s.seg_right = v
    }
}

/// The heap priority of a slot (a fixed mix of its index).
#[inline]
pub(crate) fn priority(i: u32) -> u32 {
    let mut x = i.wrapping_add(0x9E37_79B9);
    x = (x ^ (x >> 16)).wrapping_mul(0x85EB_CA6B);
    x = (x ^ (x >> 13)).wrapping_mul(0xC2B2_AE35);
    x ^ (x >> 16)
}

/// Where a link is written: the root, a child field of a slot, or scratch.
#[derive(Clone, Copy)]
enum Hook {
    Root,
    Left(u32),
    Right(u32),
    Scratch(usize),
}

struct Tree<'a, L: Links> {
    slots: &'a mut [BlockSlot],
    root: &'a mut u32,
    scratch: [u32; 2],
    _links: core::marker::PhantomData<L>,
}

impl<'a, L: Links> Tree<'a, L> {
    #[inline]
    fn set(&mut self, hook: Hook, v: u32) {
        match hook {
            Hook::Root => *self.root = v,
            Hook::Left(i) => L::set_left(&mut self.slots[i as usize], v),
            Hook::Right(i) => L::set_right(&mut self.slots[i as usize], v),
            Hook::Scratch(k) => self.scratch[k] = v,
        }
    }

    #[inline]
    fn key(&self, i: u32) -> L::Key {
        L::key(&self.slots[i as usize])
    }

    /// Split subtree `t` into keys `< key` (scratch 0) and `>= key` (scratch 1).
    fn split(&mut self, mut t: u32, key: L::Key) {
        let mut lhook = Hook::Scratch(0);
        let mut rhook = Hook::Scratch(1);
        while t != NIL {
            if self.key(t) < key {
                self.set(lhook, t);
                lhook = Hook::Right(t);
                t = L::right(&self.slots[t as usize]);
            } else {
                self.set(rhook, t);
                rhook = Hook::Left(t);
                t = L::left(&self.slots[t as usize]);
            }
        }
        self.set(lhook, NIL);
        self.set(rhook, NIL);
    }

    /// Join `a` (all keys smaller) and `b`; returns the new subtree root.
    fn merge(&mut self, mut a: u32, mut b: u32) -> u32 {
        self.scratch[0] = NIL;
        let mut hook = Hook::Scratch(0);
        while a != NIL && b != NIL {
            if priority(a) > priority(b) {
                self.set(hook, a);
                hook = Hook::Right(a);
                a = L::right(&self.slots[a as usize]);
            } else {
                self.set(hook, b);
                hook = Hook::Left(b);
                b = L::left(&self.slots[b as usize]);
            }
        }
        self.set(hook, if a != NIL { a } else { b });
        self.scratch[0]
    }
}

fn tree<'a, L: Links>(slots: &'a mut [BlockSlot], root: &'a mut u32) -> Tree<'a, L> {
    Tree {
        slots,
        root,
        scratch: [NIL; 2],
        _links: core::marker::PhantomData,
    }
}

/// Insert slot `n` (its key must not be in the tree).
pub(crate) fn insert<L: Links>(slots: &mut [BlockSlot], root: &mut u32, n: u32) {
    let mut t = tree::<L>(slots, root);
    let key = t.key(n);
    let pn = priority(n);
    let mut hook = Hook::Root;
    let mut cur = *t.root;
    while cur != NIL && priority(cur) > pn {
        let s = &t.slots[cur as usize];
        if key < L::key(s) {
            hook = Hook::Left(cur);
            cur = L::left(s);
        } else {
            hook = Hook::Right(cur);
            cur = L::right(s);
        }
    }
    t.split(cur, key);
    let (l, r) = (t.scratch[0], t.scratch[1]);
    L::set_left(&mut t.slots[n as usize], l);
    L::set_right(&mut t.slots[n as usize], r);
    t.set(hook, n);
}

/// Remove slot `n`; `false` if it is not in the tree.
pub(crate) fn remove<L: Links>(slots: &mut [BlockSlot], root: &mut u32, n: u32) -> bool {
    let mut t = tree::<L>(slots, root);
    let key = t.key(n);
    let mut hook = Hook::Root;
    let mut cur = *t.root;
    while cur != n {
        if cur == NIL {
            return false;
        }
        let s = &t.slots[cur as usize];
        if key < L::key(s) {
            hook = Hook::Left(cur);
            cur = L::left(s);
        } else {
            hook = Hook::Right(cur);
            cur = L::right(s);
        }
    }
    let (l, r) = (
        L::left(&t.slots[n as usize]),
        L::right(&t.slots[n as usize]),
    );
    let m = t.merge(l, r);
    t.set(hook, m);
    L::set_left(&mut t.slots[n as usize], NIL);
    L::set_right(&mut t.slots[n as usize], NIL);
    true
}

/// The slot with the smallest key `>= key`, or `NIL`.
#[inline]
pub(crate) fn lower_bound<L: Links>(slots: &[BlockSlot], root: u32, key: L::Key) -> u32 {
    let mut best = NIL;
    let mut t = root;
    while t != NIL {
        let s = &slots[t as usize];
        if L::key(s) >= key {
            best = t;
            t = L::left(s);
        } else {
            t = L::right(s);
        }
    }
    best
}

/// The slot with the smallest key `> key`, or `NIL`.
pub(crate) fn successor<L: Links>(slots: &[BlockSlot], root: u32, key: L::Key) -> u32 {
    let mut best = NIL;
    let mut t = root;
    while t != NIL {
        let s = &slots[t as usize];
        if L::key(s) > key {
            best = t;
            t = L::left(s);
        } else {
            t = L::right(s);
        }
    }
    best
}

/// The slot with the largest key `< key`, or `NIL`.
pub(crate) fn predecessor<L: Links>(slots: &[BlockSlot], root: u32, key: L::Key) -> u32 {
    let mut best = NIL;
    let mut t = root;
    while t != NIL {
        let s = &slots[t as usize];
        if L::key(s) < key {
            best = t;
            t = L::right(s);
        } else {
            t = L::left(s);
        }
    }
    best
}

/// The slot with the largest key `<= key`, or `NIL`.
pub(crate) fn floor<L: Links>(slots: &[BlockSlot], root: u32, key: L::Key) -> u32 {
    let mut best = NIL;
    let mut t = root;
    while t != NIL {
        let s = &slots[t as usize];
        if L::key(s) <= key {
            best = t;
            t = L::right(s);
        } else {
            t = L::left(s);
        }
    }
    best
}

/// The smallest slot of the tree, or `NIL`.
pub(crate) fn first<L: Links>(slots: &[BlockSlot], root: u32) -> u32 {
    let mut t = root;
    if t == NIL {
        return NIL;
    }
    loop {
        let l = L::left(&slots[t as usize]);
        if l == NIL {
            return t;
        }
        t = l;
    }
}

/// The largest slot of the tree, or `NIL`.
pub(crate) fn last<L: Links>(slots: &[BlockSlot], root: u32) -> u32 {
    let mut t = root;
    if t == NIL {
        return NIL;
    }
    loop {
        let r = L::right(&slots[t as usize]);
        if r == NIL {
            return t;
        }
        t = r;
    }
}

/// What `verify` can find wrong with a tree (indexes [`Links::DEFECTS`]).
#[derive(Clone, Copy)]
enum Defect {
    Cycle,
    LinkOutOfRange,
    OutOfOrder,
    HeapOrder,
    WrongSide,
    Unreachable,
}

/// A search that gives up after `limit` steps (a cycle) or at a link out
/// of range: `lower_bound` (`strict` false) or `successor` (`strict` true),
/// or the first node when `key` is `None`.
fn bounded_search<L: Links>(
    slots: &[BlockSlot],
    root: u32,
    key: Option<L::Key>,
    strict: bool,
    limit: u32,
) -> Result<u32, &'static str> {
    let mut best = NIL;
    let mut t = root;
    let mut steps = 0u32;
    while t != NIL {
        steps += 1;
        if steps > limit {
            return Err(L::DEFECTS[Defect::Cycle as usize]);
        }
        let s = slots
            .get(t as usize)
            .ok_or(L::DEFECTS[Defect::LinkOutOfRange as usize])?;
        let go_left = match key {
            None => true,
            Some(k) if strict => L::key(s) > k,
            Some(k) => L::key(s) >= k,
        };
        if go_left {
            best = t;
            t = L::left(s);
        } else {
            t = L::right(s);
        }
    }
    Ok(best)
}

/// Check a tree without recursion or allocation, walking it in key order by
/// successor searches from the root: keys strictly increasing, each child on
/// the right side of its parent with no higher priority, every node reachable
/// by a search for its own key, and no more than `limit` nodes (a cycle). A
/// cyclic or out-of-range link is reported, never followed forever.
/// Returns the node count, or the index's name for the defect.
pub(crate) fn verify<L: Links>(
    slots: &[BlockSlot],
    root: u32,
    limit: u32,
) -> Result<u32, &'static str> {
    let mut count = 0u32;
    let mut cur = bounded_search::<L>(slots, root, None, false, limit)?;
    let mut last: Option<L::Key> = None;
    while cur != NIL {
        count += 1;
        if count > limit {
            return Err(L::DEFECTS[Defect::Cycle as usize]);
        }
        let s = slots
            .get(cur as usize)
            .ok_or(L::DEFECTS[Defect::LinkOutOfRange as usize])?;
        let k = L::key(s);
        if let Some(prev) = last {
            if prev >= k {
                return Err(L::DEFECTS[Defect::OutOfOrder as usize]);
            }
        }
        for c in [L::left(s), L::right(s)] {
            if c != NIL {
                let cs = slots
                    .get(c as usize)
                    .ok_or(L::DEFECTS[Defect::LinkOutOfRange as usize])?;
                if priority(c) > priority(cur) {
                    return Err(L::DEFECTS[Defect::HeapOrder as usize]);
                }
                let ck = L::key(cs);
                if (c == L::left(s) && ck >= k) || (c == L::right(s) && ck <= k) {
                    return Err(L::DEFECTS[Defect::WrongSide as usize]);
                }
            }
        }
        // Every node must be reachable by a search for its own key.
        if bounded_search::<L>(slots, root, Some(k), false, limit)? != cur {
            return Err(L::DEFECTS[Defect::Unreachable as usize]);
        }
        last = Some(k);
        cur = bounded_search::<L>(slots, root, Some(k), true, limit)?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::vec::Vec;

    fn slot(addr: u64, size: u64, stream: u64) -> BlockSlot {
        BlockSlot {
            addr,
            size,
            stream,
            // Numbers out of address order, as torch 2.13's are.
            counter: ((addr / 4096 * 31) % 5) as u32,
            ..BlockSlot::VACANT
        }
    }

    #[test]
    fn treap_matches_btreeset() {
        let mut slots: Vec<BlockSlot> = (0..500u64)
            .map(|i| slot(i * 4096, (i * 7919) % 97 * 512 + 512, i % 3))
            .collect();
        let mut root = NIL;
        let mut model = BTreeSet::new();
        let mut x = 12345u64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % 500) as u32;
            let k = FreeKey::key(&slots[i as usize]);
            if model.contains(&k) {
                assert!(remove::<FreeKey>(&mut slots, &mut root, i));
                model.remove(&k);
            } else {
                insert::<FreeKey>(&mut slots, &mut root, i);
                model.insert(k);
            }
            let q = (x % 3, (x >> 8) % 60000, tie(((x >> 40) % 3) as u32, 0));
            let lb = lower_bound::<FreeKey>(&slots, root, q);
            let want = model.range(q..).next().copied();
            assert_eq!(want, (lb != NIL).then(|| FreeKey::key(&slots[lb as usize])));
            let pr = predecessor::<FreeKey>(&slots, root, q);
            let want = model.range(..q).next_back().copied();
            assert_eq!(want, (pr != NIL).then(|| FreeKey::key(&slots[pr as usize])));
        }
        assert_eq!(
            verify::<FreeKey>(&slots, root, 1000),
            Ok(model.len() as u32)
        );
    }
}
