//! Memory history (PyTorch's `_record_memory_history`): [`TraceEntry`]s
//! recorded at the points where PyTorch records them, kept in a ring buffer
//! over storage the caller provides ([`History`]; when full, the oldest
//! entry is overwritten and counted as dropped), and the observers that see
//! them: [`TraceTracker`]s get every entry, [`OutOfMemoryObserver`]s every
//! final out-of-memory.

use crate::private_pool::MempoolId;
use core::fmt;

/// What a trace entry records (PyTorch's `TraceEntry::Action`, and the
/// older `USER_DEFINED` for annotations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TraceAction {
    /// A block was handed out (`size`: the request, unrounded).
    Alloc,
    /// A block was freed by its user (`size`: its request).
    FreeRequested,
    /// A freed block returned to the cache, after its stream uses completed.
    FreeCompleted,
    /// A segment came from the device (`size`: the segment).
    SegmentAlloc,
    /// A segment is about to go back to the device.
    SegmentFree,
    /// Pages of an expandable segment were mapped.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// A snapshot was taken (`size`: the active bytes it shows).
    Snapshot,
    /// An allocation failed for good (`addr`: the device's free bytes,
    /// `size`: the rounded request).
    Oom,
    /// A caller's annotation (`context`: its id).
    UserDefined,
}

impl TraceAction {
    /// Every action, in PyTorch's order.
    pub const ALL: [TraceAction; 10] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
        TraceAction::UserDefined,
    ];

    /// PyTorch's name in a snapshot (`"alloc"`, `"free_requested"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
            TraceAction::UserDefined => "user_defined",
        }
    }

    /// The action of a name ([`as_str`](Self::as_str)).
    pub fn parse(name: &str) -> Option<TraceAction> {
        TraceAction::ALL.into_iter().find(|a| a.as_str() == name)
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for TraceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of actions (PyTorch's `skip_actions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceActions(u16);

impl TraceActions {
    /// No action.
    pub const NONE: TraceActions = TraceActions(0);

    /// This set and `a`.
    pub const fn with(self, a: TraceAction) -> TraceActions {
        TraceActions(self.0 | a.bit())
    }

    /// Whether `a` is in the set.
    pub const fn contains(self, a: TraceAction) -> bool {
        self.0 & a.bit() != 0
    }
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The device's ordinal.
    pub device: u32,
    /// The block or segment address; the device's free bytes for
    /// [`TraceAction::Oom`]; 0 for a snapshot or an annotation.
    pub addr: u64,
    /// Bytes (see [`TraceAction`] for which).
    pub size: u64,
    /// The stream (raw handle value; 0 for a snapshot).
    pub stream: u64,
    /// When, in microseconds, from the backend's clock
    /// ([`DeviceBackend::time_us`](crate::DeviceBackend::time_us)).
    pub time_us: u64,
    /// The caller's context id in force when it was recorded
    /// ([`DeviceAllocator::set_trace_context`](crate::DeviceAllocator::set_trace_context));
    /// for an annotation, its id.
    pub context: u64,
    /// The pool the block or segment belongs to (PyTorch's
    /// `TraceEntry::mempool_`: a snapshot shows it as `pool_id` from torch
    /// 2.12 on); the request's pool for [`TraceAction::Oom`], the default
    /// pools' `(0, 0)` for a snapshot or an annotation.
    pub pool: MempoolId,
}

impl TraceEntry {
    /// A placeholder (what storage starts as).
    pub const EMPTY: TraceEntry = TraceEntry {
        action: TraceAction::Snapshot,
        device: 0,
        addr: 0,
        size: 0,
        stream: 0,
        time_us: 0,
        context: 0,
        pool: MempoolId::DEFAULT,
    };

    /// An entry (for trackers' tests and for tools that rebuild history).
    pub const fn new(action: TraceAction, addr: u64, size: u64, stream: u64) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream,
            ..TraceEntry::EMPTY
        }
    }
}

