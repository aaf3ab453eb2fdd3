//! # cachealloc-mock
//!
//! A simulated device for [`cachealloc_core`]:
//!
//! - **addresses** from a bump pointer: every segment starts at the next
//!   multiple of 2 MiB above the end of the previous one, and addresses are
//!   never reused, so replays are deterministic and comparable anywhere;
//! - an optional **capacity**: `malloc` fails with out-of-memory when the
//!   bytes held would exceed it;
//! - **virtual memory** for expandable segments: address-space
//!   reservations cost no capacity (they take addresses like a malloc, and
//!   are logged with the mallocs), mapped pages do; a map that would exceed
//!   the capacity fails with out-of-memory and maps nothing; the
//!   reservations and pages still held are counted for leak checks;
//! - **streams** whose queued work finishes at the next [`MockDevice::sync`]
//!   of that stream (or of all streams); an event recorded on a stream
//!   completes at the first such sync after the record;
//! - **counters** of every call, the bytes still held and the live events
//!   (for leak checks), and the log of every successful malloc;
//! - **fault injection**: make the n-th call (of one kind, or of any kind)
//!   fail, or make the next mallocs return addresses of the test's choosing
//!   ([`MockDevice::place_next_malloc`], e.g. a range it already handed out);
//! - **recorded addresses**: hand the mallocs of a replay the addresses a
//!   real run got ([`MockDevice::use_real_addresses`]), so that best-fit
//!   ties between same-size blocks break as they did there.
//!
//! One file a concern: `calls.rs` (counters, planted failures),
//! `memory.rs` (addresses, capacity, the malloc log), `events.rs` (streams
//! and events), `teardown.rs` (the end of a test: release everything, then
//! nothing may be left on the device).
//!
//! ```
//! use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
//! use cachealloc_mock::MockDevice;
//!
//! let mut a = DeviceAllocator::new(
//!     MockDevice::with_capacity(64 << 20), vec![BlockSlot::VACANT; 256], Config::DEFAULT);
//! let x = a.malloc(4096, 1)?;
//! a.record_stream(x.handle.unwrap(), 0)?;
//! a.free(x.handle.unwrap())?;                    // waits for stream 0
//! assert_eq!(a.stats().active.all().current, 1);
//! a.backend_mut().sync(Some(0));             // stream 0's work finishes
//! let _y = a.malloc(512, 1)?;                // malloc notices the event
//! assert_eq!(a.stats().active.all().current, 1);
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```

mod calls;
mod capture;
mod events;
mod graph;
mod machine;
mod memory;
pub mod teardown;

pub use calls::{CallKind, Counters};
pub use capture::CaptureMode;
pub use events::MockEvent;
pub use machine::MockMachine;
pub use memory::{RealAddressUse, DEVICE_BASE};

use cachealloc_core::{
    DeviceBackend, DevicePtr, EventStatus, IpcMemHandle, MallocError, MemInfo, PeerAccess, VmError,
};
use calls::Calls;
use capture::Captures;
use events::Streams;
use graph::Graphs;
use memory::Memory;
use std::fmt;

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
    /// A virtual-memory call on a range it does not apply to: an
    /// allocator bug.
    InvalidVirtualMemory {
        /// What was wrong.
        what: &'static str,
        /// The address.
        ptr: DevicePtr,
    },
    /// A bad, stale or foreign IPC handle, or a close of memory not open.
    InvalidIpcHandle {
        /// What was wrong.
        what: &'static str,
    },
    /// Peer access to the device itself (CUDA: invalid device).
    InvalidPeer {
        /// The device asked for.
        peer: u32,
    },
    /// A call the driver refuses while a stream captures (and so
    /// invalidates the capture: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
    /// or `..._ISOLATION` for a wait across the capture's boundary).
    CaptureViolation {
        /// The call.
        kind: CallKind,
    },
    /// `begin_capture` of a stream that captures already, or `end_capture`
    /// of one that does not (`CUDA_ERROR_ILLEGAL_STATE`).
    CaptureState {
        /// The stream.
        stream: u64,
    },
    /// `end_capture` of a capture that a refused call invalidated
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
    CaptureInvalidated {
        /// The call that invalidated it.
        by: CallKind,
    },
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
            MockError::InvalidVirtualMemory { what, ptr } => write!(f, "{what} at {ptr}"),
            MockError::InvalidIpcHandle { what } => write!(f, "invalid IPC handle: {what}"),
            MockError::InvalidPeer { peer } => {
                write!(f, "peer access from device {peer} to itself")
            }
            MockError::CaptureViolation { kind } => write!(
                f,
                "{kind:?} is not permitted while a stream is capturing (the capture is now invalidated)"
            ),
            MockError::CaptureState { stream } => {
                write!(f, "stream {stream}: capture begun twice, or ended without one")
            }
            MockError::CaptureInvalidated { by } => write!(
                f,
                "the capture was invalidated by a {by:?} made while it was under way"
            ),
        }
    }
}

impl std::error::Error for MockError {}

/// The simulated device. Streams are plain `u64`s (0 is the default stream).
#[derive(Debug)]
pub struct MockDevice {
    memory: Memory,
    streams: Streams,
    calls: Calls,
    ordinal: u32,
    /// The memory history's clock: one tick per reading.
    clock: u64,
    /// Streams waited for by `synchronize_stream`, in order.
    stream_syncs: Vec<u64>,
    /// Device-side waits (`stream_wait_event`): (the waiting stream, the
    /// stream the event was recorded on), in order.
    stream_waits: Vec<(u64, u64)>,
    /// The machine it shares IPC handles on, if any, and its member number
    /// there.
    machine: Option<(MockMachine, u32)>,
    /// Devices it may access (peer access enabled).
    peers: Vec<u32>,
    /// Copies queued.
    copies: Vec<MockCopy>,
    /// Stream captures under way.
    captures: Captures,
    /// The graphs they build.
    graphs: Graphs,
}

/// A device-to-device copy the mock queued (it moves no data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MockCopy {
    /// Destination.
    pub dst: DevicePtr,
    /// Source.
    pub src: DevicePtr,
    /// Bytes.
    pub bytes: u64,
    /// The stream it was queued on.
    pub stream: u64,
    /// For a peer copy (`memcpy_peer_async`): the destination's and the
    /// source's devices; `None` for a plain copy (`memcpy_async`).
    pub peer: Option<(u32, u32)>,
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
            memory: Memory::new(capacity),
            streams: Streams::default(),
            calls: Calls::default(),
            ordinal: 0,
            clock: 0,
            stream_syncs: Vec::new(),
            stream_waits: Vec::new(),
            machine: None,
            peers: Vec::new(),
            copies: Vec::new(),
            captures: Captures::default(),
            graphs: Graphs::default(),
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
        self.memory.set_base(base);
        self
    }

    /// Set the device ordinal reported in OOM messages.
    pub fn with_ordinal(mut self, ordinal: u32) -> Self {
        self.ordinal = ordinal;
        self
    }

    /// The capacity (`None`: unlimited).
    pub fn capacity(&self) -> Option<u64> {
        self.memory.capacity
    }

    /// Give the mallocs the addresses of a recorded run: `mallocs` is that
    /// run's (address, size) of every successful malloc, in order. A malloc
    /// whose size is that of the next recorded one gets its address (unless
    /// the range is still held); any other malloc gets a bump address above
    /// every recorded range and leaves the list where it is.
    ///
    /// ```
    /// use cachealloc_core::{DeviceBackend, DevicePtr};
    /// use cachealloc_mock::MockDevice;
    /// let mut d = MockDevice::unlimited();
    /// d.use_real_addresses(&[(0x9000_0000_0000, 2 << 20), (0x8000_0000_0000, 20 << 20)]);
    /// assert_eq!(d.malloc(2 << 20).unwrap(), DevicePtr(0x9000_0000_0000));
    /// assert_eq!(d.malloc(20 << 20).unwrap(), DevicePtr(0x8000_0000_0000));
    /// assert_eq!(d.real_address_use().placed, 2);
    /// ```
    pub fn use_real_addresses(&mut self, mallocs: &[(u64, u64)]) {
        self.memory.use_real_addresses(mallocs);
    }

    /// How the recorded addresses were used so far.
    pub fn real_address_use(&self) -> RealAddressUse {
        self.memory.real_address_use()
    }

    /// The host waits for `stream` (all streams if `None`): its queued work,
    /// and every event recorded on it so far, complete.
    pub fn sync(&mut self, stream: Option<u64>) {
        self.streams.sync(stream);
    }

    /// Bytes held by the allocator (0 after everything was freed and the cache emptied).
    pub fn held_bytes(&self) -> u64 {
        self.memory.held
    }

    /// Segments held.
    pub fn live_segments(&self) -> usize {
        self.memory.live_segments()
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.streams.live_events
    }

    /// Address-space reservations held (expandable segments).
    pub fn live_reservations(&self) -> usize {
        self.memory.live_reservations()
    }

    /// Pages mapped (expandable segments).
    pub fn mapped_pages(&self) -> usize {
        self.memory.mapped_pages()
    }

    /// The streams the allocator waited for (`synchronize_stream`, before
    /// unmapping pages), in order: a test's model of the streams learns
    /// from it that their work is done.
    pub fn stream_synchronizations(&self) -> &[u64] {
        &self.stream_syncs
    }

    /// The device-side waits made (`stream_wait_event`), in order: (the
    /// stream that waits, the stream its event was recorded on). A test's
    /// model of the streams learns from it that memory freed on the second
    /// is safe on the first.
    pub fn stream_waits(&self) -> &[(u64, u64)] {
        &self.stream_waits
    }

    /// Call counters.
    pub fn counters(&self) -> Counters {
        self.calls.counters
    }

    /// Every successful malloc and every address-space reservation, in
    /// order: (base, size).
    pub fn malloc_log(&self) -> &[(DevicePtr, u64)] {
        self.memory.log()
    }

    /// Join `machine`: IPC handles of this device open on the machine's
    /// other devices, and theirs here.
    pub fn with_machine(mut self, machine: &MockMachine) -> Self {
        self.machine = Some((machine.clone(), machine.join()));
        self
    }

    /// The copies queued by `memcpy_async` and `memcpy_peer_async`.
    pub fn copies(&self) -> &[MockCopy] {
        &self.copies
    }

    /// Which malloc (0-based, counting every successful malloc of the run)
    /// made the segment holding `ptr` (the latest, if the address was
    /// handed out again), and the offset of `ptr` in it.
    pub fn locate(&self, ptr: DevicePtr) -> Option<(usize, u64)> {
        self.memory.locate(ptr)
    }

    /// Make the next successful malloc return `addr` (placements queue up),
    /// whatever the device holds: a buggy driver, for the allocator's
    /// contract checks. A placement at the base of a held segment replaces
    /// that segment's record.
    pub fn place_next_malloc(&mut self, addr: u64) {
        self.memory.place_next(addr);
    }

    /// Make the `n`-th backend call from now (0 = the next one), of any
    /// kind, fail. A failed `malloc` fails with an error, not out-of-memory.
    pub fn fail_call(&mut self, n: u64) {
        self.calls.fail_call(n);
    }

    /// Make the `n`-th call of `kind` from now (0 = the next one) fail.
    pub fn fail_nth(&mut self, kind: CallKind, n: u64) {
        self.calls.fail_nth(kind, n, false);
    }

    /// Make the `n`-th `malloc` from now report out-of-memory whatever the capacity.
    pub fn fail_nth_malloc_oom(&mut self, n: u64) {
        self.calls.fail_nth(CallKind::Malloc, n, true);
    }

    /// Forget planted failures that have not fired.
    pub fn clear_faults(&mut self) {
        self.calls.clear_faults();
    }

    /// Begin capturing `stream` (`cuStreamBeginCapture`): until
    /// [`end_capture`](Self::end_capture), the calls the drivers refuse
    /// during a capture fail with [`MockError::CaptureViolation`] and
    /// invalidate it (see `capture.rs`).
    pub fn begin_capture(&mut self, stream: u64, mode: CaptureMode) -> Result<(), MockError> {
        if self.captures.begin(stream, mode) {
            self.graphs.begin(stream);
            Ok(())
        } else {
            Err(MockError::CaptureState { stream })
        }
    }

    /// End the capture of `stream` (`cuStreamEndCapture`): an error if a
    /// refused call invalidated it ([`MockError::CaptureInvalidated`]).
    pub fn end_capture(&mut self, stream: u64) -> Result<(), MockError> {
        self.graphs.end(stream);
        match self.captures.end(stream) {
            None => Err(MockError::CaptureState { stream }),
            Some(Some(by)) => Err(MockError::CaptureInvalidated { by }),
            Some(None) => Ok(()),
        }
    }

    /// Whether `stream` is capturing.
    pub fn is_capturing(&self, stream: u64) -> bool {
        self.captures.is_capturing(stream)
    }

    /// Work (a kernel) queued on `stream`: a node of its capture's graph if
    /// it captures, depending on the stream's terminal nodes.
    pub fn launch(&mut self, stream: u64) {
        self.graphs.launch(stream);
    }

    /// `stream` waits for the work queued on `from` so far (an event
    /// recorded on `from`, waited for on `stream`): in a capture, `from`'s
    /// terminal nodes become `stream`'s too, and a stream outside a capture
    /// joins `from`'s (a fork). A capturing stream may not wait for work
    /// outside its capture: refused, as the drivers refuse it.
    pub fn capture_join(&mut self, stream: u64, from: u64) -> Result<(), MockError> {
        if self.graphs.join(stream, from) {
            Ok(())
        } else {
            Err(MockError::CaptureViolation {
                kind: CallKind::StreamWaitEvent,
            })
        }
    }

    /// Whether `stream` takes part in a capture (began one or joined one).
    pub fn in_capture_graph(&self, stream: u64) -> bool {
        self.graphs.is_capturing(stream)
    }

    /// Free markers the allocator made and has not dropped.
    pub fn live_free_markers(&self) -> usize {
        self.graphs.markers()
    }

    /// Calls refused so far because a stream was capturing.
    pub fn capture_violations(&self) -> u64 {
        self.captures.violations
    }

    /// Refuse `kind` if a capture forbids it now.
    fn capture_check(&mut self, kind: CallKind) -> Result<(), MockError> {
        if self.captures.allows(kind) {
            Ok(())
        } else {
            Err(MockError::CaptureViolation { kind })
        }
    }

    /// Count a call of `kind`; its planted failure, if one fires, or the
    /// refusal of a capture.
    fn call(&mut self, kind: CallKind) -> Result<(), MockError> {
        self.capture_check(kind)?;
        match self.calls.call(kind) {
            Some((e, _)) => Err(e),
            None => Ok(()),
        }
    }
}

