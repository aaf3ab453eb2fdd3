//! Unit tests of the allocator's internals: the invariant checker is shown
//! to fail on each kind of corruption (`corruption.rs`), and each branch of
//! the in-place split and merge fast paths is taken (`fast_paths.rs`).

mod corruption;
mod fast_paths;
mod pool_corruption;

use super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::config::Config;
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