/// Storage for a history: any `AsRef<[TraceEntry]> + AsMut<[TraceEntry]>`
/// (an array, a boxed slice). Its length is the most entries kept.
pub trait HistoryStorage: AsRef<[TraceEntry]> + AsMut<[TraceEntry]> {}

impl<T: AsRef<[TraceEntry]> + AsMut<[TraceEntry]>> HistoryStorage for T {}

/// The storage of an allocator without history: room for nothing.
pub type NoHistory = [TraceEntry; 0];

/// A ring buffer of trace entries (PyTorch's `RingBuffer<TraceEntry>`).
pub struct History<H> {
    storage: H,
    /// PyTorch's `max_entries` (at most the storage's length).
    max_entries: usize,
    len: usize,
    /// Where the next entry goes once the buffer is full.
    next: usize,
    enabled: bool,
    skip: TraceActions,
    dropped: u64,
}

impl<H: HistoryStorage> History<H> {
    /// An empty, disabled history over `storage`.
    pub const fn new(storage: H) -> Self {
        History {
            storage,
            max_entries: usize::MAX,
            len: 0,
            next: 0,
            enabled: false,
            skip: TraceActions::NONE,
            dropped: 0,
        }
    }

    /// The most entries it keeps now.
    pub fn capacity(&self) -> usize {
        self.max_entries.min(self.storage.as_ref().len())
    }

    /// Whether entries are being recorded.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// PyTorch's `recordHistory`: turn recording on or off, keep at most
    /// `max_entries` (at least 1, at most the storage), skip `skip`.
    /// Turning it off, or `clear`, empties the buffer (so take a snapshot
    /// before turning history off, as with PyTorch).
    pub fn configure(
        &mut self,
        enabled: bool,
        max_entries: usize,
        clear: bool,
        skip: TraceActions,
    ) {
        self.enabled = enabled;
        self.max_entries = max_entries.max(1);
        self.skip = skip;
        if !enabled || clear {
            self.clear();
        }
    }

    /// Forget every entry (and the dropped count).
    pub fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
        self.dropped = 0;
    }

    /// Add an entry if recording and not skipped; when full, it replaces the
    /// oldest, which counts as dropped.
    #[inline]
    pub fn push(&mut self, e: TraceEntry) {
        if !self.enabled || self.skip.contains(e.action) {
            return;
        }
        let cap = self.capacity();
        let slots = self.storage.as_mut();
        if cap == 0 {
            self.dropped += 1;
        } else if self.len < cap {
            slots[self.len] = e;
            self.len += 1;
        } else {
            slots[self.next] = e;
            self.next = (self.next + 1) % cap;
            self.dropped += 1;
        }
    }

    /// Entries kept now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries overwritten (or refused for lack of room) since the last clear.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> HistoryEntries<'_> {
        let kept = &self.storage.as_ref()[..self.len];
        let (newer, older) = kept.split_at(self.next.min(kept.len()));
        HistoryEntries {
            first: older.iter(),
            second: newer.iter(),
        }
    }
}

/// The entries of a [`History`], oldest first.
#[derive(Clone, Debug)]
pub struct HistoryEntries<'a> {
    first: core::slice::Iter<'a, TraceEntry>,
    second: core::slice::Iter<'a, TraceEntry>,
}

impl<'a> Iterator for HistoryEntries<'a> {
    type Item = &'a TraceEntry;
    fn next(&mut self) -> Option<&'a TraceEntry> {
        self.first.next().or_else(|| self.second.next())
    }
}

/// Sees every trace entry as it is recorded (PyTorch's
/// `AllocatorTraceTracker`), whether or not history is on, before the skip
/// filter. Called while the allocator is in use (under the lock of a
/// `CachingAllocator`, as PyTorch calls its trackers): a call from it back
/// into a `CachingAllocator` whose lock is held (its own, say) fails with
/// `Error::CalledFromCallback` (with `std`; without it, it deadlocks), and
/// a panic in it fails a `CachingAllocator`'s
/// device (its metadata may be half-updated then). Any
/// `Fn(&TraceEntry) + Sync` is one.
pub trait TraceTracker: Sync {
    /// An entry was recorded.
    fn trace(&self, entry: &TraceEntry);
}

