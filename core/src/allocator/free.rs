//! `free`: allocation statistics drop at once; the block returns to the
//! cache at once, or after the end-of-life events of the streams that used
//! it (`record_stream`), and then merges with its cached neighbours
//! (`free_block`). Also the two ways events complete: `process_events`
//! (polled at malloc) and `synchronize_and_free_events` (a wait, at
//! `empty_cache` and the last rung of the ladder).

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, NO_MARKER};
use crate::error::Error;
use crate::events::Sweep;
use crate::history::HistoryStorage;
use crate::history::TraceAction;
use crate::index::{tie, FreeKey, Links};
use crate::pool::Pool;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// `recordStream` on the live block in slot `i` (during a capture, the
    /// use is also remembered as a capture-time one).
    pub(super) fn record_stream_slot(&mut self, i: u32, stream: B::Stream) -> Res<(), B> {
        if !self.ipc_shared.is_empty() && self.is_held(i) {
            return Err(Error::NotAllocated {
                ptr: crate::DevicePtr(self.slot(i).addr),
            });
        }
        if stream.into() == self.slot(i).stream {
            return Ok(());
        }
        self.events.add_use(i, stream, self.capturing())?;
        self.slot_mut(i).flags.insert(Flags::HAS_USES);
        Ok(())
    }

    /// PyTorch's `free` of the live block in slot `i`. Its events are
    /// recorded before anything changes, so a failure leaves the allocation
    /// live and untouched. During a capture a block that other streams used
    /// records no event: it is parked until the capture ends.
    pub(super) fn free_slot(&mut self, i: u32) -> Res<(), B> {
        debug_assert!(
            self.slot(i).has(Flags::ALLOCATED) && !self.slot(i).has(Flags::CACHED),
            "free_slot: block {i} is not an allocated block ({:?})",
            self.slot(i).flags
        );
        let mut events = 0;
        let mut deferred = false;
        let mut marker = NO_MARKER;
        if self.slot(i).has(Flags::HAS_USES) {
            deferred = self.capturing();
            if deferred && self.config.graph_capture_record_stream_reuse {
                marker = self.free_marker(i)?;
            }
            if !deferred {
                if !self.events.has_room_for(i) {
                    // Make room from events that have completed (PyTorch's
                    // queues are unbounded; ours drain before they refuse).
                    self.process_events()?;
                    if !self.events.has_room_for(i) {
                        return Err(Error::EventQueueFull { capacity: E });
                    }
                }
                events = self.events.record_free(&mut self.backend, i)?;
            }
        }
        self.live.remove(self.arena.slots_mut(), i);
        let s = self.slot_mut(i);
        // A parked block keeps its stream uses until the capture is over.
        s.flags.remove(if deferred {
            Flags::ALLOCATED
        } else {
            Flags::ALLOCATED.union(Flags::HAS_USES)
        });
        s.generation = s.generation.wrapping_add(1).max(1);
        s.events = events;
        let (pool, size) = (Pool::of(s.flags), s.size);
        self.count_freed(pool, size);
        self.record_block(TraceAction::FreeRequested, i);
        if deferred {
            self.defer(i, marker);
        } else if events == 0 {
            self.free_block(i);
        }
        Ok(())
    }

    /// `free_block`: merge block `i` with its cached neighbours and cache
    /// the result. The lower block's slot survives a merge, so a segment's
    /// head slot never changes; the merged block carries the freed block's
    /// last request (in PyTorch the freed block object survives, and a
    /// snapshot shows its `requested_size`).
    pub(super) fn free_block(&mut self, i: u32) {
        self.record_block(TraceAction::FreeCompleted, i);
        if self.try_merge_in_place(i) {
            return;
        }
        let (pool, orig_size, requested) = {
            let s = self.slot(i);
            (Pool::of(s.flags), s.size, s.requested)
        };
        let mut net_blocks = 0i64;
        let mut net_bytes = 0i64;
        let mut b = i;
        let p = self.slot(i).prev;
        // Blocks of one segment share a stream, except in the compact
        // policy's segments, where only free blocks of one stream merge.
        let stream = self.slot(i).stream;
        if p != NIL && self.slot(p).has(Flags::CACHED) && self.slot(p).stream == stream {
            net_bytes -= self.slot(p).size as i64;
            self.cache_remove(p);
            self.absorb_into_prev(p);
            self.slot_mut(p).requested = requested;
            b = p;
            net_blocks -= 1;
        }
        let n = self.slot(b).next;
        if n != NIL && self.slot(n).has(Flags::CACHED) && self.slot(n).stream == stream {
            net_bytes -= self.slot(n).size as i64;
            self.cache_remove(n);
            self.absorb_next(b);
            net_blocks -= 1;
        }
        self.cache_insert(b);
        if self.slot(b).is_split() {
            net_blocks += 1;
            net_bytes += self.slot(b).size as i64;
        }
        // PyTorch leaves expandable segments out of inactive_split.
        if !self.arena.slots()[b as usize].has(Flags::EXPANDABLE) {
            self.count_merge(pool, net_blocks, net_bytes);
        }
        self.leave_active(pool, orig_size, requested);
    }

    /// Block `p` takes over the block after it, which torch keeps instead
    /// (its `dst`): `p` takes its number (see `counters.rs`).
    #[inline]
    pub(super) fn absorb_into_prev(&mut self, p: u32) {
        self.absorb::<true>(p);
    }

    /// Block `b` takes over the block after it (which leaves its segment list
    /// and its slot).
    #[inline]
    pub(super) fn absorb_next(&mut self, b: u32) {
        self.absorb::<false>(b);
    }

    /// Block `b` takes over the block after it, and with `NUMBER` its
    /// number.
    #[inline(always)]
    fn absorb<const NUMBER: bool>(&mut self, b: u32) {
        let n = self.slot(b).next;
        let (nsize, nnext, ncounter) = {
            let ns = self.slot(n);
            (ns.size, ns.next, ns.counter)
        };
        let bs = self.slot_mut(b);
        bs.size += nsize;
        if NUMBER {
            bs.counter = ncounter;
        }
        bs.next = nnext;
        if nnext != NIL {
            self.slot_mut(nnext).prev = b;
        }
        self.arena.release(n);
    }

    /// The fast merge, when the block below `i` is not cached and the block
    /// above, T, is: T absorbs `i` in place if its grown key (same stream,
    /// larger size, lower address) stays below T's successor in the free
    /// index (and in its size class): one search instead of a remove and an
    /// insert. Segment heads never move (`i` has a predecessor). Whether it
    /// merged.
    pub(super) fn try_merge_in_place(&mut self, i: u32) -> bool {
        let (p, n) = (self.slot(i).prev, self.slot(i).next);
        if p == NIL
            || (self.slot(p).has(Flags::CACHED) && self.slot(p).stream == self.slot(i).stream)
            || n == NIL
        {
            return false;
        }
        let t = self.slot(n);
        if !t.has(Flags::CACHED) || t.stream != self.slot(i).stream {
            return false;
        }
        let (pool, orig_size, requested, expandable, counter) = {
            let s = self.slot(i);
            (
                Pool::of(s.flags),
                s.size,
                s.requested,
                s.has(Flags::EXPANDABLE),
                // The freed block is torch's survivor: its number.
                s.counter,
            )
        };
        let key = FreeKey::key(t);
        let new_addr = t.addr - orig_size;
        let grown = (key.0, key.1 + orig_size, tie(counter, new_addr));
        if !self.free_index_of(n).may_resize(key.1, grown.1) {
            return false;
        }
        let slots = self.arena.slots();
        let succ = self.free_index_of(n).successor(slots, key);
        if succ != NIL && {
            let s = &slots[succ as usize];
            FreeKey::key(s) <= grown
        } {
            return false;
        }
        let clock = self.free_index_of(n).gc_clock();
        let ts = self.slot_mut(n);
        ts.addr = new_addr;
        ts.counter = counter;
        ts.size = grown.1;
        ts.prev = p;
        ts.requested = requested;
        ts.aux = clock; // re-cached now
        self.slot_mut(p).next = n;
        self.arena.release(i);
        // One cached block absorbed the freed one: the split count is
        // unchanged and the cached bytes grow by the freed block.
        if !expandable {
            self.count_merge(pool, 0, orig_size as i64);
        }
        self.leave_active(pool, orig_size, requested);
        true
    }

    /// One end-of-life event of block `slot` completed.
    pub(super) fn event_done(&mut self, slot: u32) {
        let s = self.slot_mut(slot);
        s.events = s.events.saturating_sub(1);
        if s.events == 0 {
            self.free_block(slot);
        }
    }

    /// `process_events`: settle the frees a finished capture deferred, then
    /// complete the events that are done, without waiting.
    pub(super) fn process_events(&mut self) -> Res<(), B> {
        if self.deferred.len > 0 {
            self.settle_deferred(false)?;
        }
        self.sweep_completed_events()
    }

    /// Complete the events that are done (one sweep of the queues).
    pub(super) fn sweep_completed_events(&mut self) -> Res<(), B> {
        let mut sweep = Sweep::default();
        while let Some(slot) = self
            .events
            .next_ready(&mut self.backend, &mut sweep)
            .map_err(Error::Backend)?
        {
            self.event_done(slot);
        }
        Ok(())
    }

    /// `synchronize_and_free_events`: settle the deferred frees, then wait
    /// for every pending event, queue by queue (only those of blocks of pool
    /// `owner` when given: PyTorch's `emptyCache(mempool_id)`).
    pub(super) fn synchronize_and_free_events(&mut self, owner: Option<u8>) -> Res<(), B> {
        self.stats.num_sync_all_streams += 1;
        if self.deferred.len > 0 {
            self.settle_deferred(true)?;
        }
        loop {
            let slots = self.arena.slots();
            let wanted = |i: u32| owner.is_none_or(|o| slots[i as usize].owner == o);
            let Some(slot) = self
                .events
                .next_synchronized(&mut self.backend, wanted)
                .map_err(Error::Backend)?
            else {
                return Ok(());
            };
            self.event_done(slot);
        }
    }
}