impl DeviceBackend for MockDevice {
    type Stream = u64;
    type Event = MockEvent;
    type Error = MockError;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<MockError>> {
        self.capture_check(CallKind::Malloc)
            .map_err(MallocError::Other)?;
        if let Some((e, oom)) = self.calls.call(CallKind::Malloc) {
            if oom {
                self.calls.counters.malloc_oom += 1;
                return Err(MallocError::OutOfMemory);
            }
            return Err(MallocError::Other(e));
        }
        self.memory.malloc(size).ok_or_else(|| {
            self.calls.counters.malloc_oom += 1;
            MallocError::OutOfMemory
        })
    }

    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), MockError> {
        self.call(CallKind::Free)?;
        self.memory.free(ptr, size)?;
        if let Some((m, me)) = &self.machine {
            m.freed(*me, ptr.0);
        }
        Ok(())
    }

    fn ipc_get_handle(&mut self, base: DevicePtr) -> Result<IpcMemHandle, VmError<MockError>> {
        let Some((m, me)) = &self.machine else {
            return Err(VmError::Unsupported);
        };
        if self.memory.segment_at(base.0).is_none() {
            return Err(VmError::Other(MockError::InvalidIpcHandle {
                what: "export of an address that is not the base of a held segment",
            }));
        }
        Ok(m.export(*me, base.0))
    }

    fn ipc_open_handle(&mut self, h: &IpcMemHandle) -> Result<DevicePtr, VmError<MockError>> {
        match &self.machine {
            None => Err(VmError::Unsupported),
            Some((m, me)) => m.open(*me, h).map_err(VmError::Other),
        }
    }

    fn ipc_close_handle(&mut self, base: DevicePtr) -> Result<(), VmError<MockError>> {
        match &self.machine {
            None => Err(VmError::Unsupported),
            Some((m, me)) => m.close(*me, base).map_err(VmError::Other),
        }
    }

    fn enable_peer_access(&mut self, peer: u32) -> Result<PeerAccess, VmError<MockError>> {
        if peer == self.ordinal {
            return Err(VmError::Other(MockError::InvalidPeer { peer }));
        }
        if self.peers.contains(&peer) {
            return Ok(PeerAccess::AlreadyEnabled);
        }
        self.peers.push(peer);
        Ok(PeerAccess::Enabled)
    }

    fn memcpy_async(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: u64,
    ) -> Result<(), VmError<MockError>> {
        self.copies.push(MockCopy {
            dst,
            src,
            bytes,
            stream,
            peer: None,
        });
        Ok(())
    }

    fn memcpy_peer_async(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: u64,
    ) -> Result<(), VmError<MockError>> {
        self.copies.push(MockCopy {
            dst,
            src,
            bytes,
            stream,
            peer: Some((dst_device, src_device)),
        });
        Ok(())
    }

    fn event_create(&mut self) -> Result<MockEvent, MockError> {
        self.call(CallKind::EventCreate)?;
        Ok(self.streams.create())
    }

    fn event_record(&mut self, event: &MockEvent, stream: u64) -> Result<(), MockError> {
        self.call(CallKind::EventRecord)?;
        self.streams.record(event, stream)
    }

    fn event_query(&mut self, event: &MockEvent) -> Result<EventStatus, MockError> {
        self.call(CallKind::EventQuery)?;
        Ok(if self.streams.is_done(event)? {
            EventStatus::Ready
        } else {
            EventStatus::Pending
        })
    }

    fn event_synchronize(&mut self, event: &MockEvent) -> Result<(), MockError> {
        self.call(CallKind::EventSynchronize)?;
        self.streams.wait(event)
    }

    /// Logged (see [`MockDevice::stream_waits`]); the simulated streams do
    /// not run work, so nothing else changes.
    fn stream_wait_event(&mut self, stream: u64, event: &MockEvent) -> Result<(), MockError> {
        self.call(CallKind::StreamWaitEvent)?;
        let on = self
            .streams
            .recorded_on(event)?
            .ok_or(MockError::InvalidEvent)?;
        if !self.captures.allows_wait(stream, on) {
            return Err(MockError::CaptureViolation {
                kind: CallKind::StreamWaitEvent,
            });
        }
        self.stream_waits.push((stream, on));
        Ok(())
    }

    fn event_destroy(&mut self, event: &MockEvent) -> Result<(), MockError> {
        self.call(CallKind::EventDestroy)?;
        self.streams.destroy(event)
    }

    /// A logical clock: 1, 2, 3, ... (deterministic histories).
    fn time_us(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn mem_info(&mut self) -> Result<MemInfo, MockError> {
        self.call(CallKind::MemInfo)?;
        let total = self.memory.capacity.unwrap_or(u64::MAX);
        Ok(MemInfo {
            free: total - self.memory.held,
            total,
        })
    }

    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The calls the allocator still makes during a capture are made "in
    /// relaxed mode" from now on (see [`MockDevice::begin_capture`]).
    fn set_capture_underway(&mut self, underway: bool) {
        self.captures.set_relaxed(underway);
        if !underway {
            self.graphs.forget_walks();
        }
    }

    const CAPTURE_GRAPH: bool = true;

    fn capture_free_marker(
        &mut self,
        streams: &mut dyn Iterator<Item = u64>,
    ) -> Result<Option<u32>, MockError> {
        Ok(self.graphs.free_marker(streams))
    }

    fn capture_walk(&mut self, stream: u64) -> Result<bool, MockError> {
        Ok(self.graphs.walk(stream))
    }

    fn capture_marker_reached(&mut self, stream: u64, marker: u32) -> bool {
        self.graphs.reached(stream, marker)
    }

    fn capture_marker_drop(&mut self, marker: u32) {
        self.graphs.drop_marker(marker);
    }

    const NAME: &'static str = "the simulated device";

    const VIRTUAL_MEMORY: bool = true;

    /// The capacity, or 80 GiB for an unlimited device (what the reference
    /// model assumes).
    fn device_total_memory(&mut self) -> Result<u64, MockError> {
        self.call(CallKind::TotalMemory)?;
        Ok(self.memory.capacity.unwrap_or(DEFAULT_TOTAL_MEMORY))
    }

    /// 2 MiB, a CUDA device's.
    fn allocation_granularity(&mut self) -> Result<u64, VmError<MockError>> {
        self.call(CallKind::Granularity).map_err(VmError::Other)?;
        Ok(2 << 20)
    }

    fn reserve_address_space(&mut self, size: u64) -> Result<DevicePtr, VmError<MockError>> {
        self.capture_check(CallKind::Reserve)
            .map_err(VmError::Other)?;
        if let Some((e, oom)) = self.calls.call(CallKind::Reserve) {
            return Err(if oom {
                VmError::OutOfMemory
            } else {
                VmError::Other(e)
            });
        }
        self.memory.reserve(size).ok_or(VmError::OutOfMemory)
    }

    fn release_address_space(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(), VmError<MockError>> {
        self.call(CallKind::Unreserve).map_err(VmError::Other)?;
        self.memory
            .release_reservation(ptr, size)
            .map_err(VmError::Other)
    }

    fn map_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<MockError>> {
        self.capture_check(CallKind::Map).map_err(VmError::Other)?;
        if let Some((e, oom)) = self.calls.call(CallKind::Map) {
            if oom {
                self.calls.counters.map_oom += 1;
                return Err(VmError::OutOfMemory);
            }
            return Err(VmError::Other(e));
        }
        match self.memory.map(ptr, pages, page_size) {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.calls.counters.map_oom += 1;
                Err(VmError::OutOfMemory)
            }
            Err(e) => Err(VmError::Other(e)),
        }
    }

    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<MockError>> {
        self.call(CallKind::Unmap).map_err(VmError::Other)?;
        self.memory
            .unmap(ptr, pages, page_size)
            .map_err(VmError::Other)
    }

    fn synchronize_stream(&mut self, stream: u64) -> Result<(), MockError> {
        self.call(CallKind::StreamSynchronize)?;
        self.streams.sync(Some(stream));
        self.stream_syncs.push(stream);
        Ok(())
    }
}

