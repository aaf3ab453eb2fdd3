//! From what a caller holds (a handle, a pointer) to the slot it names, with
//! the error that says what is wrong with it.

use super::{DeviceAllocator, Res};
use crate::allocation::AllocationInfo;
use crate::arena::{BlockId, BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The slot of a live allocation's handle.
    pub(super) fn validate(&self, id: BlockId) -> Res<u32, B> {
        let i = id.index();
        let Some(s) = self
            .arena
            .slots()
            .get(i as usize)
            .filter(|_| i < self.arena.high_water())
        else {
            return Err(Error::InvalidHandle { index: i });
        };
        if s.generation != id.generation() {
            return Err(Error::StaleHandle {
                index: i,
                generation: id.generation(),
            });
        }
        if !s.has(Flags::ALLOCATED) {
            return Err(Error::InvalidHandle { index: i });
        }
        Ok(i)
    }

    /// What the caller may know of the allocation in slot `i`.
    pub(super) fn info_of(&self, i: u32) -> AllocationInfo<B::Stream> {
        let s = self.slot(i);
        AllocationInfo {
            ptr: DevicePtr(s.addr),
            requested_size: s.requested,
            size: s.size,
            allocation_id: s.aux,
            stream: B::Stream::from(s.stream),
            handle: BlockId::new(i, s.generation),
            pool: self.pool_id_of(s.owner),
        }
    }

    /// The slot of the live allocation starting at `ptr`, or why there is none.
    pub(super) fn live_slot(&self, ptr: DevicePtr) -> Res<u32, B> {
        let slots = self.arena.slots();
        let i = self.live.find(slots, ptr.0);
        if i != NIL {
            return Ok(i);
        }
        let mut cur = self.segment_of(ptr)?;
        while cur != NIL {
            let s = self.slot(cur);
            if s.addr <= ptr.0 && ptr.0 < s.end() {
                if s.has(Flags::ALLOCATED) {
                    return Err(Error::InteriorPointer {
                        ptr,
                        base: DevicePtr(s.addr),
                    });
                }
                break;
            }
            cur = s.next;
        }
        Err(Error::NotAllocated { ptr })
    }

    /// Whether `ptr` lies in one of this allocator's segments (expandable
    /// ones included).
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        self.segment_of(ptr).is_ok()
    }

    /// The head slot of the segment containing `ptr`.
    pub(super) fn segment_of(&self, ptr: DevicePtr) -> Res<u32, B> {
        match self.segments.containing(self.arena.slots(), ptr.0) {
            NIL => Err(Error::UnknownPointer { ptr }),
            h => Ok(h),
        }
    }

    /// Fail before changing anything unless two slots are free (the most one
    /// malloc can use: a new segment and a split remainder; with expandable
    /// segments, three: a reservation, the unmapped rest of a map, and a
    /// split remainder).
    pub(super) fn reserve_slots(&self) -> Res<(), B> {
        if self.arena.available() < 2 + self.shape.maps_pages as u32 {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        }
        Ok(())
    }
}
