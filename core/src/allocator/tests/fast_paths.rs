//! Each branch of the in-place split (`split.rs`) and the in-place merge
//! (`free.rs`). Which path ran shows in the slots: the fast split leaves the
//! cached block's slot to the remainder and gives the allocation a new slot;
//! the general split keeps the allocation in the found block's slot. The fast
//! merge keeps the cached upper neighbour's slot; the general merge keeps the
//! freed block's.

use super::tiny;
use crate::arena::Flags;

const MIB: u64 = 1 << 20;

#[test]
fn split_in_place_when_a_cached_non_head_block_leaves_enough() {
    let mut t = tiny();
    let a = t.malloc(512, 0).unwrap();
    let tail = t.slot(a.handle.unwrap().index()).next;
    assert!(t.can_split_in_place(tail, 512));
    let b = t.malloc(512, 0).unwrap();
    let bi = b.handle.unwrap().index();
    assert_ne!(bi, tail, "the allocation takes a new slot");
    let r = t.slot(tail);
    assert!(r.has(Flags::CACHED));
    assert_eq!((r.addr, r.size), (b.ptr.0 + 512, (2 * MIB) - 1024));
    assert!(t
        .pools
        .get(crate::pool::Pool::Small)
        .contains(t.arena.slots(), tail));
    t.check_invariants().unwrap();
}

#[test]
fn no_split_in_place_for_a_segment_head() {
    let mut t = tiny();
    let a = t.malloc(512, 0).unwrap();
    t.free(a.handle.unwrap()).unwrap(); // the whole segment is cached: its head
    let head = a.handle.unwrap().index();
    assert!(!t.can_split_in_place(head, 512));
    let b = t.malloc(512, 0).unwrap();
    assert_eq!(
        b.handle.unwrap().index(),
        head,
        "general split: the head keeps the allocation"
    );
    t.check_invariants().unwrap();
}

#[test]
fn no_split_in_place_when_the_remainder_is_smaller_than_the_request() {
    let mut t = tiny();
    let a = t.malloc(MIB - 1536, 0).unwrap();
    // The cached tail is 1 MiB + 1536; a 1 MiB request leaves 1536 < 1 MiB.
    let tail = t.slot(a.handle.unwrap().index()).next;
    assert_eq!(t.slot(tail).size, MIB + 1536);
    assert!(!t.can_split_in_place(tail, MIB));
    let b = t.malloc(MIB, 0).unwrap();
    assert_eq!(
        b.handle.unwrap().index(),
        tail,
        "general split keeps the found slot"
    );
    assert_eq!(t.slot(t.slot(tail).next).size, 1536);
    t.check_invariants().unwrap();
}

#[test]
fn no_split_in_place_when_the_remainder_leaves_its_class() {
    let mut t = tiny();
    let a = t.malloc(512, 0).unwrap();
    let tail = t.slot(a.handle.unwrap().index()).next;
    assert!(t.can_split_in_place(tail, 512 << 10), "one tree: any size");
    // With size classes (a large index), 2 MiB - 512 cached less 512 KiB
    // leaves 1.5 MiB - 512, a lower class: no split in place.
    let slots = t.arena.slots_mut();
    t.pools
        .get_mut(crate::pool::Pool::Small)
        .force_bins(slots, 0);
    assert!(!t.can_split_in_place(tail, 512 << 10));
    let b = t.malloc(512 << 10, 0).unwrap();
    assert_eq!(
        b.handle.unwrap().index(),
        tail,
        "general split keeps the found slot"
    );
    t.check_invariants().unwrap();
}

#[test]
fn no_split_when_the_block_fits() {
    let mut t = tiny();
    let a = t.malloc(MIB, 0).unwrap();
    let tail = t.slot(a.handle.unwrap().index()).next;
    let b = t.malloc(MIB, 0).unwrap(); // takes the tail whole
    assert_eq!(b.handle.unwrap().index(), tail);
    assert_eq!(t.slot(tail).next, crate::arena::NIL);
    t.check_invariants().unwrap();
}

