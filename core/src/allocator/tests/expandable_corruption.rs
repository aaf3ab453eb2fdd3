//! The checker's expandable-segment invariants, each shown failing: a
//! state with one expandable segment (an allocated page, a cached page, the
//! unmapped rest); one thing corrupted per test.

use super::{assert_named, broken, tiny, Tiny};
use crate::arena::Flags;
use crate::config::Config;
use crate::pool::Pool;

/// [x: page 0, allocated | y: page 1, cached | unmapped tail]. Returns the
/// slots of x, y and the tail.
fn with_expandable() -> (Tiny, u32, u32, u32) {
    let mut t = tiny();
    t.set_config(Config::parse("expandable_segments:True").unwrap());
    let x = t.malloc(20 << 20, 0).unwrap().handle.unwrap();
    let y = t.malloc(20 << 20, 0).unwrap().handle.unwrap();
    t.free(y).unwrap();
    let x = x.index();
    let y = t.slot(x).next;
    let tail = t.slot(y).next;
    assert!(t.slot(y).has(Flags::CACHED) && t.slot(tail).has(Flags::UNMAPPED));
    assert_eq!(t.stats.reserved_bytes.all().current, 40 << 20);
    t.check_invariants()
        .expect("the untouched state is consistent");
    (t, x, y, tail)
}

#[test]
fn an_unmapped_block_that_is_also_cached() {
    let (mut t, _, _, tail) = with_expandable();
    t.slot_mut(tail).flags.insert(Flags::CACHED);
    assert_named(broken(&t), "unmapped block is cached");
}

#[test]
fn two_adjacent_unmapped_blocks() {
    let (mut t, _, y, _) = with_expandable();
    t.cache_remove(y);
    t.slot_mut(y).flags.insert(Flags::UNMAPPED);
    t.pools
        .get_mut(Pool::Large)
        .insert_unmapped(t.arena.slots_mut(), y);
    assert_named(broken(&t), "two adjacent unmapped");
}

#[test]
fn an_unmapped_block_that_is_not_whole_pages() {
    let (mut t, _, y, tail) = with_expandable();
    t.pools
        .get_mut(Pool::Large)
        .remove_unmapped(t.arena.slots_mut(), tail);
    t.slot_mut(y).size += 1 << 20;
    let s = t.slot_mut(tail);
    s.addr += 1 << 20;
    s.size -= 1 << 20;
    t.pools
        .get_mut(Pool::Large)
        .insert_unmapped(t.arena.slots_mut(), tail);
    assert_named(broken(&t), "not whole pages");
}

#[test]
fn an_unmapped_block_missing_from_its_index() {
    let (mut t, _, _, tail) = with_expandable();
    t.pools
        .get_mut(Pool::Large)
        .remove_unmapped(t.arena.slots_mut(), tail);
    assert_named(broken(&t), "unmapped index");
}

#[test]
fn a_block_that_forgot_its_segment_is_expandable() {
    let (mut t, x, _, _) = with_expandable();
    t.slot_mut(x).flags.remove(Flags::EXPANDABLE);
    assert_named(broken(&t), "expandable flag");
}

#[test]
fn an_expandable_segment_counted_as_a_segment() {
    let (mut t, _, _, _) = with_expandable();
    t.stats.segment.increase(Pool::Large, 1);
    assert_named(broken(&t), "segment");
}

#[test]
fn reserved_bytes_that_are_not_the_mapped_bytes() {
    let (mut t, _, _, _) = with_expandable();
    t.stats.reserved_bytes.increase(Pool::Large, 20 << 20);
    t.total_allocated_memory += 20 << 20;
    assert_named(broken(&t), "reserved_bytes");
}
