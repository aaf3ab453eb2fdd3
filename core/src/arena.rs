//! Fixed-capacity block storage. Blocks are named by small integer handles
//! (slot index + generation), never by pointers; free slots form a list.

use crate::invariants::{expect, fail, InvariantViolation};
use core::num::NonZeroU32;

/// "No slot": the end of a list, an empty tree.
pub(crate) const NIL: u32 = u32::MAX;

bitflags::bitflags! {
    /// The state of one block slot.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub(crate) struct Flags: u8 {
        /// The slot holds a block (it is not on the free-slot list).
        const IN_USE = 1 << 0;
        /// The block is handed out to a caller.
        const ALLOCATED = 1 << 1;
        /// The block belongs to the small pool (else the large pool).
        const SMALL = 1 << 2;
        /// The block is cached: it is in its pool's free index.
        const CACHED = 1 << 3;
        /// `record_stream` added streams that the block's free must wait for.
        const HAS_USES = 1 << 4;
        /// Freed during a capture while other streams used it: its events
        /// wait until no capture is under way (PyTorch's deferred blocks).
        const DEFERRED = 1 << 5;
        /// The block belongs to an expandable segment (a reservation with
        /// pages mapped into it).
        const EXPANDABLE = 1 << 6;
        /// The block is address space with no page mapped (expandable
        /// segments only): it sits in its pool's unmapped index.
        const UNMAPPED = 1 << 7;
    }
}

/// Storage for one block's metadata. Give the allocator any
/// `AsRef<[BlockSlot]> + AsMut<[BlockSlot]>`: an array (which a `no_std`
/// program can keep in a `static`), a boxed slice sized at run time, or a
/// `&mut` slice. Every slot starts as [`BlockSlot::VACANT`].
///
/// ```
/// use cachealloc_core::BlockSlot;
/// let fixed = [BlockSlot::VACANT; 1024];          // on the stack or in a static
/// assert_eq!(fixed.len(), 1024);
/// // with std: vec![BlockSlot::VACANT; n].into_boxed_slice()
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BlockSlot {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The unrounded size of the last allocation that used this block.
    pub(crate) requested: u64,
    /// While cached: the pool's GC clock at insertion. While allocated: the allocation id.
    pub(crate) aux: u64,
    /// Head blocks only: the size of the whole segment.
    pub(crate) seg_size: u64,
    /// The raw stream handle (the segment's allocation stream).
    pub(crate) stream: u64,
    /// torch's registration counter: the block's number, ahead of the
    /// address in the free index's order from torch 2.12 on (`BlockOrder`;
    /// 0 under torch 2.11's). torch's is an `int32_t`: this is its bit
    /// pattern, ordered as signed (see `index::tie`), so that a number past
    /// `i32::MAX` wraps and sorts first, as it does there.
    pub(crate) counter: u32,
    pub(crate) prev: u32,
    pub(crate) next: u32,
    /// Free-index treap children while the block is cached (the treap of
    /// its size class, or of the other streams). A block is never cached
    /// and allocated or parked at once, so the other states reuse the two:
    /// `left` is the next slot of the live-pointer hash chain (allocated) or
    /// of the deferred list (parked), [`hash_next`](Self::hash_next); `right`
    /// is a parked block's free marker (`allocator/capture.rs`).
    pub(crate) left: u32,
    pub(crate) right: u32,
    /// Segment-index treap children (head blocks).
    pub(crate) seg_left: u32,
    pub(crate) seg_right: u32,
    /// Live-pointer hash: head of bucket number `this slot's index`.
    pub(crate) hash_head: u32,
    pub(crate) generation: u32,
    /// Outstanding end-of-life events.
    pub(crate) events: u16,
    pub(crate) flags: Flags,
    /// The pool the block belongs to: 0 the default pools, `k + 1` the
    /// private pool in entry `k` of the pool table.
    pub(crate) owner: u8,
}

impl BlockSlot {
    /// An unused slot.
    pub const VACANT: BlockSlot = BlockSlot {
        addr: 0,
        size: 0,
        requested: 0,
        aux: 0,
        seg_size: 0,
        stream: 0,
        counter: 0,
        prev: NIL,
        next: NIL,
        left: NIL,
        right: NIL,
        seg_left: NIL,
        seg_right: NIL,
        hash_head: NIL,
        generation: 1,
        events: 0,
        flags: Flags::empty(),
        owner: 0,
    };

    pub(crate) fn has(&self, f: Flags) -> bool {
        self.flags.contains(f)
    }

    /// The next slot in the live-pointer hash chain (allocated blocks) or
    /// the deferred list (parked blocks): `left`, which only a cached block
    /// uses for the free index.
    #[inline(always)]
    pub(crate) fn hash_next(&self) -> u32 {
        self.left
    }

    #[inline(always)]
    pub(crate) fn set_hash_next(&mut self, next: u32) {
        self.left = next;
    }

    pub(crate) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    pub(crate) fn end(&self) -> u64 {
        self.addr.wrapping_add(self.size)
    }

    /// Head blocks: the end of the segment.
    pub(crate) fn end_of_segment(&self) -> u64 {
        self.addr.wrapping_add(self.seg_size)
    }
}

