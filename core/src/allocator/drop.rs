//! What a [`DeviceAllocator`] does as it is dropped, once it has something
//! to do (armed by [`arm_drop`](DeviceAllocator::arm_drop), where the
//! bounds are known): every segment of a pool whose segments come from a
//! source of its own goes back to that source, cached or not (nobody can
//! free its blocks through this allocator any more), and each such source
//! is told once that it may go (`release`); an attached segment registry
//! forgets this allocator's segments. Device segments stay the backend's
//! business (PyTorch frees nothing at exit either).

use super::DeviceAllocator;
use crate::arena::{BlockSlot, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::history::HistoryStorage;

impl<B: DeviceBackend, S, const E: usize, H, const P: usize> Drop
    for DeviceAllocator<B, S, E, H, P>
{
    fn drop(&mut self) {
        if let Some(work) = self.on_drop.take() {
            work(self);
        }
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// From now on a drop gives source pools' segments back and detaches
    /// the segment registry.
    pub(super) fn arm_drop(&mut self) {
        self.on_drop = Some(Self::at_drop);
    }

    fn at_drop(&mut self) {
        let mut h = self.segments.first(self.arena.slots());
        while h != NIL {
            let s = &self.arena.slots()[h as usize];
            let (addr, size, stream, owner) = (s.addr, s.seg_size, s.stream, s.owner);
            if let Some(src) = self.private.get(owner).and_then(|p| p.source) {
                (src.free)(src.ctx, DevicePtr(addr), size, stream);
            }
            h = self.segments.successor(self.arena.slots(), addr);
        }
        self.detach_segment_registry();
        for owner in 1..=u8::MAX {
            if self.private.get(owner).is_some_and(|p| p.source.is_some()) {
                self.private.delete(owner);
            }
        }
    }
}
