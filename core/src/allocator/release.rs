//! Returning cached segments to the device: `release_block` (one whole
//! segment), the two release rungs of the malloc ladder
//! (`release_available_cached_blocks`, `release_cached_blocks`, which is also
//! `empty_cache`) and `garbage_collect_cached_blocks`. Whole segments are
//! released in the order PyTorch walks a pool's free set: by (stream, size,
//! address). Private pools lose memory only once freeable (use count 0):
//! `release_cached_blocks` empties them and deletes those left without a
//! segment.

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::index::{FreeKey, Links};
use crate::pool::{FreeIndexKey, Pool};
use crate::private_pool::block_pool;
use crate::sync::in_callback;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// `release_block`: give a whole cached segment back to the device (or
    /// to its pool's segment source). On a backend failure nothing changes.
    fn release_block(&mut self, i: u32) -> Res<(), B> {
        let (addr, size, pool, stream, owner) = {
            let s = self.slot(i);
            (s.addr, s.size, Pool::of(s.flags), s.stream, s.owner)
        };
        let entry = self.record_segment_free(addr, size, stream, owner);
        match self.private.get(owner).and_then(|p| p.source) {
            // PyTorch's `raw_delete` of the pool's allocator: it cannot fail.
            Some(src) => {
                let _ = self.unregistered(addr, |_| {
                    in_callback(|| (src.free)(src.ctx, DevicePtr(addr), size, stream));
                    Ok::<(), ()>(())
                });
            }
            None => self
                .unregistered(addr, |b| b.free(DevicePtr(addr), size))
                .map_err(Error::Backend)?,
        };
        self.keep(entry);
        debug_assert!(
            self.slot(i).prev == NIL && self.slot(i).next == NIL,
            "release_block: block {i} is not a whole segment"
        );
        self.cache_remove(i);
        self.segments.remove(self.arena.slots_mut(), i);
        self.unreserve(owner, pool, size, true);
        self.arena.release(i);
        Ok(())
    }

    /// The cached block after key `key` in the free index of `pool` of owner
    /// `owner` (from the start with `None`), or `NIL`: the order PyTorch
    /// walks a pool's free set in, `(stream, size, address)`.
    pub(super) fn next_cached(&self, owner: u8, pool: Pool, key: Option<FreeIndexKey>) -> u32 {
        let slots = self.arena.slots();
        let index = block_pool(&self.pools, &self.private, owner, pool);
        match key {
            None => index.lower_bound(slots, (0, 0, 0)),
            Some(k) => index.successor(slots, k),
        }
    }

    /// The free-index key of block `i`.
    pub(super) fn key_of(&self, i: u32) -> FreeIndexKey {
        FreeKey::key(self.slot(i))
    }

    /// `release_available_cached_blocks`: free cached oversize segments of
    /// this stream and pool, one big enough or several largest-first.
    ///
    /// Deliberate difference: PyTorch may hand a block that is only part of a
    /// split segment to `cudaFree` here (after a run-time `max_split_size`
    /// change); such blocks are skipped.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<bool, B> {
        let mss = self.config.max_split_size;
        if mss == u64::MAX {
            return Ok(false);
        }
        let key = size.max(mss);
        let b = block_pool(&self.pools, &self.private, owner, pool)
            .lower_bound(self.arena.slots(), (skey, key, 0));
        // An expandable block is never released here (PyTorch's PR #134338):
        // hitting one means looking at smaller blocks instead.
        if b != NIL && self.slot(b).stream == skey && !self.slot(b).has(Flags::EXPANDABLE) {
            if self.slot(b).is_split() {
                return Ok(false);
            }
            self.release_block(b)?;
            return Ok(true);
        }
        let mut released = 0u64;
        let mut cur = block_pool(&self.pools, &self.private, owner, pool)
            .predecessor(self.arena.slots(), (skey, key, 0));
        while released < key && cur != NIL {
            let s = self.slot(cur);
            if s.size < mss || s.stream != skey {
                break;
            }
            let k = FreeKey::key(s);
            if !s.is_split() && !s.has(Flags::EXPANDABLE) {
                released += s.size;
                self.release_block(cur)?;
            }
            cur = block_pool(&self.pools, &self.private, owner, pool)
                .predecessor(self.arena.slots(), k);
        }
        Ok(released >= key)
    }

    /// `release_cached_blocks`: wait for all events and release every whole
    /// cached segment of the default pools, large pool first; then empty
    /// every freeable private pool. Never called while a capture is under
    /// way (PyTorch still empties freeable pools then; their device frees
    /// would invalidate the capture).
    pub(super) fn release_cached_blocks(&mut self) -> Res<(), B> {
        self.synchronize_and_free_events(None)?;
        self.release_whole_segments(0, Pool::Large)?;
        self.release_whole_segments(0, Pool::Small)?;
        let mut owner = 1u8;
        while (owner as usize) <= self.private.capacity() {
            if self.private.get(owner).is_some_and(|p| p.use_count == 0) {
                self.release_pool_segments(owner)?;
            }
            owner += 1;
        }
        Ok(())
    }

    /// Release the whole cached segments of private pool `owner` (small,
    /// then large) and delete the pool if it has none left and nothing
    /// routes to it.
    pub(super) fn release_pool_segments(&mut self, owner: u8) -> Res<(), B> {
        self.release_whole_segments(owner, Pool::Small)?;
        self.release_whole_segments(owner, Pool::Large)?;
        let empty = self.private.get(owner).is_some_and(|p| p.segments == 0);
        if empty && !self.routes.iter().any(|r| r.owner == owner) {
            self.private.delete(owner);
        }
        Ok(())
    }

    /// PyTorch's `release_blocks`: release every whole cached segment of
    /// `pool` of owner `owner`, in the order of its free index, then unmap
    /// the whole pages of its cached expandable blocks.
    fn release_whole_segments(&mut self, owner: u8, pool: Pool) -> Res<(), B> {
        let mut cur = self.next_cached(owner, pool, None);
        let mut expandable = false;
        while cur != NIL {
            let key = self.key_of(cur);
            let s = self.slot(cur);
            if s.has(Flags::EXPANDABLE) {
                expandable = true;
            } else if !s.is_split() {
                self.release_block(cur)?;
            }
            cur = self.next_cached(owner, pool, Some(key));
        }
        if expandable {
            self.unmap_cached_expandable(owner, pool)?;
        }
        Ok(())
    }

    /// `garbage_collect_cached_blocks`: free whole cached large segments
    /// whose age (large-pool lookups since they were cached) is at least the
    /// average, pass after pass, until reserved memory is under the threshold.
    pub(super) fn garbage_collect_cached_blocks(&mut self) -> Res<(), B> {
        let allowed = self.limit.unwrap_or(0);
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - gc_threshold;
        let clock = self.pools.get(Pool::Large).gc_clock();
        let age = |s: &BlockSlot| clock.wrapping_sub(s.aux);
        let (mut total_age, mut count) = (0u64, 0u64);
        let mut cur = self.next_cached(0, Pool::Large, None);
        while cur != NIL {
            if !self.slot(cur).is_split() {
                total_age += age(self.slot(cur));
                count += 1;
            }
            cur = self.next_cached(0, Pool::Large, Some(self.key_of(cur)));
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let mut cur = self.next_cached(0, Pool::Large, None);
            while cur != NIL {
                let (a, size, key) = (age(self.slot(cur)), self.slot(cur).size, self.key_of(cur));
                // The age pass above counts a whole expandable block; this
                // one never frees it (PyTorch's PR #134338).
                let s = self.slot(cur);
                if !s.is_split() && !s.has(Flags::EXPANDABLE) && a as f64 >= threshold {
                    self.release_block(cur)?;
                    freed = true;
                    reclaimed += size;
                    total_age -= a;
                    count -= 1;
                }
                cur = self.next_cached(0, Pool::Large, Some(key));
            }
        }
        Ok(())
    }
}
