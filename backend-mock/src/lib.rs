//! # cachealloc-mock
//!
//! A simulated device for [`cachealloc_core`]:
//!
//! - **addresses** from a bump pointer: every segment starts at the next
//!   multiple of 2 MiB above the end of the previous one, and addresses are
//!   never reused, so replays are deterministic and comparable anywhere;
//! - an optional **capacity**: `malloc` fails with out-of-memory when the
//!   bytes held would exceed it;
//! - **streams** whose queued work finishes at the next [`MockDevice::sync`]
//!   of that stream (or of all streams); an event recorded on a stream
//!   completes at the first such sync after the record;
//! - **counters** of every call, the bytes still held and the live events
//!   (for leak checks), and the log of every successful malloc;
//! - **fault injection**: make the n-th call (of one kind, or of any kind)
//!   fail, or make the next mallocs return addresses of the test's choosing
//!   ([`MockDevice::place_next_malloc`], e.g. a range it already handed out).
//!
//! ```
//! use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
//! use cachealloc_mock::MockDevice;
//!
//! let mut a = DeviceAllocator::new(
//!     MockDevice::with_capacity(64 << 20), vec![BlockSlot::VACANT; 256], Config::DEFAULT);
//! let x = a.malloc(4096, 1)?;
//! a.record_stream(x.id.unwrap(), 0)?;
//! a.free(x.id.unwrap())?;                    // waits for stream 0
//! assert_eq!(a.stats().active.all().current, 1);
//! a.backend_mut().sync(Some(0));             // stream 0's work finishes
//! let _y = a.malloc(512, 1)?;                // malloc notices the event
//! assert_eq!(a.stats().active.all().current, 1);
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```

use cachealloc_core::{DeviceBackend, DevicePtr, EventStatus, MallocError, MemInfo};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Where the simulated device's first segment starts (2 MiB aligned).
pub const DEVICE_BASE: u64 = 0x7F00_0000_0000;
const SEGMENT_ALIGN: u64 = 2 << 20;

/// The kinds of backend call, for counters and fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CallKind {
    /// `malloc`
    Malloc,
    /// `free`
    Free,
    /// `event_create`
    EventCreate,
    /// `event_record`
    EventRecord,
    /// `event_query`
    EventQuery,
    /// `event_synchronize`
    EventSynchronize,
    /// `event_destroy`
    EventDestroy,
    /// `mem_info`
    MemInfo,
}

impl CallKind {
    /// Every kind.
    pub const ALL: [CallKind; 8] = [
        CallKind::Malloc,
        CallKind::Free,
        CallKind::EventCreate,
        CallKind::EventRecord,
        CallKind::EventQuery,
        CallKind::EventSynchronize,
        CallKind::EventDestroy,
        CallKind::MemInfo,
    ];
}

/// The mock's errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MockError {
    /// A failure planted with [`MockDevice::fail_call`] or [`MockDevice::fail_nth`].
    Injected {
        /// The call that failed.
        kind: CallKind,
        /// Its index among all calls.
        call: u64,
    },
    /// `free` of an address or size that is not a live segment: an allocator bug.
    InvalidFree {
        /// The address.
        ptr: DevicePtr,
        /// The size given.
        size: u64,
    },
    /// An event that was destroyed (or never created).
    InvalidEvent,
}

impl fmt::Display for MockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MockError::Injected { kind, call } => {
                write!(f, "injected failure of {kind:?} (call {call})")
            }
            MockError::InvalidFree { ptr, size } => {
                write!(f, "free of {ptr} ({size} bytes): not a live segment")
            }
            MockError::InvalidEvent => write!(f, "invalid event"),
        }
    }
}

impl std::error::Error for MockError {}

/// An event of the mock device.
#[derive(Debug, PartialEq, Eq)]
pub struct MockEvent(usize);

#[derive(Clone, Copy, Debug, Default)]
struct EventState {
    /// (stream, that stream's epoch, the global epoch) at the last record.
    recorded: Option<(u64, u64, u64)>,
    /// Completed by a host wait.
    done: bool,
}

/// Counts of calls, by kind and in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `malloc` calls (including failed ones).
    pub malloc: u64,
    /// `malloc` calls that failed with out-of-memory.
    pub malloc_oom: u64,
    /// `free` calls.
    pub free: u64,
    /// `event_create` calls.
    pub event_create: u64,
    /// `event_record` calls.
    pub event_record: u64,
    /// `event_query` calls.
    pub event_query: u64,
    /// `event_synchronize` calls.
    pub event_synchronize: u64,
    /// `event_destroy` calls.
    pub event_destroy: u64,
    /// `mem_info` calls.
    pub mem_info: u64,
    /// All calls.
    pub total: u64,
}

#[derive(Clone, Copy, Debug)]
enum FaultAt {
    AnyCall(u64),
    Kind(CallKind, u64),
}

/// The simulated device. Streams are plain `u64`s (0 is the default stream).
#[derive(Debug)]
pub struct MockDevice {
    next_addr: u64,
    /// Addresses the next mallocs return instead of the bump pointer's.
    placements: std::collections::VecDeque<u64>,
    capacity: Option<u64>,
    held: u64,
    live: BTreeMap<u64, u64>,
    malloc_log: Vec<(DevicePtr, u64)>,
    stream_epoch: HashMap<u64, u64>,
    global_epoch: u64,
    events: Vec<Option<EventState>>,
    free_events: Vec<usize>,
    live_events: usize,
    counters: Counters,
    per_kind: HashMap<CallKind, u64>,
    faults: Vec<(FaultAt, bool)>,
    ordinal: u32,
    /// The memory history's clock: one tick per reading.
    clock: u64,
}

impl Default for MockDevice {
    fn default() -> Self {
        MockDevice::new(None)
    }
}

impl MockDevice {
    /// A device with `capacity` bytes (`None`: unlimited).
    pub fn new(capacity: Option<u64>) -> Self {
        MockDevice {
            next_addr: DEVICE_BASE,
            placements: std::collections::VecDeque::new(),
            capacity,
            held: 0,
            live: BTreeMap::new(),
            malloc_log: Vec::new(),
            stream_epoch: HashMap::new(),
            global_epoch: 0,
            events: Vec::new(),
            free_events: Vec::new(),
            live_events: 0,
            counters: Counters::default(),
            per_kind: HashMap::new(),
            faults: Vec::new(),
            ordinal: 0,
            clock: 0,
        }
    }

    /// A device with `bytes` of memory.
    pub fn with_capacity(bytes: u64) -> Self {
        MockDevice::new(Some(bytes))
    }

    /// Unlimited memory.
    pub fn unlimited() -> Self {
        MockDevice::new(None)
    }

    /// Start handing out addresses at `base` (rounded up to 2 MiB): gives
    /// the devices of a multi-device setup disjoint address ranges.
    pub fn with_base(mut self, base: u64) -> Self {
        self.next_addr = base.div_ceil(SEGMENT_ALIGN) * SEGMENT_ALIGN;
        self
    }

    /// Set the device ordinal reported in OOM messages.
    pub fn with_ordinal(mut self, ordinal: u32) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// The capacity (`None`: unlimited).
    pub fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// The host waits for `stream` (all streams if `None`): its queued work,
    /// and every event recorded on it so far, complete.
    pub fn sync(&mut self, stream: Option<u64>) {
        match stream {
            Some(s) => *self.stream_epoch.entry(s).or_insert(0) += 1,
            None => self.global_epoch += 1,
        }
    }

    /// Bytes held by the allocator (0 after everything was freed and the cache emptied).
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// Segments held.
    pub fn live_segments(&self) -> usize {
        self.live.len()
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.live_events
    }

    /// Call counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Every successful malloc, in order: (base, size).
    pub fn malloc_log(&self) -> &[(DevicePtr, u64)] {
        &self.malloc_log
    }

    /// Which malloc (0-based, counting every successful malloc of the run)
    /// created the segment holding `ptr`, and the offset of `ptr` in it.
    pub fn locate(&self, ptr: DevicePtr) -> Option<(usize, u64)> {
        let k = self
            .malloc_log
            .partition_point(|(base, _)| base.0 <= ptr.0)
            .checked_sub(1)?;
        let (base, size) = self.malloc_log[k];
        (ptr.0 - base.0 < size).then_some((k, ptr.0 - base.0))
    }

    /// Make the next successful malloc return `addr` (placements queue up),
    /// whatever the device holds: a buggy driver, for the allocator's
    /// contract checks. A placement at the base of a held segment replaces
    /// that segment's record. Placed segments are not in [`malloc_log`]
    /// order (`locate` may miss them).
    ///
    /// [`malloc_log`]: MockDevice::malloc_log
    pub fn place_next_malloc(&mut self, addr: u64) {
        self.placements.push_back(addr);
    }

    /// Make the `n`-th backend call from now (0 = the next one), of any
    /// kind, fail. A failed `malloc` fails with an error, not out-of-memory.
    pub fn fail_call(&mut self, n: u64) {
        self.faults
            .push((FaultAt::AnyCall(self.counters.total + n), false));
    }

    /// Make the `n`-th call of `kind` from now (0 = the next one) fail.
    pub fn fail_nth(&mut self, kind: CallKind, n: u64) {
        let base = self.per_kind.get(&kind).copied().unwrap_or(0);
        self.faults.push((FaultAt::Kind(kind, base + n), false));
    }

    /// Make the `n`-th `malloc` from now report out-of-memory whatever the capacity.
    pub fn fail_nth_malloc_oom(&mut self, n: u64) {
        let base = self.per_kind.get(&CallKind::Malloc).copied().unwrap_or(0);
        self.faults
            .push((FaultAt::Kind(CallKind::Malloc, base + n), true));
    }

    /// Forget planted failures that have not fired.
    pub fn clear_faults(&mut self) {
        self.faults.clear();
    }

    /// Count a call; `Some((error, oom))` if a planted failure fires.
    fn call(&mut self, kind: CallKind) -> Option<(MockError, bool)> {
        let total = self.counters.total;
        self.counters.total += 1;
        let c = &mut self.counters;
        match kind {
            CallKind::Malloc => c.malloc += 1,
            CallKind::Free => c.free += 1,
            CallKind::EventCreate => c.event_create += 1,
            CallKind::EventRecord => c.event_record += 1,
            CallKind::EventQuery => c.event_query += 1,
            CallKind::EventSynchronize => c.event_synchronize += 1,
            CallKind::EventDestroy => c.event_destroy += 1,
            CallKind::MemInfo => c.mem_info += 1,
        }
        let nth = self.per_kind.entry(kind).or_insert(0);
        let this = *nth;
        *nth += 1;
        let pos = self.faults.iter().position(|(at, _)| match *at {
            FaultAt::AnyCall(n) => n == total,
            FaultAt::Kind(k, n) => k == kind && n == this,
        })?;
        let (_, oom) = self.faults.swap_remove(pos);
        Some((MockError::Injected { kind, call: total }, oom))
    }

    fn event(&mut self, e: &MockEvent) -> Result<&mut EventState, MockError> {
        self.events
            .get_mut(e.0)
            .and_then(Option::as_mut)
            .ok_or(MockError::InvalidEvent)
    }

    fn is_done(&self, st: &EventState) -> bool {
        match st.recorded {
            None => true,
            Some((s, epoch, gepoch)) => {
                st.done
                    || self.stream_epoch.get(&s).copied().unwrap_or(0) != epoch
                    || self.global_epoch != gepoch
            }
        }
    }
}

impl DeviceBackend for MockDevice {
    type Stream = u64;
    type Event = MockEvent;
    type Error = MockError;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<MockError>> {
        if let Some((e, oom)) = self.call(CallKind::Malloc) {
            if oom {
                self.counters.malloc_oom += 1;
                return Err(MallocError::OutOfMemory);
            }
            return Err(MallocError::Other(e));
        }
        if let Some(cap) = self.capacity {
            if self.held.saturating_add(size) > cap {
                self.counters.malloc_oom += 1;
                return Err(MallocError::OutOfMemory);
            }
        }
        if let Some(addr) = self.placements.pop_front() {
            self.held += size;
            self.live.insert(addr, size);
            self.malloc_log.push((DevicePtr(addr), size));
            return Ok(DevicePtr(addr));
        }
        let span = size
            .div_ceil(SEGMENT_ALIGN)
            .max(1)
            .saturating_mul(SEGMENT_ALIGN);
        let Some(next) = self.next_addr.checked_add(span) else {
            self.counters.malloc_oom += 1;
            return Err(MallocError::OutOfMemory);
        };
        let ptr = DevicePtr(self.next_addr);
        self.next_addr = next;
        self.held += size;
        self.live.insert(ptr.0, size);
        self.malloc_log.push((ptr, size));
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), MockError> {
        if let Some((e, _)) = self.call(CallKind::Free) {
            return Err(e);
        }
        match self.live.get(&ptr.0) {
            Some(&s) if s == size => {
                self.live.remove(&ptr.0);
                self.held -= size;
                Ok(())
            }
            _ => Err(MockError::InvalidFree { ptr, size }),
        }
    }

    fn event_create(&mut self) -> Result<MockEvent, MockError> {
        if let Some((e, _)) = self.call(CallKind::EventCreate) {
            return Err(e);
        }
        self.live_events += 1;
        let st = Some(EventState::default());
        if let Some(i) = self.free_events.pop() {
            self.events[i] = st;
            Ok(MockEvent(i))
        } else {
            self.events.push(st);
            Ok(MockEvent(self.events.len() - 1))
        }
    }

    fn event_record(&mut self, event: &MockEvent, stream: u64) -> Result<(), MockError> {
        if let Some((e, _)) = self.call(CallKind::EventRecord) {
            return Err(e);
        }
        let epoch = self.stream_epoch.get(&stream).copied().unwrap_or(0);
        let g = self.global_epoch;
        let st = self.event(event)?;
        st.recorded = Some((stream, epoch, g));
        st.done = false;
        Ok(())
    }

    fn event_query(&mut self, event: &MockEvent) -> Result<EventStatus, MockError> {
        if let Some((e, _)) = self.call(CallKind::EventQuery) {
            return Err(e);
        }
        let st = *self.event(event)?;
        Ok(if self.is_done(&st) {
            EventStatus::Ready
        } else {
            EventStatus::Pending
        })
    }

    fn event_synchronize(&mut self, event: &MockEvent) -> Result<(), MockError> {
        if let Some((e, _)) = self.call(CallKind::EventSynchronize) {
            return Err(e);
        }
        self.event(event)?.done = true;
        Ok(())
    }

    fn event_destroy(&mut self, event: &MockEvent) -> Result<(), MockError> {
        if let Some((e, _)) = self.call(CallKind::EventDestroy) {
            return Err(e);
        }
        self.event(event)?;
        self.events[event.0] = None;
        self.free_events.push(event.0);
        self.live_events -= 1;
        Ok(())
    }

    /// A logical clock: 1, 2, 3, ... (deterministic histories).
    fn time_us(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn mem_info(&mut self) -> Result<MemInfo, MockError> {
        if let Some((e, _)) = self.call(CallKind::MemInfo) {
            return Err(e);
        }
        let total = self.capacity.unwrap_or(u64::MAX);
        Ok(MemInfo {
            free: total - self.held,
            total,
        })
    }

    fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_addresses_are_2mib_aligned_and_never_reused() {
        let mut d = MockDevice::unlimited();
        let a = d.malloc(512).unwrap();
        let b = d.malloc(21 << 20).unwrap();
        d.free(a, 512).unwrap();
        let c = d.malloc(512).unwrap();
        assert_eq!(a.0, DEVICE_BASE);
        assert_eq!(b.0, DEVICE_BASE + (2 << 20));
        assert_eq!(c.0, DEVICE_BASE + (2 << 20) + (22 << 20));
        assert_eq!(d.locate(DevicePtr(b.0 + 5)), Some((1, 5)));
    }

    #[test]
    fn events_complete_at_the_next_sync_after_record() {
        let mut d = MockDevice::unlimited();
        let e = d.event_create().unwrap();
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Ready);
        d.event_record(&e, 1).unwrap();
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Pending);
        d.sync(Some(2));
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Pending);
        d.sync(Some(1));
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Ready);
        d.event_record(&e, 1).unwrap();
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Pending);
        d.sync(None);
        assert_eq!(d.event_query(&e).unwrap(), EventStatus::Ready);
        d.event_destroy(&e).unwrap();
        assert_eq!(d.live_events(), 0);
    }

    #[test]
    fn faults_fire_once_at_their_index() {
        let mut d = MockDevice::with_capacity(4 << 20);
        d.fail_nth(CallKind::Malloc, 1);
        assert!(d.malloc(2 << 20).is_ok());
        assert!(matches!(
            d.malloc(2 << 20),
            Err(MallocError::Other(MockError::Injected { .. }))
        ));
        assert!(d.malloc(2 << 20).is_ok());
        assert!(d.malloc(2 << 20).unwrap_err().is_out_of_memory());
        d.fail_call(0);
        assert!(d.mem_info().is_err());
        assert!(d.mem_info().is_ok());
        assert_eq!(d.counters().total, 6);
    }
}
