//! The checker's compact-policy invariants, each shown failing: a state
//! with one compact segment holding blocks of two streams (x allocated on
//! stream 1, y cached on stream 2 right after it, the unmapped rest of no
//! stream); one thing corrupted per test.

use super::{assert_named, broken, tiny, Tiny};
use crate::allocator::compact::ANY_STREAM;
use crate::arena::{Flags, NIL};
use crate::config::Config;
use crate::pool::Pool;

const MIB: u64 = 1 << 20;

/// Returns the slots of x, y and the unmapped tail.
fn with_compact() -> (Tiny, u32, u32, u32) {
    let mut t = tiny();
    t.set_config(Config::parse("policy:compact").unwrap());
    let x = t.malloc(8 * MIB, 1).unwrap().handle.unwrap();
    let y = t.malloc(8 * MIB, 2).unwrap().handle.unwrap();
    t.free(y).unwrap();
    let x = x.index();
    let y = t.slot(x).next;
    let tail = t.slot(y).next;
    assert!(t.slot(y).has(Flags::CACHED) && t.slot(tail).has(Flags::UNMAPPED));
    assert_eq!((t.slot(x).stream, t.slot(y).stream), (1, 2));
    assert_eq!(t.slot(tail).stream, ANY_STREAM);
    assert_eq!(t.compact.get(0, Pool::Large), x);
    t.check_invariants()
        .expect("the untouched state is consistent");
    (t, x, y, tail)
}

#[test]
fn the_table_names_a_block_that_is_not_a_head() {
    let (mut t, _, y, _) = with_compact();
    t.compact.set(0, Pool::Large, y);
    assert_named(broken(&t), "not such a segment's head");
}

#[test]
fn the_table_names_a_head_of_the_other_pool_kind() {
    let (mut t, x, _, _) = with_compact();
    t.compact.set(0, Pool::Small, x);
    assert_named(broken(&t), "not such a segment's head");
}

#[test]
fn a_forgotten_compact_segment_mixes_streams() {
    // Blocks of several streams are allowed in a compact segment only.
    let (mut t, _, _, _) = with_compact();
    t.compact.set(0, Pool::Large, NIL);
    assert_named(broken(&t), "stream != its segment's stream");
}

#[test]
fn an_unmapped_block_of_a_stream() {
    let (mut t, _, _, tail) = with_compact();
    t.pools
        .get_mut(Pool::Large)
        .remove_unmapped(t.arena.slots_mut(), tail);
    t.slot_mut(tail).stream = 2;
    t.pools
        .get_mut(Pool::Large)
        .insert_unmapped(t.arena.slots_mut(), tail);
    assert_named(broken(&t), "an unmapped block of a stream");
}

#[test]
fn a_mapped_block_of_no_stream() {
    let (mut t, x, _, _) = with_compact();
    t.slot_mut(x).stream = ANY_STREAM;
    assert_named(broken(&t), "a mapped block of no stream");
}

#[test]
fn two_adjacent_cached_blocks_of_one_stream() {
    // Cached neighbours of different streams are fine; of one, a missed merge.
    let mut t = tiny();
    t.set_config(Config::parse("policy:compact").unwrap());
    let x = t.malloc(8 * MIB, 1).unwrap().handle.unwrap();
    let y = t.malloc(8 * MIB, 2).unwrap().handle.unwrap();
    t.free(x).unwrap();
    t.free(y).unwrap();
    t.check_invariants()
        .expect("cached neighbours of two streams are consistent");
    let y = t.slot(x.index()).next;
    t.cache_remove(y);
    t.slot_mut(y).stream = 1;
    t.cache_insert(y);
    assert_named(broken(&t), "missed merge");
}
