//! [`EventQueue`]: the end-of-life events of PyTorch's `record_stream`.
//!
//! A live block used on other streams than its own remembers them (stream
//! uses). When it is freed, one event is recorded on each such stream and
//! queued; the block returns to the cache when all of them have completed.
//! PyTorch keeps one FIFO per stream (`cuda_events`, a hash map of stream to
//! deque); here one fixed-capacity list holds every event, and `order` lists
//! the streams with queued events in the order their queues were created,
//! which is the order `process_events` visits them (see [`EventQueue::next_ready`]).
//! Events whose block returned are kept idle for reuse (PyTorch's
//! `EventPool`).

use crate::arena::{BlockSlot, Flags};
use crate::backend::{DeviceBackend, EventStatus};
use crate::error::Error;
use crate::invariants::{ensure, expect, fail, InvariantViolation};

/// An event recorded on `stream` when the block in `slot` was freed.
struct PendingEvent<Ev, St> {
    event: Ev,
    slot: u32,
    stream: St,
}

/// A stream that used the live block in `slot` besides its own.
#[derive(Clone, Copy)]
struct StreamUse<St> {
    slot: u32,
    stream: St,
    /// Recorded (also) while a capture was under way (PyTorch's
    /// `block_to_cudagraph_stream_uses`): forgotten when the block's
    /// deferred free is settled after the capture.
    in_capture: bool,
}

/// Where [`EventQueue::next_ready`] is in its sweep over the queues.
#[derive(Clone, Copy, Default)]
pub(crate) struct Sweep {
    queue: usize,
    from: usize,
}

/// Stream uses, queued events and idle events, `E` of each at most.
pub(crate) struct EventQueue<B: DeviceBackend, const E: usize> {
    pending: heapless::Vec<PendingEvent<B::Event, B::Stream>, E>,
    uses: heapless::Vec<StreamUse<B::Stream>, E>,
    order: heapless::Vec<u64, E>,
    idle: heapless::Vec<B::Event, E>,
}

type Res<T, B> = Result<T, Error<<B as DeviceBackend>::Error>>;

impl<B: DeviceBackend, const E: usize> EventQueue<B, E> {
    pub(crate) const fn new() -> Self {
        EventQueue {
            pending: heapless::Vec::new(),
            uses: heapless::Vec::new(),
            order: heapless::Vec::new(),
            idle: heapless::Vec::new(),
        }
    }

    /// Whether no event is queued.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Queued events.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Remember that the live block in `slot` is used on `stream` (a stream
    /// already remembered is not added twice), `in_capture`: while a capture
    /// is under way.
    pub(crate) fn add_use(&mut self, slot: u32, stream: B::Stream, in_capture: bool) -> Res<(), B> {
        if let Some(u) = self
            .uses
            .iter_mut()
            .find(|u| u.slot == slot && u.stream == stream)
        {
            u.in_capture |= in_capture;
            return Ok(());
        }
        self.uses
            .push(StreamUse {
                slot,
                stream,
                in_capture,
            })
            .map_err(|_| Error::StreamUsesFull { capacity: E })
    }

