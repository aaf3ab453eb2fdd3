//! The checker's private-pool invariants, each shown failing: a state with
//! a private pool (a segment, a cached block), a routing, a capture and a
//! parked free; one thing corrupted per test.

use super::{assert_named, broken, tiny, Tiny};
use crate::arena::Flags;
use crate::private_pool::{MempoolId, StreamFilter};

const G: MempoolId = MempoolId(1, 0);
const M: MempoolId = MempoolId(0, 1);

/// Pool G (captured on stream 1): [a | cached tail]; a default block p
/// freed during the capture with a use on stream 2: parked. Pool M routed
/// on stream 3 with nothing in it. Returns the slots of a and p.
fn with_pools() -> (Tiny, u32, u32) {
    let mut t = tiny();
    let p = t.malloc(4096, 0).unwrap().handle.unwrap();
    t.record_stream(p, 2).unwrap();
    t.capture_begin(G, StreamFilter::stream(1)).unwrap();
    t.begin_allocate_to_pool(M, StreamFilter::stream(3))
        .unwrap();
    let a = t.malloc(4096, 1).unwrap().handle.unwrap().index();
    t.free(p).unwrap();
    assert_eq!(t.deferred_frees(), 1);
    t.check_invariants()
        .expect("the untouched state is consistent");
    (t, a, p.index())
}

#[test]
fn a_block_of_another_pool_than_its_segment() {
    let (mut t, a, _) = with_pools();
    t.slot_mut(a).owner = 0;
    assert_named(broken(&t), "owner pool");
}

#[test]
fn a_pool_segment_count() {
    let (mut t, _, _) = with_pools();
    t.private.get_mut(1).unwrap().segments += 1;
    assert_named(broken(&t), "segment count");
}

#[test]
fn a_pool_reserved_bytes() {
    let (mut t, _, _) = with_pools();
    t.private.get_mut(1).unwrap().reserved += 512;
    assert_named(broken(&t), "reserved bytes");
}

#[test]
fn a_cached_block_in_another_pools_index() {
    let (mut t, a, _) = with_pools();
    // Move the pool's cached tail into the default small index.
    let tail = t.slot(a).next;
    t.cache_remove(tail);
    t.slot_mut(tail).owner = 0;
    t.cache_insert(tail);
    t.slot_mut(tail).owner = 1;
    assert_named(broken(&t), "free index");
}

#[test]
fn a_routing_to_a_pool_that_does_not_exist() {
    let (mut t, _, _) = with_pools();
    t.routes[1].owner = 9;
    assert_named(broken(&t), "routing");
}

#[test]
fn the_capture_count() {
    let (mut t, _, _) = with_pools();
    t.captures += 1;
    assert_named(broken(&t), "captures");
}

#[test]
fn the_deferred_list() {
    let (mut t, _, p) = with_pools();
    t.deferred.len += 1;
    assert_named(broken(&t), "deferred list");
    let (mut t, _, _) = with_pools();
    t.slot_mut(p).flags.remove(Flags::DEFERRED);
    assert!(broken(&t).what.contains("block state") || broken(&t).what.contains("deferred"));
    // A free marker the count does not know of.
    let (mut t, _, p) = with_pools();
    t.slot_mut(p).right = 7;
    assert_named(broken(&t), "free marker");
}

#[test]
fn settling_after_the_capture_returns_the_block() {
    let (mut t, _, _) = with_pools();
    t.capture_end(G).unwrap();
    let before = t.stats().active.all().current;
    // The next malloc processes events: the parked free is settled (an
    // event on stream 2, recorded before the capture), and the tiny
    // device's events complete at once, so the block returns.
    let _ = t.malloc(512, 0).unwrap();
    assert_eq!(t.deferred_frees(), 0);
    assert_eq!(t.pending_events(), 0);
    assert_eq!(t.stats().active.all().current, before);
    t.check_invariants().unwrap();
}

/// torch 2.13's `reserved_bytes_by_private_pools`: a deleted pool keeps its
/// figures with current 0; a pool made again under its id reports its own.
#[test]
fn reserved_bytes_of_deleted_pools() {
    let mut t = tiny();
    t.create_pool(M, crate::PoolOptions::NONE).unwrap();
    t.begin_allocate_to_pool(M, StreamFilter::stream(3))
        .unwrap();
    let a = t.malloc(4096, 3).unwrap().handle.unwrap();
    t.end_allocate_to_pool(M).unwrap();
    t.free(a).unwrap();
    t.release_pool(M).unwrap();
    t.release_pool(M).unwrap();
    t.empty_cache().unwrap();
    let seen = |t: &Tiny| {
        let mut v = std::vec::Vec::new();
        t.reserved_bytes_by_private_pools(|id, s| v.push((id, s.all().current, s.all().allocated)));
        v
    };
    assert_eq!(seen(&t), [(M, 0, 2 << 20)]);
    t.create_pool(M, crate::PoolOptions::NONE).unwrap();
    assert_eq!(seen(&t), [(M, 0, 0)]);
}

/// `graph_capture_record_stream_reuse:True` on a backend that cannot read
/// capture graphs: the capture is refused, saying what is missing, and
/// nothing changed.
#[test]
fn reuse_in_a_capture_needs_a_backend_that_reads_the_graph() {
    let mut t = tiny();
    t.set_config(crate::config::Config::parse("graph_capture_record_stream_reuse:True").unwrap());
    let e = t.capture_begin(G, StreamFilter::stream(1)).unwrap_err();
    assert!(
        std::format!("{e}").contains("graph_capture_record_stream_reuse:True"),
        "{e}"
    );
    assert!(t.pools().next().is_none());
    t.check_invariants().unwrap();
}

#[test]
fn an_expandable_segment_in_a_pool_with_a_source() {
    // An expandable segment in a plain pool, whose pool is then given a
    // segment source: such a pool never maps pages.
    let mut t = tiny();
    t.set_config(crate::config::Config::parse("expandable_segments:True").unwrap());
    t.begin_allocate_to_pool(M, StreamFilter::All).unwrap();
    t.malloc(4096, 0).unwrap();
    t.end_allocate_to_pool(M).unwrap();
    t.check_invariants()
        .expect("the untouched state is consistent");
    t.private.get_mut(1).unwrap().source = Some(super::source_pools::counting_source());
    assert_named(broken(&t), "segment source");
}
