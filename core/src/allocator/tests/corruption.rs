//! The checker is trusted only once it is seen failing: each test builds a
//! state with every kind of block (allocated, cached, pending, a split small
//! segment and a split large one, a freed slot), corrupts exactly one thing,
//! and asserts that `check_invariants` names that invariant.

use super::{assert_named, broken, tiny, Tiny};
use crate::arena::Flags;
use crate::pool::Pool;
use crate::stats::{DeviceStats, StatArray};

/// Slots of the blocks of [`rich`].
struct Blocks {
    /// Allocated, head of the small segment.
    a: u32,
    /// Cached, between two allocated blocks.
    b: u32,
    /// Allocated.
    c: u32,
    /// Pending (freed with a use on stream 1).
    d: u32,
    /// Allocated, head of the large segment.
    x: u32,
}

/// Small segment: [a | b cached | c | d pending | tail cached], large
/// segment: [x | tail cached]; one freed slot (e merged into the tail).
fn rich() -> (Tiny, Blocks) {
    let mut t = tiny();
    let slot = |r: Result<crate::Allocation, _>| r.ok().and_then(|x| x.handle).map(|id| id.index());
    let a = slot(t.malloc(512, 0)).unwrap();
    let b = t.malloc(1024, 0).unwrap().handle.unwrap();
    let c = slot(t.malloc(2048, 0)).unwrap();
    let d = t.malloc(4096, 0).unwrap().handle.unwrap();
    let e = t.malloc(512, 0).unwrap().handle.unwrap();
    let x = slot(t.malloc(3 << 20, 0)).unwrap();
    t.free(b).unwrap();
    t.record_stream(d, 1).unwrap();
    t.free(d).unwrap(); // pending: no malloc runs process_events after this
    t.free(e).unwrap(); // merges into the tail in place: a slot is freed
    assert_eq!(t.slot(d.index()).events, 1);
    assert_eq!(t.arena.in_use() + 1, t.arena.high_water());
    t.check_invariants()
        .expect("the untouched state is consistent");
    let blocks = Blocks {
        a,
        b: b.index(),
        c,
        d: d.index(),
        x,
    };
    (t, blocks)
}

#[test]
fn tiling() {
    let (mut t, k) = rich();
    t.slot_mut(k.c).size += 512; // c now runs into d
    assert_named(broken(&t), "tile the segment");
}

#[test]
fn overlap() {
    let (mut t, k) = rich();
    // Grow the small segment (head and cached tail together, so it still
    // tiles) over the large segment that follows it.
    // The tail is re-indexed: its larger size is another size class.
    let tail = t.slot(k.d).next;
    t.slot_mut(k.a).seg_size += 2 << 20;
    t.cache_remove(tail);
    t.slot_mut(tail).size += 2 << 20;
    t.cache_insert(tail);
    assert_named(broken(&t), "segments overlap");
}

#[test]
fn adjacent_cached_blocks() {
    let (mut t, k) = rich();
    // a becomes cached, properly indexed, but not merged with b.
    t.live.remove(t.arena.slots_mut(), k.a);
    t.slot_mut(k.a).flags.remove(Flags::ALLOCATED);
    t.cache_insert(k.a);
    assert_named(broken(&t), "adjacent cached blocks");
}

#[test]
fn block_state() {
    let (mut t, k) = rich();
    t.slot_mut(k.c).flags.insert(Flags::CACHED); // allocated and cached
    assert_named(broken(&t), "block state");
}

#[test]
fn block_numbers() {
    // torch 2.13 on (the default): every piece carries its segment's number.
    let (mut t, k) = rich();
    t.slot_mut(k.c).counter += 1;
    assert_named(broken(&t), "block number");
    // torch 2.11: no number at all.
    let (mut t, k) = rich();
    t.config = t.config.with_torch_version(crate::TorchVersion::V2_11);
    for i in [k.a, k.b, k.c, k.d, k.x] {
        t.slot_mut(i).counter = 0;
    }
    let tail = t.slot(k.d).next;
    t.slot_mut(tail).counter = 0;
    let tail = t.slot(k.x).next;
    t.slot_mut(tail).counter = 0;
    t.check_invariants().expect("no numbers under 2.11");
    t.slot_mut(k.b).counter = 3;
    assert_named(broken(&t), "block number");
}

#[test]
fn free_index() {
    let (mut t, k) = rich();
    t.pools
        .get_mut(Pool::Small)
        .remove(t.arena.slots_mut(), k.b); // cached, not indexed
    assert_named(broken(&t), "free index");

    let (mut t, k) = rich();
    let tail = t.slot(k.d).next;
    t.slot_mut(tail).size = 512; // now below b: its place in the tree is wrong
    assert_named(broken(&t), "free index");
}

#[test]
fn segment_index() {
    let (mut t, k) = rich();
    // Swap the order of the two heads' keys without moving them in the tree.
    let (lo, hi) = (t.slot(k.a).addr, t.slot(k.x).addr);
    t.slot_mut(k.a).addr = hi;
    t.slot_mut(k.x).addr = lo;
    assert_named(broken(&t), "segment index");
}

#[test]
fn live_index() {
    let (mut t, k) = rich();
    t.live.remove(t.arena.slots_mut(), k.c); // allocated, not findable by pointer
    assert_named(broken(&t), "live-pointer index");

    let (mut t, k) = rich();
    t.slot_mut(k.c).set_hash_next(k.c); // a chain that never ends
    assert_named(broken(&t), "live-pointer index");
}

