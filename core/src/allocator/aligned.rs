//! Allocations at an alignment above 512 bytes (TensorFlow's
//! `AllocateRaw(alignment, ...)`). Neither PyTorch's allocator nor
//! TensorFlow's BFC allocator honours such an alignment (PyTorch has no
//! parameter; BFC ignores it and guarantees 256 bytes; see
//! `docs/tf-allocator-notes.md`). Here the request looks for a block
//! `alignment - 512` bytes larger than its rounded size; the block's low
//! end up to the first aligned address is cut off as a free block (it stays
//! in the cache and merges back when the allocation is freed), and the
//! aligned rest is carved as usual. The allocation is an ordinary block
//! that starts at the aligned address: nothing else needs to know.
//!
//! The padded size is what the request is for the policy: it picks the
//! pool, the oversize rules (a request below `max_split_size` whose padded
//! size is not takes oversize blocks; their rest is then not split off, but
//! their low end still is), the new segment's size, and the "rounded" size
//! of an out-of-memory report.

use super::{DeviceAllocator, Res};
use crate::allocation::Allocation;
use crate::arena::{BlockSlot, Flags};
use crate::backend::DeviceBackend;
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::policy;
use crate::pool::Pool;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Slots for an aligned request: a new segment, the cut-off low end and
    /// the split-off remainder.
    pub(super) fn reserve_aligned_slots(&self) -> Res<(), B> {
        if self.arena.available() < 3 + self.shape.maps_pages as u32 {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        }
        Ok(())
    }

    /// The block size an aligned request looks for: its rounded size plus
    /// the most a 512-byte aligned block can be short of `align`.
    pub(super) fn aligned_search_size(&self, orig: u64, rounded: u64, align: u64) -> Res<u64, B> {
        let size = rounded
            .checked_add(align - policy::MIN_BLOCK_SIZE)
            .ok_or(Error::SizeOverflow { requested: orig })?;
        if size >= policy::ONE_EIB {
            return Err(Error::TooLarge {
                requested: orig,
                platform: B::PLATFORM,
            });
        }
        Ok(size)
    }

    /// A pool that never splits its blocks cannot cut an aligned part out
    /// of one.
    pub(super) fn check_aligned_pool(&self, owner: u8) -> Res<(), B> {
        if self.private.get(owner).is_some_and(|p| p.options.no_split) {
            return Err(Error::Unsupported {
                what: "an alignment above 512 bytes in a pool that never splits blocks",
                backend: "a no_split pool",
            });
        }
        Ok(())
    }

    /// Serve a request of `orig` bytes (rounded: `size`) at a multiple of
    /// `align` from block `found`, which is at least `size + align - 512`
    /// bytes: cut off its low end up to the aligned address (a free block),
    /// then carve the rest. Out of slots (not expected: they were reserved),
    /// the block goes back to the cache unchanged and the request fails.
    pub(super) fn alloc_aligned_block(
        &mut self,
        found: u32,
        orig: u64,
        size: u64,
        pool: Pool,
        align: u64,
    ) -> Res<Allocation, B> {
        let addr = self.slot(found).addr;
        let cut = (align - addr % align) % align;
        let i = if cut == 0 {
            // Out of the index first: it was the smallest block for the
            // padded size, not for `size`, so `carve` may not re-key it in
            // place (its remainder could sort below blocks in between).
            if self.slot(found).has(Flags::CACHED) {
                self.cache_remove(found);
            }
            found
        } else {
            match self.arena.alloc() {
                Some(r) => self.cut_low_end(found, r, cut, pool),
                None => {
                    if !self.slot(found).has(Flags::CACHED) {
                        self.cache_insert(found); // a new segment, whole and free
                    }
                    return Err(Error::MetadataExhausted {
                        capacity: self.arena.capacity(),
                    });
                }
            }
        };
        // An oversize block (the padded search may take one for a request
        // below max_split_size) keeps its rest, as PyTorch never splits one.
        let split =
            self.wants_split(i, size, pool) && self.slot(i).size < self.config.max_split_size;
        Ok(self.carve(i, orig, size, pool, split))
    }

    /// Split block `i` (cached, or a new segment) after its low `cut`
    /// bytes: `i` keeps them and is cached; new slot `r` takes the rest,
    /// uncached, and is returned. The inactive-split statistics count both
    /// as cached split blocks (`carve` then takes `r` out of them, as for
    /// any cached block it hands out).
    fn cut_low_end(&mut self, i: u32, r: u32, cut: u64, pool: Pool) -> u32 {
        let s = self.slot(i);
        let (bsize, cached, expandable) = (s.size, s.has(Flags::CACHED), s.has(Flags::EXPANDABLE));
        let counted = cached && s.is_split();
        if cached {
            self.cache_remove(i);
        }
        self.split_off_remainder(i, r, cut, pool);
        self.cache_insert(i);
        // PyTorch leaves expandable segments out of inactive_split.
        if !expandable {
            self.count_cut(pool, counted, bsize);
        }
        r
    }
}
