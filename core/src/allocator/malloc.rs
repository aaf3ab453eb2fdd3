//! `malloc`: PyTorch's ladder. Round the request and pick the pool (a
//! routing to a private pool, else the default small or large pool), then in
//! order: the smallest cached block of the same stream that fits, the
//! free-memory callbacks, garbage collection (with a memory limit and a GC
//! threshold), a new segment from the device, a free block of a `use_on_oom`
//! pool (default-pool requests only), releasing oversize cached blocks,
//! releasing every cached segment and retrying (counted), and finally out
//! of memory with the numbers of PyTorch's message. While a capture is
//! under way on the device, no event is queried and no rung gives memory
//! back to the device (each would invalidate the capture): only the cache,
//! the callbacks, new segments and the `use_on_oom` pools serve.

use super::registry::Origin;
use super::{DeviceAllocator, Res};
use crate::allocation::{Allocation, MallocFlags};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, DevicePtr, MallocError};
use crate::error::{Error, OomReport};
use crate::history::HistoryStorage;
use crate::history::TraceAction;
use crate::oom_cause::{classify, OomCause, OomClass, OomFacts};
use crate::policy;
use crate::pool::Pool;
use crate::private_pool::{block_pool, block_pool_mut};
use crate::sync::in_callback;

/// What the rejection policy refused: the segment, the device's total and
/// the limit (`per_process_memory_fraction` of it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rejection {
    alloc_size: u64,
    device_total: u64,
    limit: u64,
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The ladder for `orig` bytes. With `ALIGNED`, at a multiple of
    /// `align` (a power of two above [`policy::MIN_BLOCK_SIZE`]): it
    /// searches for a block `align - 512` bytes larger than the rounded
    /// request and carves the aligned part out of it (see `aligned.rs`).
    /// Without, `align` is ignored: PyTorch's path, compiled apart so that
    /// it carries none of this.
    pub(super) fn malloc_impl<const ALIGNED: bool>(
        &mut self,
        orig: u64,
        align: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> Res<Allocation, B> {
        if orig == 0 {
            return Ok(Allocation::NULL);
        }
        if orig >= policy::ONE_EIB {
            return Err(Error::TooLarge {
                requested: orig,
                platform: B::PLATFORM,
            });
        }
        let aligned = ALIGNED;
        if aligned {
            self.reserve_aligned_slots()?;
        } else {
            self.reserve_slots()?;
        }
        let capture = self.settle_before_request(stream)?;
        let rounded = self.rounded(orig)?;
        // The block to look for: with an alignment, room for the request at
        // any 512-byte offset.
        let size = if aligned {
            self.aligned_search_size(orig, rounded, align)?
        } else {
            rounded
        };
        let alloc_size = policy::allocation_size_with(size, self.config.large_segment_size)
            .ok_or(Error::SizeOverflow { requested: orig })?;
        let mut pool = policy::pool_for(size);
        let owner = self.route(stream);
        if aligned {
            self.check_aligned_pool(owner)?;
        }
        let skey: u64 = stream.into();

        let mut found = self.get_free_block(owner, pool, skey, size);
        if found == NIL && !self.callbacks.is_empty() && self.trigger_free_memory_callbacks() {
            if aligned {
                self.reserve_aligned_slots()?;
            } else {
                self.reserve_slots()?;
            }
            found = self.get_free_block(owner, pool, skey, size);
        }
        if found == NIL && self.config.compact() {
            (found, pool) = self.compact_fallbacks(owner, pool, skey, size)?;
        }
        if found == NIL {
            // The rungs that give memory back to the device (garbage
            // collection, oversize blocks, the flush) free segments: never
            // while a capture is under way (see docs/capture-notes.md).
            if self.gc_enabled() && !capture {
                self.garbage_collect_cached_blocks()?;
            }
            found = self.alloc_block(owner, pool, skey, size, alloc_size, false)?;
            // A rejection (`throw_on_cudamalloc_oom`) ends the ladder where
            // it happens: no fallback pool, no release, no retry.
            if found == NIL && self.rejected.is_none() && owner == 0 {
                found = self.use_on_oom_fallback(pool, skey, size, aligned);
            }
            if found == NIL && self.rejected.is_none() && !flags.contains(MallocFlags::NO_RETRY) {
                if !capture && self.release_available_cached_blocks(owner, pool, skey, size)? {
                    found = self.alloc_block(owner, pool, skey, size, alloc_size, false)?;
                }
                if found == NIL && self.rejected.is_none() && !capture {
                    self.release_cached_blocks()?;
                    found = self.alloc_block(owner, pool, skey, size, alloc_size, true)?;
                }
            }
            if found == NIL {
                if let Some(r) = self.rejected.take() {
                    return Err(self.oom_rejected(orig, size, skey, owner, pool, r));
                }
                return Err(self.out_of_memory(orig, size, alloc_size, skey, owner, pool));
            }
        }
        if aligned {
            return self.alloc_aligned_block(found, orig, rounded, pool, align);
        }
        Ok(self.alloc_found_block(found, orig, size, pool))
    }

    /// What every request does first: while no capture is under way,
    /// complete the end-of-life events that have finished; during one
    /// (no event may be queried: the driver refuses it and invalidates the
    /// capture), hand back the parked blocks the capture graph shows are
    /// safe (`graph_capture_record_stream_reuse`). Whether a capture is
    /// under way.
    #[inline(always)]
    pub(super) fn settle_before_request(&mut self, stream: B::Stream) -> Res<bool, B> {
        let capture = self.capturing();
        if !capture {
            if !self.events.is_empty() || self.deferred.len > 0 {
                self.process_events()?;
            }
        } else if self.deferred.marked > 0 && self.config.graph_capture_record_stream_reuse {
            self.free_safe_blocks_in_capture(stream)?;
        }
        Ok(capture)
    }

    /// `round_size` of a request of `orig` bytes under the config.
    #[inline(always)]
    pub(super) fn rounded(&self, orig: u64) -> Res<u64, B> {
        if self.shape.rounds {
            policy::round_size(orig, &self.config)
        } else {
            policy::round_size_plain(orig)
        }
        .ok_or(Error::SizeOverflow { requested: orig })
    }

    /// PyTorch's `try_mempool_fallback`: a free block (never a new segment)
    /// of a `use_on_oom` pool, in table order; `NIL` if none fits. An
    /// `aligned` request skips pools that never split (it would cut the
    /// block).
    fn use_on_oom_fallback(&mut self, pool: Pool, skey: u64, size: u64, aligned: bool) -> u32 {
        let mut owner = 1u8;
        while (owner as usize) <= self.private.capacity() {
            if self.private.get(owner).is_some_and(|p| {
                p.options.use_on_oom && p.use_count > 0 && !(aligned && p.options.no_split)
            }) {
                let b = self.get_free_block(owner, pool, skey, size);
                if b != NIL {
                    return b;
                }
            }
            owner += 1;
        }
        NIL
    }

    /// Whether garbage collection runs: a memory limit and a GC threshold.
    #[inline]
    pub(super) fn gc_enabled(&self) -> bool {
        self.limit.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// `get_free_block`: the smallest cached block of this stream and pool
    /// (of owner `owner`) that fits, subject to the oversize rules, or `NIL`.
    /// It stays in the free index: `alloc_found_block` takes it out, or
    /// re-keys it in place as the remainder of a split.
    #[inline(always)]
    fn get_free_block(&mut self, owner: u8, pool: Pool, skey: u64, size: u64) -> u32 {
        if self.gc_enabled() {
            block_pool_mut(&mut self.pools, &mut self.private, owner, pool).tick();
        }
        let slots = self.arena.slots();
        let mut b =
            block_pool(&self.pools, &self.private, owner, pool).lower_bound(slots, (skey, size, 0));
        if b == NIL || slots[b as usize].stream != skey {
            return NIL;
        }
        if slots[b as usize].has(Flags::EXPANDABLE) {
            b = self.expandable_best_fit(owner, pool, skey, b);
            if b == NIL {
                return NIL;
            }
        }
        if self.refuses_oversize(size, slots[b as usize].size) {
            return NIL;
        }
        b
    }

    /// PyTorch's oversize rules: a request below `max_split_size` takes no
    /// block at or above it, and one at or above it takes no block
    /// `max_non_split_rounding` bytes or more larger than itself.
    #[inline]
    pub(super) fn refuses_oversize(&self, size: u64, block: u64) -> bool {
        let mss = self.config.max_split_size;
        (size < mss && block >= mss)
            || (size >= mss && block >= size.saturating_add(self.config.max_non_split_rounding))
    }

    /// Run every free-memory callback; whether any freed something.
    fn trigger_free_memory_callbacks(&mut self) -> bool {
        let mut freed = false;
        let mut k = 0;
        while k < self.callbacks.len() {
            let cb = self.callbacks[k];
            freed |= in_callback(|| cb.free_memory(self));
            k += 1;
        }
        freed
    }

    /// `alloc_block`: a new segment for owner `owner`'s pool from the
    /// device or the pool's segment source (with expandable segments on,
    /// and no source, room for `size` bytes in an expandable segment), or
    /// `NIL` when the device, the source or the memory limit refuses. The limit is tested against `alloc_size` either way.
    fn alloc_block(
        &mut self,
        owner: u8,
        pool: Pool,
        skey: u64,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
    ) -> Res<u32, B> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        self.source_refused = false;
        if self.fraction_pending {
            self.apply_configured_fraction()?;
        }
        if self
            .limit
            .is_some_and(|l| self.total_allocated_memory.saturating_add(alloc_size) > l)
        {
            return Ok(NIL);
        }
        if self.config.throw_on_cudamalloc_oom {
            let device_total = self.device_total()?;
            let limit = (device_total as f64 * self.config.per_process_memory_fraction) as u64;
            if self.total_allocated_memory.saturating_add(alloc_size) > limit {
                self.rejected = Some(Rejection {
                    alloc_size,
                    device_total,
                    limit,
                });
                return Ok(NIL);
            }
        }
        // A pool with a segment source of its own never maps pages
        // (PyTorch: `is_expandable_segments_active` is false for it).
        let source = match owner {
            0 => None,
            o => self.private.get(o).and_then(|p| p.source),
        };
        if source.is_none() && self.config.maps_pages() {
            return self.alloc_expandable(owner, pool, skey, size);
        }
        if self.arena.available() == 0 {
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        }
        let (ptr, origin) = match source {
            Some(src) => match in_callback(|| (src.alloc)(src.ctx, alloc_size, skey)) {
                Some(p) => (p, Origin::Source(src, skey)),
                None => {
                    self.source_refused = true;
                    return Ok(NIL);
                }
            },
            None => match self.backend.malloc(alloc_size) {
                Ok(p) => (p, Origin::Device),
                Err(MallocError::OutOfMemory) => return Ok(NIL),
                Err(MallocError::Other(e)) => return Err(Error::Backend(e)),
            },
        };
        self.check_new_segment(ptr, alloc_size, origin)?;
        let Some(i) = self.arena.alloc() else {
            self.give_back(ptr, alloc_size, origin);
            return Err(Error::MetadataExhausted {
                capacity: self.arena.capacity(),
            });
        };
        if let Err(e) = self.register_segment(ptr, alloc_size, origin) {
            self.arena.release(i);
            return Err(e);
        }
        let counter = self.segment_counter();
        let s = self.slot_mut(i);
        s.addr = ptr.0;
        s.size = alloc_size;
        s.seg_size = alloc_size;
        s.stream = skey;
        s.counter = counter;
        s.flags.insert(pool.flag());
        s.owner = owner;
        self.segments.insert(self.arena.slots_mut(), i);
        self.reserve(owner, pool, alloc_size, true);
        self.record(TraceAction::SegmentAlloc, ptr.0, alloc_size, skey, owner);
        Ok(i)
    }

    /// A segment the device (or a pool's source) just returned must be non-null, end inside the address space and
    /// overlap no held segment. If not, it is a `BackendContract` error, and
    /// the range is handed back to the device (`give_back`) unless its base
    /// is that of a held segment: freeing that address would release memory
    /// the allocator holds. That one case leaks the returned range, as it
    /// must.
    pub(super) fn check_new_segment(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        origin: Origin,
    ) -> Res<(), B> {
        let pick = |m: &'static str, r: &'static str| origin.pick(m, r);
        if ptr.is_null() {
            return Err(Error::BackendContract {
                what: pick(
                    "malloc returned null",
                    "an address-space reservation returned null",
                ),
                ptr,
            });
        }
        let slots = self.arena.slots();
        let below = self.segments.floor(slots, ptr.0);
        if below != NIL && slots[below as usize].addr == ptr.0 {
            return Err(Error::BackendContract {
                what: pick(
                    "malloc returned the base of a held segment",
                    "an address-space reservation returned the base of a held segment",
                ),
                ptr,
            });
        }
        let what = match ptr.0.checked_add(size) {
            // Blocks sit at multiples of 512 from the base.
            _ if !ptr.0.is_multiple_of(policy::MIN_BLOCK_SIZE) => pick(
                "malloc returned an address that is not 512-byte aligned",
                "an address-space reservation is not 512-byte aligned",
            ),
            None => pick(
                "malloc returned a range past the address space",
                "an address-space reservation returned a range past the address space",
            ),
            Some(end) => {
                // The held segment with the highest base below the new end
                // is the only one that could overlap.
                let h = self.segments.floor(slots, end - 1);
                if h == NIL || slots[h as usize].end_of_segment() <= ptr.0 {
                    return Ok(());
                }
                pick(
                    "malloc returned memory overlapping a held segment",
                    "an address-space reservation overlaps a held segment",
                )
            }
        };
        self.give_back(ptr, size, origin);
        Err(Error::BackendContract { what, ptr })
    }

    /// The device's total memory (read once).
    pub(super) fn device_total(&mut self) -> Res<u64, B> {
        if let Some(t) = self.device_total {
            return Ok(t);
        }
        let t = self.backend.mem_info().map_err(Error::Backend)?.total;
        self.device_total = Some(t);
        Ok(t)
    }

    /// Apply the config's `per_process_memory_fraction` as the memory
    /// fraction, as torch does when it makes a device's allocator (done at
    /// the first new segment; this does it now). Nothing for 1.0.
    pub fn apply_configured_fraction(&mut self) -> Res<(), B> {
        let f = self.config.per_process_memory_fraction;
        if f < 1.0 {
            // (A failed read of the device's memory leaves it pending.)
            let total = self.device_total()?;
            self.limit = Some((f * total as f64) as u64);
        }
        self.fraction_pending = false;
        Ok(())
    }

    /// The rejection policy's error (counted in `num_oom_rejections`, not
    /// in `num_ooms`; no trace entry): torch's message, the verdict
    /// `Rejected`, and a notice for the rejection observers.
    #[cold]
    fn oom_rejected(
        &mut self,
        orig: u64,
        size: u64,
        stream: u64,
        owner: u8,
        pool: Pool,
        r: Rejection,
    ) -> Error<B::Error> {
        self.stats.num_oom_rejections += 1;
        let reserved = self.total_allocated_memory;
        let facts = self.oom_facts(owner, pool, stream, size);
        let cause = OomCause {
            limit: r.limit,
            segment: r.alloc_size,
            headroom: r.limit.saturating_sub(reserved),
            ..classify(&OomFacts {
                alloc_size: r.alloc_size,
                reserved_bytes: reserved,
                device_total: r.device_total,
                device_free: 0,
                allowed: Some(r.limit),
                ..facts
            })
        }
        .rejected();
        let report = OomReport {
            platform: B::PLATFORM,
            device: self.backend.ordinal(),
            requested: orig,
            rounded: size,
            alloc_size: r.alloc_size,
            device_total: r.device_total,
            device_free: 0,
            allowed: Some(r.limit),
            allocated: self.stats.allocated_bytes.all().current.max(0) as u64,
            reserved,
            private_pools: self.cached_in_private_pools(),
            class: OomClass::Rejected,
            seq: self.next_oom_seq(),
            torch: self.config.torch_version(),
            expandable_segments: self.config.expandable_segments,
        };
        self.notify_out_of_memory(&report, &cause, r.device_total);
        Error::OutOfMemory(report)
    }

    /// Bytes of the cached blocks of every private pool (the OOM message's
    /// "allocated in private pools").
    fn cached_in_private_pools(&self) -> u64 {
        self.segments()
            .filter(|seg| !seg.pool_id.is_default())
            .flat_map(|seg| seg.blocks())
            .filter(|b| b.state == crate::snapshot::BlockState::Inactive)
            .map(|b| b.size)
            .sum()
    }

    /// The out-of-memory error (counted in `num_ooms`), with the numbers of
    /// PyTorch's message and the verdict on why ([`crate::OomCause`]).
    #[cold]
    fn out_of_memory(
        &mut self,
        orig: u64,
        size: u64,
        alloc_size: u64,
        stream: u64,
        owner: u8,
        pool: Pool,
    ) -> Error<B::Error> {
        let info = self.backend.mem_info().unwrap_or_default();
        self.record(TraceAction::Oom, info.free, size, stream, owner);
        self.stats.num_ooms += 1;
        let allowed = self.memory_limit();
        let facts = OomFacts {
            alloc_size,
            reserved_bytes: self.stats.reserved_bytes.all().current.max(0) as u64,
            device_total: info.total,
            device_free: info.free,
            allowed,
            source_refused: core::mem::take(&mut self.source_refused),
            ..self.oom_facts(owner, pool, stream, size)
        };
        let cause = classify(&facts);
        let report = OomReport {
            platform: B::PLATFORM,
            device: self.backend.ordinal(),
            requested: orig,
            rounded: size,
            alloc_size,
            device_total: info.total,
            device_free: info.free,
            allowed,
            allocated: self.stats.allocated_bytes.all().current.max(0) as u64,
            reserved: self.stats.reserved_bytes.all().current.max(0) as u64,
            private_pools: self.cached_in_private_pools(),
            class: cause.class,
            seq: self.next_oom_seq(),
            torch: self.config.torch_version(),
            expandable_segments: self.config.expandable_segments,
        };
        self.notify_out_of_memory(&report, &cause, self.limit.unwrap_or(info.total));
        Error::OutOfMemory(report)
    }
}