#[test]
fn event_counts() {
    let (mut t, k) = rich();
    t.slot_mut(k.d).events = 2;
    assert_named(broken(&t), "event count");
}

#[test]
fn queue_order() {
    let (mut t, _) = rich();
    t.events.order_mut().push(9).unwrap(); // a stream without events
    assert_named(broken(&t), "event queue order");

    let (mut t, _) = rich();
    t.events.order_mut().clear(); // the pending event's stream is missing
    assert_named(broken(&t), "event queue order");
}

#[test]
fn free_slot_list() {
    let (mut t, k) = rich();
    t.arena.set_free_head(k.c); // a slot in use on the free list
    assert_named(broken(&t), "free-slot list");

    let (mut t, _) = rich();
    let free = (0..t.arena.high_water())
        .find(|&i| !t.slot(i).has(Flags::IN_USE))
        .unwrap();
    t.slot_mut(free).next = free; // a cycle
    assert_named(broken(&t), "free-slot list");
}

/// The statistic named by a `currents()` key.
fn current_mut<'a>(s: &'a mut DeviceStats, key: &str) -> &'a mut i64 {
    let mut parts = key.split('.');
    let name = parts.next().unwrap();
    let array = |a: &'a mut StatArray, pool: &str| match pool {
        "all" => &mut a.0[0].current,
        "small_pool" => &mut a.0[1].current,
        "large_pool" => &mut a.0[2].current,
        other => panic!("pool {other}"),
    };
    let pool = parts.next().unwrap();
    match name {
        "allocation" => array(&mut s.allocation, pool),
        "segment" => array(&mut s.segment, pool),
        "active" => array(&mut s.active, pool),
        "inactive_split" => array(&mut s.inactive_split, pool),
        "allocated_bytes" => array(&mut s.allocated_bytes, pool),
        "reserved_bytes" => array(&mut s.reserved_bytes, pool),
        "active_bytes" => array(&mut s.active_bytes, pool),
        "inactive_split_bytes" => array(&mut s.inactive_split_bytes, pool),
        "requested_bytes" => array(&mut s.requested_bytes, pool),
        "oversize_allocations" => &mut s.oversize_allocations.current,
        "oversize_segments" => &mut s.oversize_segments.current,
        other => panic!("stat {other}"),
    }
}

#[test]
fn every_current_statistic() {
    let keys = DeviceStats::new(None).currents().map(|(k, _)| k);
    for key in keys {
        let (mut t, _) = rich();
        *current_mut(&mut t.stats, key) += 1;
        let v = broken(&t);
        assert_eq!(v.what, key, "{v}");
        assert_eq!(v.found, v.expected + 1, "{v}");
    }
    let (mut t, _) = rich();
    t.total_allocated_memory += 512;
    assert_named(broken(&t), "total_allocated_memory");
}

#[test]
fn segment_lists() {
    let (mut t, k) = rich();
    t.slot_mut(k.c).prev = k.a; // skips b
    assert_named(broken(&t), "segment list");

    let (mut t, k) = rich();
    t.slot_mut(k.x).prev = k.a; // a head with a predecessor
    assert_named(broken(&t), "segment list");
}

#[test]
fn ipc_shares() {
    // A share of memory that is not a live allocation (a cached block).
    let (mut t, k) = rich();
    let b = t.slot(k.b).addr;
    t.push_share_for_test(b, 1);
    assert_named(broken(&t), "shared through IPC is live");
    // A share with no consumer left.
    let (mut t, k) = rich();
    let a = t.slot(k.a).addr;
    t.push_share_for_test(a, 0);
    assert_named(broken(&t), "has consumers and one entry");
    // Two entries for one allocation.
    let (mut t, k) = rich();
    let c = t.slot(k.c).addr;
    t.push_share_for_test(c, 1);
    t.push_share_for_test(c, 2);
    assert_named(broken(&t), "has consumers and one entry");
}

/// The fragmentation cross-check names what does not add up: the
/// accounting of a rich state passes, a doctored one fails.
#[test]
fn fragmentation_that_does_not_add_up() {
    use crate::allocator::fragmentation::check_fragmentation;
    let (t, _) = rich();
    t.check_invariants().unwrap();
    let recount = *t.stats();
    let good = t.fragmentation(0);
    check_fragmentation(&good, &recount).unwrap();
    let mut f = good;
    f.device.reserved_bytes += 512;
    assert_named(
        check_fragmentation(&f, &recount).unwrap_err(),
        "reserved bytes",
    );
    let mut f = good;
    f.large_pool.reserved_bytes += 512;
    assert_named(
        check_fragmentation(&f, &recount).unwrap_err(),
        "pools add up",
    );
    let mut f = good;
    f.other_streams_free_bytes += 512;
    assert_named(
        check_fragmentation(&f, &recount).unwrap_err(),
        "the stream's and the others'",
    );
    let mut f = good;
    f.device.allocated_bytes -= 512;
    assert_named(
        check_fragmentation(&f, &recount).unwrap_err(),
        "allocated bytes",
    );
}

/// The config's cached answers out of step with the config.
#[test]
fn a_stale_config_shape() {
    let mut t = tiny();
    t.shape.rounds = true;
    assert_named(broken(&t), "config shape");
}
