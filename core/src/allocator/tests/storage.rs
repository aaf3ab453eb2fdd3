//! Growing the slot storage ([`DeviceAllocator::grow_storage`]): every
//! block keeps its slot, handle and pointer; the live-pointer index is
//! rebuilt for the new bucket count; a pending free still completes.

use super::super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::config::Config;
use crate::testing::TinyBackend;
use crate::Error;
use std::vec;
use std::vec::Vec;

type Growing = DeviceAllocator<TinyBackend, Vec<BlockSlot>, 8>;

#[test]
fn blocks_survive_a_larger_storage() {
    let mut t: Growing = DeviceAllocator::with_events(
        TinyBackend::default(),
        vec![BlockSlot::VACANT; 8],
        Config::DEFAULT,
    );
    let mut live = Vec::new();
    loop {
        match t.malloc(4096 + 512 * live.len() as u64, 0) {
            Ok(a) => live.push(a),
            Err(Error::MetadataExhausted { capacity }) => {
                assert_eq!(capacity, 8);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    // A pending free across the move.
    let pending = live.pop().unwrap();
    t.record_stream(pending.handle.unwrap(), 1).unwrap();
    t.free(pending.handle.unwrap()).unwrap();
    let before = *t.stats();

    assert!(
        t.grow_storage(vec![BlockSlot::VACANT; 8]).is_err(),
        "not larger"
    );
    let old = t.grow_storage(vec![BlockSlot::VACANT; 1000]).unwrap();
    assert_eq!((old.len(), t.slot_capacity()), (8, 1000));
    t.check_invariants().unwrap();
    assert_eq!(t.stats().allocation, before.allocation);

    // Pointers and handles still name the same blocks.
    for a in &live {
        let info = t.allocation_info_ptr(a.ptr).unwrap();
        assert_eq!(info.allocation_id, a.allocation_id);
    }
    let more: Vec<_> = (0..50)
        .map(|k| t.malloc(512 * (k + 1), 0).unwrap())
        .collect();
    t.check_invariants().unwrap();
    for (k, a) in live.iter().chain(&more).enumerate() {
        if k % 2 == 0 {
            t.free_ptr(a.ptr).unwrap();
        } else {
            t.free(a.handle.unwrap()).unwrap();
        }
    }
    t.empty_cache().unwrap();
    t.check_invariants().unwrap();
    assert_eq!(t.stats().allocation.all().current, 0);
    assert_eq!(t.stats().segment.all().current, 0);
}

/// `with_growing_storage` grows as often as the calls need, and gives the
/// exhaustion back when the storage it is offered is no larger.
#[test]
fn calls_retry_in_larger_storage() {
    let mut t: Growing = DeviceAllocator::with_events(
        TinyBackend::default(),
        vec![BlockSlot::VACANT; 4],
        Config::DEFAULT,
    );
    let mut grown = Vec::new();
    let held: Vec<_> = (0..100u64)
        .map(|k| {
            t.with_growing_storage(
                |a| a.malloc(4096 + 512 * k, 0),
                |slots| {
                    grown.push(slots);
                    vec![BlockSlot::VACANT; 2 * slots as usize]
                },
            )
            .unwrap()
        })
        .collect();
    assert_eq!(grown, [4, 8, 16, 32, 64]);
    t.check_invariants().unwrap();
    let refused = t.with_growing_storage(
        |a| {
            let mut more = Vec::new();
            loop {
                more.push(a.malloc(512, 0)?);
            }
        },
        |slots| vec![BlockSlot::VACANT; slots as usize],
    );
    assert!(matches!(
        refused,
        Err::<(), _>(Error::MetadataExhausted { capacity: 128 })
    ));
    for a in held {
        t.free(a.handle.unwrap()).unwrap();
    }
    t.check_invariants().unwrap();
}

/// Frees that a capture parked (their list is linked through the slots)
/// survive a move to a larger storage made while the capture is under way,
/// and all of them settle once it ends.
#[test]
fn frees_parked_by_a_capture_survive_a_larger_storage() {
    use crate::private_pool::{MempoolId, StreamFilter};
    let mut t: Growing = DeviceAllocator::with_events(
        TinyBackend::default(),
        vec![BlockSlot::VACANT; 16],
        Config::DEFAULT,
    );
    let xs: Vec<_> = (0..3).map(|k| t.malloc(4096 << k, 0).unwrap()).collect();
    for x in &xs {
        t.record_stream(x.handle.unwrap(), 1).unwrap();
    }
    let graph = MempoolId(1, 0);
    t.capture_begin(graph, StreamFilter::stream(2)).unwrap();
    for x in &xs {
        t.free(x.handle.unwrap()).unwrap();
    }
    assert_eq!(t.deferred_frees(), 3);
    t.grow_storage(vec![BlockSlot::VACANT; 64]).unwrap();
    t.check_invariants().unwrap();
    t.capture_end(graph).unwrap();
    // The next malloc settles them all (events on stream 1, complete on
    // this device at once).
    let y = t.malloc(512, 0).unwrap();
    assert_eq!(t.deferred_frees(), 0);
    t.free(y.handle.unwrap()).unwrap();
    t.check_invariants().unwrap();
    assert_eq!(t.stats().allocation.all().current, 0);
}
