//! The memory history and its observers, PyTorch's way: `record_history`,
//! annotations, trace trackers, out-of-memory observers, and `snapshot`
//! (segments, history, settings). Entries are recorded by `record` at the
//! points PyTorch records them (in `malloc.rs`, `split.rs`, `free.rs`,
//! `release.rs`).

use super::DeviceAllocator;
use crate::arena::BlockSlot;
use crate::backend::DeviceBackend;
use crate::history::{
    History, HistoryStorage, OutOfMemoryObserver, TraceAction, TraceActions, TraceEntry,
    TraceTracker,
};
use crate::private_pool::MempoolId;
use crate::snapshot::{AllocatorSettings, BlockState, Snapshot};
use crate::sync::in_callback;

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// PyTorch's `recordHistory`: start (or stop) recording trace entries,
    /// keeping at most `max_entries` (and at most the history storage) and
    /// leaving out `skip`. Stopping, or `clear`, empties the history, as in
    /// PyTorch: take the snapshot first.
    pub fn record_history(
        &mut self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) {
        self.history.configure(enabled, max_entries, clear, skip);
        self.update_tracing();
    }

    /// Whether anything sees trace entries (history on, or a tracker): the
    /// one flag the hot path tests.
    fn update_tracing(&mut self) {
        self.tracing = self.history.is_enabled() || !self.trackers.is_empty();
    }

    /// Whether history is being recorded.
    pub fn is_history_enabled(&self) -> bool {
        self.history.is_enabled()
    }

    /// The history.
    pub fn history(&self) -> &History<H> {
        &self.history
    }

    /// The caller's context id (a stack, a step, a line of a trace: the
    /// allocator does not look at it) carried by the entries recorded from
    /// now on.
    pub fn set_trace_context(&mut self, context: u64) {
        self.trace_context = context;
    }

    /// Record a caller's annotation (a `user_defined` entry with `id` as its
    /// context).
    pub fn record_annotation(&mut self, id: u64) {
        let saved = core::mem::replace(&mut self.trace_context, id);
        self.record(TraceAction::UserDefined, 0, 0, 0, 0);
        self.trace_context = saved;
    }

    /// Attach a trace tracker (at most 4); gives it back if full.
    pub fn attach_trace_tracker(
        &mut self,
        tracker: &'static dyn TraceTracker,
    ) -> Result<(), &'static dyn TraceTracker> {
        self.trackers.push(tracker)?;
        self.update_tracing();
        Ok(())
    }

    /// Attach an out-of-memory observer (at most 4); gives it back if full.
    pub fn attach_out_of_memory_observer(
        &mut self,
        observer: &'static dyn OutOfMemoryObserver,
    ) -> Result<(), &'static dyn OutOfMemoryObserver> {
        self.oom_observers.push(observer)
    }

    /// PyTorch's `snapshot()`: records a `snapshot` entry (its size: the
    /// active bytes of the segments), then gives the segments with their
    /// blocks, the history and the settings, all without allocating.
    pub fn snapshot(&mut self) -> Snapshot<'_, B::Stream> {
        let active: u64 = self
            .segments()
            .flat_map(|s| s.blocks())
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.size)
            .sum();
        self.record(TraceAction::Snapshot, 0, active, 0, 0);
        let fragmentation = self.fragmentation(B::Stream::from(0));
        Snapshot {
            fragmentation,
            device: self.backend.ordinal(),
            segments: self.segments(),
            history: self.history.entries(),
            dropped: self.history.dropped(),
            settings: AllocatorSettings::of(self.config),
        }
    }

    /// Record an entry: trackers first (all of them see it), then the
    /// history (if on and the action is not skipped). With nothing
    /// listening, one test of a flag. `owner`: the pool (0 the default
    /// pools, else the private pool's owner number), which the entry names
    /// by its id.
    #[inline(always)]
    pub(super) fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u64,
        owner: u8,
    ) {
        if self.tracing {
            self.record_now(action, addr, size, stream, owner);
        }
    }

    /// Record an entry about block `i` (its address, last request, stream).
    #[inline(always)]
    pub(super) fn record_block(&mut self, action: TraceAction, i: u32) {
        if self.tracing {
            let s = self.slot(i);
            let (addr, requested, stream, owner) = (s.addr, s.requested, s.stream, s.owner);
            self.record_now(action, addr, requested, stream, owner);
        }
    }

    #[cold]
    #[inline(never)]
    fn record_now(&mut self, action: TraceAction, addr: u64, size: u64, stream: u64, owner: u8) {
        let e = self.entry(action, addr, size, stream, owner);
        for t in self.trackers.iter() {
            in_callback(|| t.trace(&e));
        }
        self.history.push(e);
    }

    /// The entry for an event now.
    fn entry(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u64,
        owner: u8,
    ) -> TraceEntry {
        let pool = match owner {
            0 => MempoolId::DEFAULT,
            o => self.private.get(o).map_or(MempoolId::DEFAULT, |p| p.id),
        };
        TraceEntry {
            action,
            device: self.backend.ordinal(),
            addr,
            size,
            stream,
            time_us: self.backend.time_us(),
            context: self.trace_context,
            pool,
        }
    }

    /// A segment is about to go back to the device: the trackers are told
    /// first (PyTorch's order, which NCCL's deregistration relies on); the
    /// history gets the entry once the device has taken it back (`None`
    /// when nothing is recorded).
    pub(super) fn record_segment_free(
        &mut self,
        addr: u64,
        size: u64,
        stream: u64,
        owner: u8,
    ) -> Option<TraceEntry> {
        if !self.tracing {
            return None;
        }
        let e = self.entry(TraceAction::SegmentFree, addr, size, stream, owner);
        for t in self.trackers.iter() {
            in_callback(|| t.trace(&e));
        }
        Some(e)
    }

    /// The history gets an entry the trackers have seen.
    pub(super) fn keep(&mut self, e: Option<TraceEntry>) {
        if let Some(e) = e {
            self.history.push(e);
        }
    }
}
