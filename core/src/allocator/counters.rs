//! torch's registration counter: the number that orders cached blocks of
//! one size ahead of their address from torch 2.12 on ([`BlockOrder`]).
//!
//! - 2.11 (`SizeAddress`): no counter in the order; every block keeps 0.
//! - 2.12 (`RegistrationCounter`): every new `Block` object takes the next
//!   number: a new segment, the allocated part of a split (the remainder is
//!   the old object), the unmapped rest of a mapped range, the mapped pieces
//!   beside an unmapped range. A merge keeps the number of the block that
//!   was freed (torch's `dst`).
//! - 2.13 on (`SizeCounterAddress`): only new device memory (a device
//!   malloc, a new expandable segment) takes a number; every piece of a
//!   segment inherits it.
//!
//! torch's counter is one process-wide int32 starting at 0; one per
//! allocator orders the blocks of each pool the same (no order compares
//! blocks of two devices). Both wrap past `i32::MAX` to negative numbers,
//! which sort first.

use super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::backend::DeviceBackend;
use crate::history::HistoryStorage;
use crate::torch_version::BlockOrder;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The number of new device memory (a new segment's block).
    #[inline]
    pub(super) fn segment_counter(&mut self) -> u32 {
        if self.config.block_order().uses_counter() {
            let c = self.next_counter;
            self.next_counter = c.wrapping_add(1);
            c
        } else {
            0
        }
    }

    /// The number of a new block carved from the memory of a block whose
    /// number is `parent`: the next number under torch 2.12, else the
    /// parent's.
    #[inline(always)]
    pub(super) fn piece_counter(&mut self, parent: u32) -> u32 {
        if self.config.block_order() == BlockOrder::RegistrationCounter {
            let c = self.next_counter;
            self.next_counter = c.wrapping_add(1);
            c
        } else {
            parent
        }
    }
}