/// The handle of a live allocation: a slot index and the generation the slot
/// had when the allocation was made. Freeing bumps the generation, so a
/// doubled or stale handle is an error, not corruption. `Option<BlockId>` is
/// as small as `BlockId`.
///
/// ```
/// use cachealloc_core::BlockId;
/// assert_eq!(core::mem::size_of::<Option<BlockId>>(), 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId {
    index: u32,
    generation: NonZeroU32,
}

impl BlockId {
    pub(crate) fn new(index: u32, generation: u32) -> BlockId {
        BlockId {
            index,
            generation: NonZeroU32::new(generation).unwrap_or(NonZeroU32::MIN),
        }
    }

    /// The slot index.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The slot generation the handle was issued under.
    pub const fn generation(self) -> u32 {
        self.generation.get()
    }
}

/// The slot storage and its free-slot list. Slots above `high_water` have
/// never been used; freed slots are chained through `next`.
pub(crate) struct Arena<S> {
    storage: S,
    high_water: u32,
    free_head: u32,
    in_use: u32,
}

impl<S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>> Arena<S> {
    pub(crate) const fn new(storage: S) -> Self {
        Arena {
            storage,
            high_water: 0,
            free_head: NIL,
            in_use: 0,
        }
    }

    /// Usable slots (the storage length, capped below `NIL`).
    #[inline]
    pub(crate) fn capacity(&self) -> u32 {
        usable(self.slots())
    }

    #[inline]
    pub(crate) fn slots(&self) -> &[BlockSlot] {
        self.storage.as_ref()
    }

    #[inline]
    pub(crate) fn slots_mut(&mut self) -> &mut [BlockSlot] {
        self.storage.as_mut()
    }

    pub(crate) fn in_use(&self) -> u32 {
        self.in_use
    }

    pub(crate) fn high_water(&self) -> u32 {
        self.high_water
    }

    pub(crate) fn available(&self) -> u32 {
        self.capacity() - self.in_use
    }

    /// Take a slot; its links are reset, its generation kept.
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        let i = if self.free_head != NIL {
            let i = self.free_head;
            self.free_head = self.slots()[i as usize].next;
            i
        } else if self.high_water < self.capacity() {
            self.high_water += 1;
            self.high_water - 1
        } else {
            return None;
        };
        self.in_use += 1;
        let s = &mut self.slots_mut()[i as usize];
        s.prev = NIL;
        s.next = NIL;
        s.left = NIL;
        s.right = NIL;
        s.seg_left = NIL;
        s.seg_right = NIL;
        s.events = 0;
        s.requested = 0;
        s.aux = 0;
        // (`counter` is set by every caller: see allocator/counters.rs.)
        s.seg_size = 0;
        s.flags = Flags::IN_USE;
        s.owner = 0;
        Some(i)
    }

    /// Return a slot to the free list. `hash_head` is left alone: it belongs
    /// to the bucket numbered by this slot, not to the block.
    pub(crate) fn release(&mut self, i: u32) {
        let head = self.free_head;
        let s = &mut self.slots_mut()[i as usize];
        s.flags = Flags::empty();
        s.next = head;
        s.prev = NIL;
        self.free_head = i;
        self.in_use -= 1;
    }

    /// The free-slot list: no cycle, only vacant slots below the high-water
    /// mark, and `in use + free == ever used`.
    pub(crate) fn verify(&self) -> Result<(), InvariantViolation> {
        let mut n = 0u32;
        let mut i = self.free_head;
        while i != NIL {
            n += 1;
            if n > self.high_water {
                return Err(fail("free-slot list has a cycle", None, 0, 1));
            }
            let s = self
                .slots()
                .get(i as usize)
                .filter(|_| i < self.high_water)
                .ok_or(fail("free-slot list link out of range", Some(i), 0, 1))?;
            if s.flags != Flags::empty() {
                return Err(fail(
                    "free-slot list holds a slot in use",
                    Some(i),
                    0,
                    s.flags.bits() as i64,
                ));
            }
            i = s.next;
        }
        expect(
            "free-slot list: slots in use + free slots == slots ever used",
            None,
            self.high_water as i64,
            (self.in_use + n) as i64,
        )
    }

    /// Put `storage` in place of the storage in use (which it must extend:
    /// same blocks, more slots) and return the old one.
    pub(crate) fn replace_storage(&mut self, storage: S) -> S {
        core::mem::replace(&mut self.storage, storage)
    }

    /// Test support: point the free-slot list's head elsewhere.
    #[cfg(test)]
    pub(crate) fn set_free_head(&mut self, i: u32) {
        self.free_head = i;
    }
}

/// The slots a storage of this length can use (capped below `NIL`).
#[inline]
pub(crate) fn usable(slots: &[BlockSlot]) -> u32 {
    slots.len().min(NIL as usize - 1) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host metadata per block (reported in the docs and the notes).
    #[test]
    fn slot_size() {
        std::println!("BlockSlot: {} bytes", core::mem::size_of::<BlockSlot>());
        assert_eq!(core::mem::size_of::<BlockSlot>(), 88);
        assert_eq!(core::mem::size_of::<Option<BlockId>>(), 8);
    }
}