/// A 20 MiB segment [A 2.5 MiB | B 1.25 MiB | T 16.25 MiB cached]; with
/// `rival`, a cached 17 MiB block U elsewhere (same stream and pool) that
/// lies between T's key and T's key grown by B (17.5 MiB, the same size
/// class of the free index as 16.25 MiB).
fn merge_setup(rival: bool) -> (super::Tiny, u32, u32) {
    merge_setup_sized(rival, 5 * MIB / 2, 5 * MIB / 4)
}

fn merge_setup_sized(rival: bool, a: u64, b: u64) -> (super::Tiny, u32, u32) {
    let mut t = tiny();
    let mut keep = None;
    if rival {
        let c = t.malloc(3 * MIB, 0).unwrap();
        let u = t.malloc(17 * MIB, 0).unwrap(); // the rest of c's segment, exactly
        keep = Some((c, u));
    }
    let _a = t.malloc(a, 0).unwrap();
    let b = t.malloc(b, 0).unwrap();
    let bi = b.handle.unwrap().index();
    let ti = t.slot(bi).next;
    assert_eq!(t.slot(ti).size, 20 * MIB - a - t.slot(bi).size);
    if let Some((_, u)) = keep {
        t.free(u.handle.unwrap()).unwrap(); // U: cached, 17 MiB
    }
    t.check_invariants().unwrap();
    (t, bi, ti)
}

#[test]
fn merge_in_place_when_the_grown_key_keeps_its_order() {
    let (mut t, bi, ti) = merge_setup(false);
    let (baddr, bid) = (t.slot(bi).addr, t.info_of(bi).handle);
    t.free(bid).unwrap();
    assert!(
        !t.slot(bi).has(Flags::IN_USE),
        "the freed block's slot is released"
    );
    let s = t.slot(ti);
    assert_eq!(
        (s.addr, s.size),
        (baddr, 35 * MIB / 2),
        "T absorbed B in place"
    );
    t.check_invariants().unwrap();
}

#[test]
fn merge_falls_back_when_the_grown_size_leaves_its_class() {
    // T is 16 MiB and grows to 18 MiB: another class of the free index
    // (when it uses classes, as a large index does).
    let (mut t, bi, ti) = merge_setup_sized(false, 2 * MIB, 2 * MIB);
    let slots = t.arena.slots_mut();
    t.pools
        .get_mut(crate::pool::Pool::Large)
        .force_bins(slots, 0);
    let (baddr, bid) = (t.slot(bi).addr, t.info_of(bi).handle);
    t.free(bid).unwrap();
    assert!(!t.slot(ti).has(Flags::IN_USE), "T's slot is released");
    let s = t.slot(bi);
    assert_eq!((s.addr, s.size), (baddr, 18 * MIB), "B absorbed T");
    t.check_invariants().unwrap();
}

#[test]
fn merge_falls_back_when_the_order_check_refuses() {
    let (mut t, bi, ti) = merge_setup(true);
    let (baddr, bid) = (t.slot(bi).addr, t.info_of(bi).handle);
    t.free(bid).unwrap();
    assert!(!t.slot(ti).has(Flags::IN_USE), "T's slot is released");
    let s = t.slot(bi);
    assert_eq!((s.addr, s.size), (baddr, 35 * MIB / 2), "B absorbed T");
    assert!(s.has(Flags::CACHED));
    t.check_invariants().unwrap();
}

#[test]
fn merge_falls_back_when_the_lower_neighbour_is_cached() {
    let (mut t, bi, _) = merge_setup(false);
    let ai = t.slot(bi).prev;
    t.free(t.info_of(ai).handle).unwrap(); // A: the segment head, cached alone
    t.free(t.info_of(bi).handle).unwrap(); // B merges with both neighbours
    assert_eq!(t.slot(ai).size, 20 * MIB, "the head absorbed everything");
    assert_eq!(t.arena.in_use(), 1);
    t.check_invariants().unwrap();
}