/// The total memory an unlimited simulated device reports for sizing
/// expandable segments (an 80 GiB device, as the reference model assumes).
pub const DEFAULT_TOTAL_MEMORY: u64 = 80 << 30;

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
    fn recorded_addresses_go_to_mallocs_of_their_size_in_order() {
        let (hi, lo) = (0x9000_0000_0000u64, 0x8000_0000_0000u64);
        let mut d = MockDevice::with_capacity(64 << 20);
        d.use_real_addresses(&[(hi, 2 << 20), (lo, 20 << 20), (hi, 2 << 20)]);
        assert_eq!(d.malloc(2 << 20).unwrap().0, hi);
        // Another size: the replay went its own way; a bump address above all.
        let other = d.malloc(4 << 20).unwrap().0;
        assert!(other >= hi + (2 << 20));
        assert_eq!(d.malloc(20 << 20).unwrap().0, lo);
        // `hi` is still held: the recorded address cannot be handed out twice.
        assert_ne!(d.malloc(2 << 20).unwrap().0, hi);
        d.free(DevicePtr(hi), 2 << 20).unwrap();
        assert_eq!(d.malloc(2 << 20).unwrap().0, hi);
        assert_eq!(
            d.real_address_use(),
            RealAddressUse {
                placed: 3,
                missed: 2,
                unused: 0
            }
        );
        assert_eq!(d.locate(DevicePtr(hi + 1)), Some((4, 1)));
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
    fn a_capture_refuses_unsafe_calls_and_is_invalidated() {
        let mut d = MockDevice::unlimited();
        let p = d.malloc(2 << 20).unwrap();
        let e = d.event_create().unwrap();
        d.event_record(&e, 2).unwrap();
        d.begin_capture(1, CaptureMode::Global).unwrap();
        assert_eq!(
            d.begin_capture(1, CaptureMode::Global),
            Err(MockError::CaptureState { stream: 1 })
        );
        // Waiting for an event recorded on the same stream is fine; an
        // event record is refused (the allocator must not make one).
        d.stream_wait_event(2, &e).unwrap();
        // The allocator said a capture is under way: malloc is relaxed.
        d.set_capture_underway(true);
        assert!(d.malloc(2 << 20).is_ok());
        assert_eq!(d.end_capture(1), Ok(()));
        // Again, and a free (never relaxed) invalidates it.
        d.begin_capture(1, CaptureMode::ThreadLocal).unwrap();
        assert_eq!(
            d.free(p, 2 << 20),
            Err(MockError::CaptureViolation {
                kind: CallKind::Free
            })
        );
        assert_eq!(
            d.end_capture(1),
            Err(MockError::CaptureInvalidated { by: CallKind::Free })
        );
        // Without the allocator's word, a malloc invalidates too; a relaxed
        // capture tolerates anything.
        d.set_capture_underway(false);
        d.begin_capture(3, CaptureMode::Global).unwrap();
        assert!(d.malloc(2 << 20).is_err());
        assert!(d.stream_wait_event(3, &e).is_err(), "isolation");
        assert!(d.event_record(&e, 2).is_err(), "no event record");
        assert_eq!(
            d.end_capture(3),
            Err(MockError::CaptureInvalidated {
                by: CallKind::Malloc
            })
        );
        d.begin_capture(4, CaptureMode::Relaxed).unwrap();
        assert!(d.event_query(&e).is_ok());
        assert_eq!(d.end_capture(4), Ok(()));
        assert_eq!(d.end_capture(4), Err(MockError::CaptureState { stream: 4 }));
        assert_eq!(d.capture_violations(), 4);
        // The refused free changed nothing: it can be made now.
        d.free(p, 2 << 20).unwrap();
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
