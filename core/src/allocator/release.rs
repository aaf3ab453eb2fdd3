//! Returning cached segments to the device: `release_block` (one whole
//! segment), the two release rungs of the malloc ladder
//! (`release_available_cached_blocks`, `release_cached_blocks`, which is also
//! `empty_cache`) and `garbage_collect_cached_blocks`.

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr};
use crate::error::Error;
use crate::pool::Pool;

impl<B, S, const E: usize> DeviceAllocator<B, S, E>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    /// `release_block`: give a whole cached segment back to the device. On a
    /// backend failure nothing changes.
    fn release_block(&mut self, i: u32) -> Res<(), B> {
        let (addr, size, pool) = {
            let s = self.slot(i);
            (s.addr, s.size, Pool::of(s.flags))
        };
        self.backend
            .free(DevicePtr(addr), size)
            .map_err(Error::Backend)?;
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

    /// Whether a head slot is a cached whole segment.
    #[inline]
    fn is_whole_free(&self, h: u32) -> bool {
        let s = self.slot(h);
        s.has(Flags::CACHED) && s.next == NIL
    }

    /// Whether head `h` is a whole cached segment of the large pool (what
    /// garbage collection may release).
    fn is_collectable(&self, h: u32) -> bool {
        Pool::of(self.slot(h).flags) == Pool::Large && self.is_whole_free(h)
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

    /// Release every whole cached segment of `pool`, in address order.
    fn release_whole_segments(&mut self, pool: Pool) -> Res<(), B> {
        let mut cur = self.segments.first(self.arena.slots());
        while cur != NIL {
            let next = self
                .segments
                .successor(self.arena.slots(), self.slot(cur).addr);
            if Pool::of(self.slot(cur).flags) == pool && self.is_whole_free(cur) {
                self.release_block(cur)?;
            }
            cur = next;
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
        let mut cur = self.segments.first(self.arena.slots());
        while cur != NIL {
            if self.is_collectable(cur) {
                total_age += age(self.slot(cur));
                count += 1;
            }
            cur = self
                .segments
                .successor(self.arena.slots(), self.slot(cur).addr);
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let mut cur = self.segments.first(self.arena.slots());
            while cur != NIL {
                let (a, size) = (age(self.slot(cur)), self.slot(cur).size);
                let next = self
                    .segments
                    .successor(self.arena.slots(), self.slot(cur).addr);
                if self.is_collectable(cur) && a as f64 >= threshold {
                    self.release_block(cur)?;
                    freed = true;
                    reclaimed += size;
                    total_age -= a;
                    count -= 1;
                }
                cur = next;
            }
        }
        Ok(())
    }
}
