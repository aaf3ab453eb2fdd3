//! Routing and captures: which pool a request goes to (the newest routing
//! whose stream filter accepts its stream), whether a CUDA graph capture is
//! under way, and the frees a capture defers. While a capture is under
//! way, PyTorch may not query or record events: a `free` of a block that
//! other streams used is parked (PyTorch's deferred blocks) and settled when
//! no capture is left, at the next `malloc` that processes events, or at
//! `empty_cache`: the streams recorded during the capture are forgotten
//! (their work joined the capture's end), events are recorded on the others,
//! and a block with none left returns to its pool at once.
//!
//! With `graph_capture_record_stream_reuse:True` a parked block may return
//! sooner, during the capture: its free marker (the capture's terminal nodes
//! on its stream and on every stream that used it, when all of them capture)
//! is kept in its slot's `right` link, and a `malloc` on the block's stream
//! hands it back to its pool once every node of the marker precedes the
//! stream's current terminal nodes, so all work queued on the stream from
//! then on runs after the block's last uses (PyTorch's
//! `free_safe_blocks_in_capture`). The backend reads the graph
//! ([`DeviceBackend::capture_walk`]); no event is queried.

use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags, NIL};
use crate::backend::{DeviceBackend, NO_MARKER};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::sync::in_callback;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The owner number of the pool a request on `stream` goes to: the
    /// newest routing that accepts the stream (PyTorch's `get_pool` walks
    /// its list last-in first), else 0 (the default pools).
    #[inline(always)]
    pub(super) fn route(&self, stream: B::Stream) -> u8 {
        if self.routes.is_empty() {
            return 0;
        }
        self.routed(stream)
    }

    /// [`route`](Self::route) while something routes: the filters are the
    /// caller's callbacks.
    #[inline(never)]
    fn routed(&self, stream: B::Stream) -> u8 {
        self.routes
            .iter()
            .rev()
            .find(|r| in_callback(|| r.filter.accepts(stream)))
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
    /// under way, or until its free `marker` is reached.
    pub(super) fn defer(&mut self, i: u32, marker: u32) {
        let tail = self.deferred.tail;
        if marker != NO_MARKER {
            self.deferred.marked += 1;
        }
        let s = self.slot_mut(i);
        s.flags.insert(Flags::DEFERRED);
        s.set_hash_next(NIL);
        s.right = marker;
        if tail == NIL {
            self.deferred.head = i;
        } else {
            self.slot_mut(tail).set_hash_next(i);
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
            let next = self.slot(i).hash_next();
            self.deferred.head = next;
            if next == NIL {
                self.deferred.tail = NIL;
            }
            self.deferred.len -= 1;
            self.drop_marker(i);
            let s = self.slot_mut(i);
            s.flags.remove(Flags::DEFERRED | Flags::HAS_USES);
            s.set_hash_next(NIL);
            s.events = events;
            if events == 0 {
                self.free_block(i);
            }
        }
        Ok(())
    }

    /// PyTorch's `record_free_markers` for the block `i` being freed during
    /// a capture: its stream's and its users' terminal nodes, or
    /// [`NO_MARKER`] when one of those streams is not capturing.
    pub(super) fn free_marker(&mut self, i: u32) -> Res<u32, B> {
        let own = B::Stream::from(self.slot(i).stream);
        let mut streams = core::iter::once(own).chain(self.events.uses_of(i));
        let marker = self
            .backend
            .capture_free_marker(&mut streams)
            .map_err(Error::Backend)?;
        Ok(marker.unwrap_or(NO_MARKER))
    }

    /// Forget the free marker of parked block `i`, if it has one.
    fn drop_marker(&mut self, i: u32) {
        let marker = self.slot(i).right;
        if marker != NO_MARKER {
            self.backend.capture_marker_drop(marker);
            self.deferred.marked -= 1;
            self.slot_mut(i).right = NIL;
        }
    }

    /// PyTorch's `free_safe_blocks_in_capture`, before a `malloc` on
    /// `stream` during a capture: every parked block of the stream whose
    /// marker the stream's terminal nodes now follow returns to its pool
    /// (its stream uses forgotten, no event recorded). The graph is read
    /// only when such a block might be there: PyTorch walks it at every
    /// malloc, and since a stream's terminal nodes only move forward, the
    /// nodes found are the same.
    pub(super) fn free_safe_blocks_in_capture(&mut self, stream: B::Stream) -> Res<(), B> {
        let key: u64 = stream.into();
        let mut i = self.deferred.head;
        let mut any = false;
        while i != NIL {
            let s = self.slot(i);
            if s.right != NO_MARKER && s.stream == key {
                any = true;
                break;
            }
            i = s.hash_next();
        }
        if !any || !self.backend.capture_walk(stream).map_err(Error::Backend)? {
            return Ok(());
        }
        let (mut prev, mut i) = (NIL, self.deferred.head);
        while i != NIL {
            let (next, marker, own) = {
                let s = self.slot(i);
                (s.hash_next(), s.right, s.stream == key)
            };
            if marker == NO_MARKER || !own || !self.backend.capture_marker_reached(stream, marker) {
                prev = i;
                i = next;
                continue;
            }
            if prev == NIL {
                self.deferred.head = next;
            } else {
                self.slot_mut(prev).set_hash_next(next);
            }
            if next == NIL {
                self.deferred.tail = prev;
            }
            self.deferred.len -= 1;
            self.drop_marker(i);
            self.events.drop_uses(i);
            let s = self.slot_mut(i);
            s.flags.remove(Flags::DEFERRED | Flags::HAS_USES);
            s.set_hash_next(NIL);
            self.free_block(i);
            i = next;
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
