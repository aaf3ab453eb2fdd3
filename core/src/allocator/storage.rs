//! Growing the slot storage: [`DeviceAllocator::grow_storage`] moves every
//! block into a larger storage the caller made, so a host that can allocate
//! (the replay tool, a runtime with a heap) never has to guess the number
//! of blocks up front. Slot indices, generations and handles stay as they
//! are; only the live-pointer index, whose buckets are numbered by slot,
//! is rebuilt.

use super::DeviceAllocator;
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::live::LiveIndex;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Move the block metadata into `bigger`, which must have more slots than
    /// the storage in use; returns the old storage. `Err(bigger)` when it is
    /// not larger (nothing changes). What `bigger` held is overwritten.
    /// O(slots): meant for the rare moment a
    /// [`MetadataExhausted`](crate::Error::MetadataExhausted) error says the
    /// storage is full (grow it by a factor, then retry the call, which
    /// changed nothing).
    ///
    /// ```
    /// # use cachealloc_mock::MockDevice;
    /// use cachealloc_core::{BlockSlot, Config, DeviceAllocator, Error};
    /// let mut a = DeviceAllocator::new(MockDevice::new(None), vec![BlockSlot::VACANT; 4], Config::DEFAULT);
    /// let mut held = Vec::new();
    /// let full = loop {
    ///     match a.malloc(512, 0) {
    ///         Ok(x) => held.push(x),
    ///         Err(e) => break e,
    ///     }
    /// };
    /// assert!(matches!(full, Error::MetadataExhausted { capacity: 4 }));
    /// let old = a.grow_storage(vec![BlockSlot::VACANT; 64]).expect("larger");
    /// assert_eq!((old.len(), a.slot_capacity()), (4, 64));
    /// held.push(a.malloc(512, 0)?); // the call that failed, again
    /// for x in held {
    ///     a.free(x.handle.unwrap())?;
    /// }
    /// a.check_invariants().expect("consistent");
    /// # Ok::<(), Error<cachealloc_mock::MockError>>(())
    /// ```
    pub fn grow_storage(&mut self, mut bigger: S) -> Result<S, S> {
        let old_len = self.arena.slots().len();
        {
            let new = bigger.as_mut();
            if new.len() <= old_len {
                return Err(bigger);
            }
            let (moved, fresh) = new.split_at_mut(old_len);
            moved.copy_from_slice(self.arena.slots());
            fresh.fill(BlockSlot::VACANT);
            for s in moved.iter_mut() {
                s.hash_head = NIL;
                // The live index is rebuilt below; the deferred list (frees
                // a capture parked) keeps its links.
                if s.has(Flags::ALLOCATED) {
                    s.set_hash_next(NIL);
                }
            }
        }
        let old = self.arena.replace_storage(bigger);
        // The live-pointer index has one bucket per slot: hash it anew.
        self.live = LiveIndex::EMPTY;
        let high_water = self.arena.high_water();
        let slots = self.arena.slots_mut();
        for i in 0..high_water {
            if slots[i as usize].has(Flags::ALLOCATED) {
                self.live.insert(slots, i);
            }
        }
        Ok(old)
    }

    /// Run `op`; while it fails for lack of block slots (which changes
    /// nothing), move the blocks into the storage `bigger(slots now)` makes
    /// (a larger one) and run it again. The host's way of never running out
    /// of metadata while it has memory; `op`'s other results come back as
    /// they are. If `bigger` makes a storage that is not larger, the
    /// `MetadataExhausted` error comes back.
    pub fn with_growing_storage<T>(
        &mut self,
        mut op: impl FnMut(&mut Self) -> Result<T, Error<B::Error>>,
        mut bigger: impl FnMut(u32) -> S,
    ) -> Result<T, Error<B::Error>> {
        loop {
            match op(self) {
                Err(Error::MetadataExhausted { capacity }) => {
                    if self.grow_storage(bigger(capacity)).is_err() {
                        return Err(Error::MetadataExhausted { capacity });
                    }
                }
                other => return other,
            }
        }
    }
}