impl<F: Fn(&TraceEntry) + Sync> TraceTracker for F {
    fn trace(&self, entry: &TraceEntry) {
        self(entry)
    }
}

/// Told of every final out-of-memory (PyTorch's `OutOfMemoryObserver`),
/// after the whole ladder failed and before the error returns: the device,
/// the segment size that could not be had, the memory limit if one is set
/// (else the device's total), and the device's free bytes. Not for the
/// 1 EiB refusal, nor when a retry succeeds. A `CachingAllocator` calls it
/// once its lock is released (PyTorch's order), so it may call back into
/// the allocator, on that device too; a bare `DeviceAllocator` calls it at
/// the failing allocation. Any `Fn(u32, u64, u64, u64) + Sync` is one.
pub trait OutOfMemoryObserver: Sync {
    /// An allocation failed for good.
    fn out_of_memory(&self, device: u32, alloc_size: u64, device_total: u64, device_free: u64);

    /// The same out-of-memory, whole: PyTorch's numbers, and why it ran
    /// out with the bytes behind the verdict. Called right before
    /// [`out_of_memory`](Self::out_of_memory); does nothing unless
    /// implemented.
    fn out_of_memory_explained(&self, report: &crate::OomReport, cause: &crate::OomCause) {
        let _ = (report, cause);
    }

    /// The rejection policy (`throw_on_cudamalloc_oom`) refused a request
    /// before any device call (torch's `OomRejectionObserver`):
    /// `alloc_size` the segment it would have made, `total_allocated` the
    /// bytes reserved then, `device_total` the device's memory. Rejections
    /// are not out-of-memory errors to the methods above: only this one is
    /// called. Does nothing unless implemented.
    fn oom_rejected(&self, device: u32, alloc_size: u64, total_allocated: u64, device_total: u64) {
        let _ = (device, alloc_size, total_allocated, device_total);
    }

    /// The same rejection, whole (its report and verdict, class
    /// [`Rejected`](crate::OomClass::Rejected)); called right before
    /// [`oom_rejected`](Self::oom_rejected). Does nothing unless implemented.
    fn oom_rejected_explained(&self, report: &crate::OomReport, cause: &crate::OomCause) {
        let _ = (report, cause);
    }
}

impl<F: Fn(u32, u64, u64, u64) + Sync> OutOfMemoryObserver for F {
    fn out_of_memory(&self, device: u32, alloc_size: u64, device_total: u64, device_free: u64) {
        self(device, alloc_size, device_total, device_free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(size: u64) -> TraceEntry {
        TraceEntry::new(TraceAction::Alloc, 0, size, 0)
    }

    #[test]
    fn the_ring_overwrites_the_oldest_and_counts_drops() {
        let mut h = History::new([TraceEntry::EMPTY; 4]);
        h.push(e(1)); // off: nothing
        assert!(h.is_empty());
        h.configure(true, usize::MAX, false, TraceActions::NONE);
        for s in 1..=6 {
            h.push(e(s));
        }
        let sizes: std::vec::Vec<u64> = h.entries().map(|e| e.size).collect();
        assert_eq!(sizes, [3, 4, 5, 6]);
        assert_eq!(h.dropped(), 2);
        h.configure(true, 2, true, TraceActions::NONE.with(TraceAction::Oom));
        for s in 7..=9 {
            h.push(e(s));
        }
        h.push(TraceEntry::new(TraceAction::Oom, 0, 1, 0)); // skipped
        let sizes: std::vec::Vec<u64> = h.entries().map(|e| e.size).collect();
        assert_eq!(sizes, [8, 9]);
        h.configure(false, 2, false, TraceActions::NONE); // off clears, as PyTorch
        assert!(h.is_empty());
    }

    #[test]
    fn action_names_round_trip() {
        for a in TraceAction::ALL {
            assert_eq!(TraceAction::parse(a.as_str()), Some(a));
        }
        assert_eq!(TraceAction::parse("nope"), None);
    }
}
