//! Returning cached segments to the device: `release_block` (one whole
//! segment), the two release rungs of the malloc ladder
//! (`release_available_cached_blocks`, `release_cached_blocks`, which is also
//! `empty_cache`) and `garbage_collect_cached_blocks`. Whole segments are
//! released in the order PyTorch walks a pool's free set: by (stream, size,
//! address).

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::pool::{FreeIndexKey, Pool};

impl<B, S, const E: usize, H> DeviceAllocator<B, S, E, H>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// `release_block`: give a whole cached segment back to the device. On a
    /// backend failure nothing changes.
    fn release_block(&mut self, i: u32) -> Res<(), B> {
        let (addr, size, pool, stream) = {
            let s = self.slot(i);
            (s.addr, s.size, Pool::of(s.flags), s.stream)
        };
        let entry = self.record_segment_free(addr, size, stream);
        self.backend
            .free(DevicePtr(addr), size)
            .map_err(Error::Backend)?;
        self.keep(entry);
        self.cache_remove(i);
        self.segments.remove(self.arena.slots_mut(), i);
        self.total_allocated_memory -= size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        self.arena.release(i);
        Ok(())
    }

    /// The cached block after key `key` in `pool`'s free index (from the
    /// start with `None`), or `NIL`: the order PyTorch walks a pool's free
    /// set in, `(stream, size, address)`.
    fn next_cached(&self, pool: Pool, key: Option<FreeIndexKey>) -> u32 {
        let slots = self.arena.slots();
        match key {
            None => self.pools.get(pool).lower_bound(slots, (0, 0, 0)),
            Some(k) => self.pools.get(pool).successor(slots, k),
        }
    }

    /// The free-index key of block `i`.
    fn key_of(&self, i: u32) -> FreeIndexKey {
        let s = self.slot(i);
        (s.stream, s.size, s.addr)
    }

    /// `release_available_cached_blocks`: free cached oversize segments of
    /// this stream and pool, one big enough or several largest-first.
    ///
    /// Deliberate difference: PyTorch may hand a block that is only part of a
    /// split segment to `cudaFree` here (after a run-time `max_split_size`
    /// change); such blocks are skipped.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: Pool,
        skey: u64,
        size: u64,
    ) -> Res<bool, B> {
        let mss = self.config.max_split_size;
        if mss == u64::MAX {
            return Ok(false);
        }
        let key = size.max(mss);
        let b = self
            .pools
            .get(pool)
            .lower_bound(self.arena.slots(), (skey, key, 0));
        if b != NIL && self.slot(b).stream == skey {
            if self.slot(b).is_split() {
                return Ok(false);
            }
            self.release_block(b)?;
            return Ok(true);
        }
        let mut released = 0u64;
        let mut cur = self
            .pools
            .get(pool)
            .predecessor(self.arena.slots(), (skey, key, 0));
        while released < key && cur != NIL {
            let s = self.slot(cur);
            if s.size < mss || s.stream != skey {
                break;
            }
            let k = (s.stream, s.size, s.addr);
            if !s.is_split() {
                released += s.size;
                self.release_block(cur)?;
            }
            cur = self.pools.get(pool).predecessor(self.arena.slots(), k);
        }
        Ok(released >= key)
    }

    /// `release_cached_blocks`: wait for all events, then release every
    /// whole cached segment, large pool first.
    pub(super) fn release_cached_blocks(&mut self) -> Res<(), B> {
        self.synchronize_and_free_events()?;
        self.release_whole_segments(Pool::Large)?;
        self.release_whole_segments(Pool::Small)
    }

    /// Release every whole cached segment of `pool`, in the order of its
    /// free index (PyTorch's `release_blocks`).
    fn release_whole_segments(&mut self, pool: Pool) -> Res<(), B> {
        let mut cur = self.next_cached(pool, None);
        while cur != NIL {
            let key = self.key_of(cur);
            if !self.slot(cur).is_split() {
                self.release_block(cur)?;
            }
            cur = self.next_cached(pool, Some(key));
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
        let mut cur = self.next_cached(Pool::Large, None);
        while cur != NIL {
            if !self.slot(cur).is_split() {
                total_age += age(self.slot(cur));
                count += 1;
            }
            cur = self.next_cached(Pool::Large, Some(self.key_of(cur)));
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let mut cur = self.next_cached(Pool::Large, None);
            while cur != NIL {
                let (a, size, key) = (age(self.slot(cur)), self.slot(cur).size, self.key_of(cur));
                if !self.slot(cur).is_split() && a as f64 >= threshold {
                    self.release_block(cur)?;
                    freed = true;
                    reclaimed += size;
                    total_age -= a;
                    count -= 1;
                }
                cur = self.next_cached(Pool::Large, Some(key));
            }
        }
        Ok(())
    }
}
