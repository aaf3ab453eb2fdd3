//! What the backend-generic tests need from a device beside the
//! `DeviceBackend` trait: how to open one, its streams, and how to make
//! stream work pending and finished. [`Logged`] wraps any backend to record
//! its device mallocs and address-space reservations (for `at:`
//! placements) and count its events, reservations and mapped bytes.

use cachealloc_core::{
    DeviceBackend, DevicePtr, EventStatus, IpcMemHandle, MallocError, MemInfo, PeerAccess, VmError,
};
use cachealloc_mock::{CaptureMode, MockDevice};

/// A device under test.
pub trait Harness {
    /// The backend.
    type B: DeviceBackend;
    /// Its name, for messages.
    fn name(&self) -> &'static str;
    /// A fresh backend (with `capacity`, where the device is simulated), or
    /// why there is none on this machine.
    fn open(&self, capacity: Option<u64>) -> Result<Self::B, String>;
    /// Stream number `k` (0: the default stream).
    fn stream(&self, k: u64) -> <Self::B as DeviceBackend>::Stream;
    /// Queue work on stream `k`; whether it is sure to be still running when
    /// this returns (on a simulated device: until [`finish`](Self::finish)).
    fn enqueue_work(&self, b: &mut Self::B, k: u64) -> bool;
    /// The host waits for stream `k` (all streams when `None`).
    fn finish(&self, b: &mut Self::B, k: Option<u64>);
    /// Whether stream work completes only when `finish` says so (then
    /// scenarios that depend on event timing can run).
    fn deterministic(&self) -> bool;
    /// Whether the device can be given a capacity.
    fn simulated(&self) -> bool;
    /// The runtime begins capturing stream `k` into a graph (global mode,
    /// as `torch.cuda.graph`): from now until [`end_capture`](Self::end_capture)
    /// the device refuses the calls the driver refuses during a capture.
    /// Where that cannot be modelled, nothing.
    fn begin_capture(&self, b: &mut Self::B, k: u64) -> Result<(), String> {
        let _ = (b, k);
        Ok(())
    }
    /// The runtime ends the capture of stream `k`: an error if a call made
    /// meanwhile invalidated it.
    fn end_capture(&self, b: &mut Self::B, k: u64) -> Result<(), String> {
        let _ = (b, k);
        Ok(())
    }
    /// Make the device's next malloc return `addr`; whether it can.
    fn place_next_malloc(&self, b: &mut Self::B, addr: u64) -> bool {
        let _ = (b, addr);
        false
    }
    /// Whether [`place_next_malloc`](Self::place_next_malloc) can place one
    /// (scenarios that need it run only where it can).
    fn places_mallocs(&self) -> bool {
        false
    }
}

/// The simulated device.
pub struct MockHarness;

impl Harness for MockHarness {
    type B = MockDevice;
    fn name(&self) -> &'static str {
        "mock"
    }
    fn open(&self, capacity: Option<u64>) -> Result<MockDevice, String> {
        Ok(MockDevice::new(capacity))
    }
    fn stream(&self, k: u64) -> u64 {
        k
    }
    fn enqueue_work(&self, _b: &mut MockDevice, _k: u64) -> bool {
        true
    }
    fn finish(&self, b: &mut MockDevice, k: Option<u64>) {
        b.sync(k)
    }
    fn deterministic(&self) -> bool {
        true
    }
    fn simulated(&self) -> bool {
        true
    }
    fn begin_capture(&self, b: &mut MockDevice, k: u64) -> Result<(), String> {
        b.begin_capture(k, CaptureMode::Global)
            .map_err(|e| e.to_string())
    }
    fn end_capture(&self, b: &mut MockDevice, k: u64) -> Result<(), String> {
        b.end_capture(k).map_err(|e| e.to_string())
    }
    fn place_next_malloc(&self, b: &mut MockDevice, addr: u64) -> bool {
        b.place_next_malloc(addr);
        true
    }
    fn places_mallocs(&self) -> bool {
        true
    }
}

/// A backend that records every successful device malloc and reservation
/// and counts events.
#[derive(Debug)]
pub struct Logged<B> {
    /// The backend.
    pub inner: B,
    /// Every successful malloc and address-space reservation, in order:
    /// (base, size).
    pub mallocs: Vec<(DevicePtr, u64)>,
    /// Bytes held (malloc'd and not freed, or mapped and not unmapped).
    pub held: u64,
    /// Address-space reservations held.
    pub reservations: u64,
    /// Events created.
    pub event_creates: u64,
    /// Events destroyed.
    pub event_destroys: u64,
}

impl<B> Logged<B> {
    /// Wrap `inner`.
    pub fn new(inner: B) -> Self {
        Logged {
            inner,
            mallocs: Vec::new(),
            held: 0,
            reservations: 0,
            event_creates: 0,
            event_destroys: 0,
        }
    }

    /// Which malloc (0-based) made the segment holding `ptr`, and the offset.
    /// Real devices may reuse addresses, so the latest matching malloc wins.
    pub fn locate(&self, ptr: DevicePtr) -> Option<(usize, u64)> {
        self.mallocs
            .iter()
            .enumerate()
            .rev()
            .find(|(_, (b, s))| b.0 <= ptr.0 && ptr.0 - b.0 < *s)
            .map(|(k, (b, _))| (k, ptr.0 - b.0))
    }
}

