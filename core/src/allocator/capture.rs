//! Routing and captures: which pool a request goes to (the newest routing
//! whose stream filter accepts its stream), whether a CUDA graph capture is
//! under way, and the frees a capture defers. While a capture is under
//! way, PyTorch may not query or record events: a `free` of a block that
//! other streams used is parked (PyTorch's deferred blocks) and settled when
//! no capture is left, at the next `malloc` that processes events, or at
//! `empty_cache`: the streams recorded during the capture are forgotten
//! (their work joined the capture's end), events are recorded on the others,
//! and a block with none left returns to its pool at once.

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::DeviceBackend;
use crate::history::HistoryStorage;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The owner number of the pool a request on `stream` goes to: the
    /// newest routing that accepts the stream (PyTorch's `get_pool` walks
    /// its list last-in first), else 0 (the default pools).
    #[inline]
    pub(super) fn route(&self, stream: B::Stream) -> u8 {
        if self.routes.is_empty() {
            return 0;
        }
        self.routes
            .iter()
            .rev()
            .find(|r| r.filter.accepts(stream))
            .map_or(0, |r| r.owner)
    }

    /// Whether a capture is under way on this device. PyTorch asks whether
    /// the calling thread's stream is capturing (`is_capture_context`); a
    /// device call from any thread can invalidate a capture in the
    /// driver's default (global) mode, so every call is treated as made
    /// inside it.
    #[inline]
    pub(super) fn capturing(&self) -> bool {
        self.captures > 0
    }

    /// Park the freed block `i` (its stream uses kept) until no capture is
    /// under way.
    pub(super) fn defer(&mut self, i: u32) {
        let tail = self.deferred.tail;
        let s = self.slot_mut(i);
        s.flags.insert(Flags::DEFERRED);
        s.hash_next = NIL;
        if tail == NIL {
            self.deferred.head = i;
        } else {
            self.slot_mut(tail).hash_next = i;
        }
        self.deferred.tail = i;
        self.deferred.len += 1;
    }

    /// PyTorch's `insert_events_deferred_until_no_capture`: for each parked
    /// block, oldest first, forget the streams recorded during the capture,
    /// record events on the others, or return it to its pool if none is
    /// left. Only once no capture is under way. PyTorch's event queues are
    /// unbounded; ours is not: when it is full, `wait` makes room by waiting
    /// for the oldest events (the caller is about to wait for all of them),
    /// else the blocks that do not fit stay parked until a later call. A
    /// backend failure leaves the block that failed, and those after it,
    /// parked.
    pub(super) fn settle_deferred(&mut self, wait: bool) -> Res<(), B> {
        if self.captures > 0 {
            return Ok(());
        }
        while self.deferred.head != NIL {
            let i = self.deferred.head;
            let events = if self.events.drop_capture_uses(i) {
                if !self.make_room_for(i, wait)? {
                    return Ok(());
                }
                self.events.record_free(&mut self.backend, i)?
            } else {
                0
            };
            let next = self.slot(i).hash_next;
            self.deferred.head = next;
            if next == NIL {
                self.deferred.tail = NIL;
            }
            self.deferred.len -= 1;
            let s = self.slot_mut(i);
            s.flags.remove(Flags::DEFERRED | Flags::HAS_USES);
            s.hash_next = NIL;
            s.events = events;
            if events == 0 {
                self.free_block(i);
            }
        }
        Ok(())
    }

    /// Room in the event queue for the events of freeing block `i`: by
    /// completing what is done, and with `wait` by waiting for the oldest
    /// events. Whether there is room.
    fn make_room_for(&mut self, i: u32, wait: bool) -> Res<bool, B> {
        if self.events.has_room_for(i) {
            return Ok(true);
        }
        self.sweep_completed_events()?;
        while wait && !self.events.has_room_for(i) {
            match self
                .events
                .next_synchronized(&mut self.backend, |_| true)
                .map_err(crate::error::Error::Backend)?
            {
                Some(slot) => self.event_done(slot),
                None => break,
            }
        }
        Ok(self.events.has_room_for(i))
    }

    /// Parked blocks (freed during a capture, waiting for it to end).
    pub fn deferred_frees(&self) -> u32 {
        self.deferred.len
    }
}
