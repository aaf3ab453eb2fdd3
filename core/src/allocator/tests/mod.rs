//! Unit tests of the allocator's internals: the invariant checker is shown
//! to fail on each kind of corruption (`corruption.rs`, `pool_corruption.rs`,
//! `expandable_corruption.rs`, `compact_corruption.rs`), and each branch of
//! the in-place split and merge fast paths is taken (`fast_paths.rs`).

mod compact_corruption;
mod corruption;
mod expandable_corruption;
mod fast_paths;
mod pool_corruption;
mod source_pools;
mod storage;
mod transition_checks;

use super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::config::Config;
use crate::invariants::InvariantViolation;
use crate::testing::TinyBackend;

/// The allocator the tests drive: 64 slots, 8 events.
type Tiny = DeviceAllocator<TinyBackend, [BlockSlot; 64], 8>;

fn tiny() -> Tiny {
    DeviceAllocator::with_events(
        TinyBackend::default(),
        [BlockSlot::VACANT; 64],
        Config::DEFAULT,
    )
}

/// The checker's verdict on a corrupted state (it must find something).
pub(super) fn broken(t: &Tiny) -> InvariantViolation {
    match t.check_invariants() {
        Ok(()) => panic!("the corruption went unnoticed"),
        Err(v) => v,
    }
}

/// The verdict names `word`.
pub(super) fn assert_named(v: InvariantViolation, word: &str) {
    assert!(
        v.what.contains(word),
        "expected a violation naming {word:?}, got: {v}"
    );
}