    /// The streams remembered for `slot`.
    pub(crate) fn uses_of(&self, slot: u32) -> impl Iterator<Item = B::Stream> + '_ {
        self.uses
            .iter()
            .filter(move |u| u.slot == slot)
            .map(|u| u.stream)
    }

    /// Forget every stream remembered for `slot` (the capture graph showed
    /// their work done before anything later on the block's stream).
    pub(crate) fn drop_uses(&mut self, slot: u32) {
        self.uses.retain(|u| u.slot != slot);
    }

    /// Forget the streams recorded on `slot` during a capture (their work
    /// joined the capture's end); whether any use is left.
    pub(crate) fn drop_capture_uses(&mut self, slot: u32) -> bool {
        self.uses.retain(|u| !(u.slot == slot && u.in_capture));
        self.uses.iter().any(|u| u.slot == slot)
    }

    /// Whether the queue has room for the events of freeing `slot` now.
    pub(crate) fn has_room_for(&self, slot: u32) -> bool {
        self.pending.len() + self.uses.iter().filter(|u| u.slot == slot).count() <= E
    }

    /// The block in `slot` is freed: record and queue one event on each
    /// stream that used it, in increasing stream order (as the reference
    /// model does; PyTorch iterates a hash set), and forget its uses. Returns
    /// the number of events. On failure nothing changes.
    pub(crate) fn record_free(&mut self, backend: &mut B, slot: u32) -> Res<u16, B> {
        let (start, start_queues) = (self.pending.len(), self.order.len());
        let mut events = 0u16;
        let mut last: Option<u64> = None;
        while let Some(u) = self
            .uses
            .iter()
            .filter(|u| u.slot == slot && last.is_none_or(|l| u.stream.into() > l))
            .min_by_key(|u| u.stream.into())
            .copied()
        {
            last = Some(u.stream.into());
            if let Err(e) = self.queue_one(backend, slot, u.stream) {
                self.unwind(backend, start, start_queues);
                return Err(e);
            }
            events += 1;
        }
        self.drop_uses(slot);
        Ok(events)
    }

    /// Record one event on `stream` for `slot` and queue it.
    fn queue_one(&mut self, backend: &mut B, slot: u32, stream: B::Stream) -> Res<(), B> {
        let event = match self.idle.pop() {
            Some(ev) => ev,
            None => backend.event_create().map_err(Error::Backend)?,
        };
        if let Err(e) = backend.event_record(&event, stream) {
            self.recycle(backend, event);
            return Err(Error::Backend(e));
        }
        let key: u64 = stream.into();
        if !self.order.contains(&key) && self.order.push(key).is_err() {
            self.recycle(backend, event);
            return Err(Error::EventQueueFull { capacity: E });
        }
        if let Err(pe) = self.pending.push(PendingEvent {
            event,
            slot,
            stream,
        }) {
            self.recycle(backend, pe.event);
            return Err(Error::EventQueueFull { capacity: E });
        }
        Ok(())
    }

    /// Hand memory freed on `from` to `to` (the compact policy's
    /// cross-stream reuse): record an event on `from` and make `to` wait for
    /// it on the device; the event goes back to the idle ones at once (the
    /// wait took it as recorded). On failure nothing changes.
    pub(crate) fn hand_over(
        &mut self,
        backend: &mut B,
        from: B::Stream,
        to: B::Stream,
    ) -> Res<(), B> {
        let event = match self.idle.pop() {
            Some(ev) => ev,
            None => backend.event_create().map_err(Error::Backend)?,
        };
        let r = backend
            .event_record(&event, from)
            .and_then(|()| backend.stream_wait_event(to, &event));
        self.recycle(backend, event);
        r.map_err(Error::Backend)
    }

    /// Drop the events queued after the first `len` and the queues created
    /// after the first `queues`.
    fn unwind(&mut self, backend: &mut B, len: usize, queues: usize) {
        while self.pending.len() > len {
            if let Some(pe) = self.pending.pop() {
                self.recycle(backend, pe.event);
            }
        }
        self.order.truncate(queues);
    }

    /// Keep an event for reuse.
    fn recycle(&mut self, backend: &mut B, event: B::Event) {
        if let Err(event) = self.idle.push(event) {
            // Unreachable while events in existence <= E; destroy rather than leak.
            let _ = backend.event_destroy(&event);
        }
    }

    /// The position in `pending` of the first event of stream `key` at or after `from`.
    fn next_of_stream(&self, key: u64, from: usize) -> Option<usize> {
        (from..self.pending.len()).find(|&k| self.pending[k].stream.into() == key)
    }

    /// One step of `process_events`: queue by queue (in the order the queues
    /// were created), events in FIFO order until the first that is still
    /// pending. Returns the slot of the next completed event (dequeued), or
    /// `None` when the sweep is over. The order matters for the accumulated
    /// `inactive_split*` counters when neighbouring blocks complete together;
    /// it is the reference model's (PyTorch's is its hash map's order).
    pub(crate) fn next_ready(
        &mut self,
        backend: &mut B,
        sweep: &mut Sweep,
    ) -> Result<Option<u32>, B::Error> {
        while let Some(&key) = self.order.get(sweep.queue) {
            if let Some(at) = self.next_of_stream(key, sweep.from) {
                if backend.event_query(&self.pending[at].event)? == EventStatus::Ready {
                    let pe = self.pending.remove(at);
                    self.recycle(backend, pe.event);
                    sweep.from = at;
                    return Ok(Some(pe.slot));
                }
            }
            // This queue is done for this sweep: drop it if it is empty.
            if self.next_of_stream(key, 0).is_none() {
                self.order.remove(sweep.queue);
            } else {
                sweep.queue += 1;
            }
            sweep.from = 0;
        }
        Ok(None)
    }

    /// One step of `synchronize_and_free_events`: wait for the oldest event of
    /// the oldest queue whose block `wanted` accepts, and dequeue it. Returns
    /// its slot, `None` when no such event is left.
    pub(crate) fn next_synchronized(
        &mut self,
        backend: &mut B,
        wanted: impl Fn(u32) -> bool,
    ) -> Result<Option<u32>, B::Error> {
        let mut q = 0;
        while let Some(&key) = self.order.get(q) {
            let at = (0..self.pending.len())
                .find(|&k| self.pending[k].stream.into() == key && wanted(self.pending[k].slot));
            if let Some(at) = at {
                backend.event_synchronize(&self.pending[at].event)?;
                let pe = self.pending.remove(at);
                self.recycle(backend, pe.event);
                return Ok(Some(pe.slot));
            }
            if self.next_of_stream(key, 0).is_none() {
                self.order.remove(q);
            } else {
                q += 1;
            }
        }
        Ok(None)
    }

    /// Destroy the idle events (one that fails to be destroyed stays idle).
    pub(crate) fn release_idle(&mut self, backend: &mut B) -> Result<(), B::Error> {
        while let Some(event) = self.idle.last() {
            backend.event_destroy(event)?;
            self.idle.pop();
        }
        Ok(())
    }

    /// Each block's event count equals its queued events; the queue order
    /// lists exactly the streams with queued events, once each; stream uses
    /// belong to allocated blocks marked as having them.
    pub(crate) fn verify(
        &self,
        slots: &[BlockSlot],
        high_water: u32,
    ) -> Result<(), InvariantViolation> {
        let slot = |i: u32, what| {
            slots
                .get(i as usize)
                .filter(|_| i < high_water)
                .ok_or(fail(what, Some(i), 0, 1))
        };
        for pe in self.pending.iter() {
            let s = slot(pe.slot, "event queue: event of a slot out of range")?;
            let queued = self.pending.iter().filter(|q| q.slot == pe.slot).count();
            expect(
                "event count: a block's count != its queued events",
                Some(pe.slot),
                queued as i64,
                s.events as i64,
            )?;
        }
        let counted: i64 = slots[..high_water as usize]
            .iter()
            .map(|s| s.events as i64)
            .sum();
        expect(
            "event count: queued events != the blocks' counts",
            None,
            self.pending.len() as i64,
            counted,
        )?;
        for (k, q) in self.order.iter().enumerate() {
            let has_events = self.pending.iter().any(|pe| pe.stream.into() == *q);
            if !has_events || self.order[..k].contains(q) {
                return Err(fail(
                    "event queue order: lists a stream without events, or twice",
                    None,
                    0,
                    *q as i64,
                ));
            }
        }
        for pe in self.pending.iter() {
            ensure(
                self.order.contains(&pe.stream.into()),
                "event queue order: misses the stream of a queued event",
                Some(pe.slot),
            )?;
        }
        for u in self.uses.iter() {
            let s = slot(u.slot, "stream uses: use of a slot out of range")?;
            ensure(
                s.flags.contains(Flags::HAS_USES)
                    && s.flags.intersects(Flags::ALLOCATED | Flags::DEFERRED),
                "stream uses: use of a block that is neither allocated nor deferred",
                Some(u.slot),
            )?;
        }
        Ok(())
    }

    /// Test support: the queue order.
    #[cfg(test)]
    pub(crate) fn order_mut(&mut self) -> &mut heapless::Vec<u64, E> {
        &mut self.order
    }
}
