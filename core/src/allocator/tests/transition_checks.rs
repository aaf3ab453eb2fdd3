//! The debug-build checks of the block transitions (`transitions.rs`) are
//! trusted only once seen firing: each test corrupts one block or counter
//! the way a buggy transition would, runs the next operation, and expects
//! the check's panic (unit tests build with debug assertions).

use super::tiny;
use crate::arena::Flags;
use crate::pool::Pool;

/// A block marked cached while allocated: its free is refused by the
/// free request's entry check.
#[test]
#[should_panic(expected = "free_slot: block")]
fn freeing_a_block_a_transition_left_cached() {
    let mut t = tiny();
    let x = t.malloc(4096, 0).unwrap();
    let i = x.handle.unwrap().index();
    t.slot_mut(i).flags.insert(Flags::CACHED);
    let _ = t.free(x.handle.unwrap());
}

/// A neighbour link broken by a split or merge: caching the block next to
/// it is refused.
#[test]
#[should_panic(expected = "cache_insert: block")]
fn caching_a_block_whose_neighbour_link_is_broken() {
    let mut t = tiny();
    let x = t.malloc(4096, 0).unwrap();
    let y = t.malloc(4096, 0).unwrap();
    // y's `prev` should be x: point it elsewhere, then free x (the head of
    // its segment, with y allocated after it: no merge, x is cached).
    let (xi, yi) = (x.handle.unwrap().index(), y.handle.unwrap().index());
    assert_eq!(t.slot(yi).prev, xi);
    t.slot_mut(yi).prev = yi;
    let _ = t.free(x.handle.unwrap());
}

/// A counter a transition forgot: the reserve's count and the bytes the
/// device holds disagree at the next segment allocation.
#[test]
#[should_panic(expected = "reserved_bytes differs")]
fn a_reserve_counter_a_transition_forgot() {
    let mut t = tiny();
    let _x = t.malloc(4096, 0).unwrap();
    t.stats.reserved_bytes.increase(Pool::Small, 512);
    let _ = t.malloc(8 << 20, 0);
}

/// The active counts going below the allocated ones: the free that makes
/// a block inactive says so.
#[test]
#[should_panic(expected = "leave_active")]
fn active_bytes_a_transition_forgot() {
    let mut t = tiny();
    let x = t.malloc(4096, 0).unwrap();
    let _y = t.malloc(4096, 0).unwrap();
    t.stats.active_bytes.decrease(Pool::Small, 4096);
    let _ = t.free(x.handle.unwrap());
}