impl<B: DeviceBackend> DeviceBackend for Logged<B> {
    type Stream = B::Stream;
    type Event = B::Event;
    type Error = B::Error;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<B::Error>> {
        let p = self.inner.malloc(size)?;
        self.mallocs.push((p, size));
        self.held += size;
        Ok(p)
    }
    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), B::Error> {
        self.inner.free(ptr, size)?;
        self.held -= size;
        Ok(())
    }
    fn event_create(&mut self) -> Result<B::Event, B::Error> {
        let e = self.inner.event_create()?;
        self.event_creates += 1;
        Ok(e)
    }
    fn event_record(&mut self, event: &B::Event, stream: B::Stream) -> Result<(), B::Error> {
        self.inner.event_record(event, stream)
    }
    fn event_query(&mut self, event: &B::Event) -> Result<EventStatus, B::Error> {
        self.inner.event_query(event)
    }
    fn event_synchronize(&mut self, event: &B::Event) -> Result<(), B::Error> {
        self.inner.event_synchronize(event)
    }
    fn stream_wait_event(&mut self, stream: B::Stream, event: &B::Event) -> Result<(), B::Error> {
        self.inner.stream_wait_event(stream, event)
    }
    fn event_destroy(&mut self, event: &B::Event) -> Result<(), B::Error> {
        self.inner.event_destroy(event)?;
        self.event_destroys += 1;
        Ok(())
    }
    fn mem_info(&mut self) -> Result<MemInfo, B::Error> {
        self.inner.mem_info()
    }
    fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }
    fn time_us(&mut self) -> u64 {
        self.inner.time_us()
    }
    fn set_capture_underway(&mut self, underway: bool) {
        self.inner.set_capture_underway(underway)
    }
    const CAPTURE_GRAPH: bool = B::CAPTURE_GRAPH;
    fn capture_free_marker(
        &mut self,
        streams: &mut dyn Iterator<Item = B::Stream>,
    ) -> Result<Option<u32>, B::Error> {
        self.inner.capture_free_marker(streams)
    }
    fn capture_walk(&mut self, stream: B::Stream) -> Result<bool, B::Error> {
        self.inner.capture_walk(stream)
    }
    fn capture_marker_reached(&mut self, stream: B::Stream, marker: u32) -> bool {
        self.inner.capture_marker_reached(stream, marker)
    }
    fn capture_marker_drop(&mut self, marker: u32) {
        self.inner.capture_marker_drop(marker)
    }
    const PLATFORM: &'static str = B::PLATFORM;
    const NAME: &'static str = B::NAME;
    const VIRTUAL_MEMORY: bool = B::VIRTUAL_MEMORY;

    fn device_total_memory(&mut self) -> Result<u64, B::Error> {
        self.inner.device_total_memory()
    }
    fn allocation_granularity(&mut self) -> Result<u64, VmError<B::Error>> {
        self.inner.allocation_granularity()
    }
    fn reserve_address_space(&mut self, size: u64) -> Result<DevicePtr, VmError<B::Error>> {
        let p = self.inner.reserve_address_space(size)?;
        self.mallocs.push((p, size));
        self.reservations += 1;
        Ok(p)
    }
    fn release_address_space(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(), VmError<B::Error>> {
        self.inner.release_address_space(ptr, size)?;
        self.reservations -= 1;
        Ok(())
    }
    fn map_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<B::Error>> {
        self.inner.map_pages(ptr, pages, page_size)?;
        self.held += pages * page_size;
        Ok(())
    }
    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<B::Error>> {
        self.inner.unmap_pages(ptr, pages, page_size)?;
        self.held -= pages * page_size;
        Ok(())
    }
    fn synchronize_stream(&mut self, stream: B::Stream) -> Result<(), B::Error> {
        self.inner.synchronize_stream(stream)
    }
    fn ipc_get_handle(&mut self, base: DevicePtr) -> Result<IpcMemHandle, VmError<B::Error>> {
        self.inner.ipc_get_handle(base)
    }
    fn ipc_open_handle(&mut self, handle: &IpcMemHandle) -> Result<DevicePtr, VmError<B::Error>> {
        self.inner.ipc_open_handle(handle)
    }
    fn ipc_close_handle(&mut self, base: DevicePtr) -> Result<(), VmError<B::Error>> {
        self.inner.ipc_close_handle(base)
    }
    fn ipc_export_pages(
        &mut self,
        ptr: DevicePtr,
        page_size: u64,
        fds: &mut [i32],
    ) -> Result<(), VmError<B::Error>> {
        self.inner.ipc_export_pages(ptr, page_size, fds)
    }
    fn ipc_import_pages(
        &mut self,
        pid: u32,
        fds: &[i32],
        page_size: u64,
    ) -> Result<DevicePtr, VmError<B::Error>> {
        self.inner.ipc_import_pages(pid, fds, page_size)
    }
    fn ipc_close_pages(&mut self, base: DevicePtr) -> Result<(), VmError<B::Error>> {
        self.inner.ipc_close_pages(base)
    }
    fn enable_peer_access(&mut self, peer: u32) -> Result<PeerAccess, VmError<B::Error>> {
        self.inner.enable_peer_access(peer)
    }
    fn memcpy_async(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: B::Stream,
    ) -> Result<(), VmError<B::Error>> {
        self.inner.memcpy_async(dst, src, bytes, stream)
    }
    fn memcpy_peer_async(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: B::Stream,
    ) -> Result<(), VmError<B::Error>> {
        self.inner
            .memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream)
    }
}
