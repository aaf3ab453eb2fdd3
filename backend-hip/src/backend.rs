//! [`HipBackend`]: the `DeviceBackend` over the HIP runtime.

use crate::conv::HipError;
use crate::conv::{check, error, is_no_device, is_not_ready, is_out_of_memory, is_success};
use crate::hip;
use cachealloc_core::{
    DeviceBackend, DevicePtr, EventStatus, IpcMemHandle, MallocError, MemInfo, PeerAccess, VmError,
};
use std::collections::BTreeMap;

/// A HIP stream handle (`hipStream_t`), compared by raw value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HipStream(usize);

impl HipStream {
    /// The default (null) stream.
    pub const DEFAULT: HipStream = HipStream(0);

    /// Wrap a raw stream created by the runtime that owns it.
    pub fn from_raw(stream: hip::hipStream_t) -> HipStream {
        HipStream(stream as usize)
    }

    /// The raw handle.
    pub fn as_raw(self) -> hip::hipStream_t {
        self.0 as hip::hipStream_t
    }
}

impl From<HipStream> for u64 {
    fn from(s: HipStream) -> u64 {
        s.0 as u64
    }
}

/// The stream of a raw handle value (what snapshots give back).
impl From<u64> for HipStream {
    fn from(raw: u64) -> HipStream {
        HipStream(raw as usize)
    }
}

/// A HIP event created with timing disabled.
#[derive(Debug)]
pub struct HipEvent(hip::hipEvent_t);

// SAFETY: hipEvent_t is a runtime handle usable from any host thread; it is
// never aliased mutably here.
unsafe impl Send for HipEvent {}

/// One HIP device.
///
/// ```no_run
/// use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
/// use cachealloc_hip::{HipBackend, HipStream};
/// let mut a =
///     DeviceAllocator::new(HipBackend::new(0)?, vec![BlockSlot::VACANT; 1 << 16], Config::DEFAULT);
/// let x = a.malloc(1 << 20, HipStream::DEFAULT).expect("malloc");
/// a.free(x.handle.unwrap()).expect("free");
/// # Ok::<(), cachealloc_hip::HipError>(())
/// ```
#[derive(Debug)]
pub struct HipBackend {
    ordinal: u32,
    /// Mapped pages (expandable segments): address -> physical allocation
    /// (`hipMemGenericAllocationHandle_t` as a number).
    pub(crate) pages: BTreeMap<u64, usize>,
    /// Unmapped allocations whose release failed, to release again.
    pub(crate) unreleased: Vec<usize>,
    /// Mapped pages exported for another process: address -> the file
    /// descriptor (closed when the page is unmapped).
    pub(crate) exported: BTreeMap<u64, i32>,
    /// Other processes' pages mapped here: base -> their handles.
    pub(crate) imported: BTreeMap<u64, crate::vmm_ipc::ImportedPages>,
    /// A stream capture is under way on the device (the allocator said so):
    /// device mallocs, page maps and memory info run in relaxed capture mode.
    pub(crate) capturing: bool,
    /// Free markers and what the walks of the captures' graphs found.
    pub(crate) graph: cachealloc_capture_graph::CaptureGraph<HipStream>,
}

/// The HIP runtime of the process, loaded at the first call: the library
/// it came from, or why there is none.
pub fn open_runtime() -> Result<String, HipError> {
    hip::api()
        .map(|a| a.library().to_string())
        .map_err(HipError::from)
}

/// Load the HIP runtime from `library` (a path or soname) apart from the
/// process's own, and resolve every entry point the backend needs: the
/// check [`open_runtime`] makes, for one library.
pub fn check_runtime(library: &str) -> Result<String, HipError> {
    hip::load(&[library.to_string()])
        .map(|a| a.library().to_string())
        .map_err(|e| HipError::from(&e))
}

/// The number of HIP devices (0 when the runtime reports `hipErrorNoDevice`).
pub fn device_count() -> Result<u32, HipError> {
    open_runtime()?;
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer for the duration of the call.
    let e = unsafe { hip::hipGetDeviceCount(&mut n) };
    if is_no_device(e) {
        return Ok(0);
    }
    check(e, "hipGetDeviceCount")?;
    Ok(n.max(0) as u32)
}

impl HipBackend {
    /// Open device `ordinal`.
    pub fn new(ordinal: u32) -> Result<HipBackend, HipError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(HipError::NoDevice { ordinal, count });
        }
        Ok(HipBackend {
            ordinal,
            pages: BTreeMap::new(),
            unreleased: Vec::new(),
            exported: BTreeMap::new(),
            imported: BTreeMap::new(),
            capturing: false,
            graph: cachealloc_capture_graph::CaptureGraph::default(),
        })
    }

    /// Make this device current on the calling thread until the guard is
    /// dropped; then the device that was current before is current again.
    pub(crate) fn bind(&self) -> Result<Bound, HipError> {
        let mut prev: i32 = 0;
        // SAFETY: `prev` is a valid out-pointer for the duration of the call.
        check(unsafe { hip::hipGetDevice(&mut prev) }, "hipGetDevice")?;
        if prev == self.ordinal as i32 {
            return Ok(Bound { restore: None });
        }
        self.make_current()?;
        Ok(Bound {
            restore: Some(prev),
        })
    }

    /// Make this device current on the calling thread and leave it so, for
    /// code that then calls HIP directly.
    pub fn make_current(&self) -> Result<(), HipError> {
        // SAFETY: plain call with a device number checked against the count.
        check(
            unsafe { hip::hipSetDevice(self.ordinal as i32) },
            "hipSetDevice",
        )
    }

    /// A new non-blocking stream on this device; give it back with
    /// [`destroy_stream`](Self::destroy_stream).
    pub fn create_stream(&self) -> Result<HipStream, HipError> {
        let _bound = self.bind()?;
        let mut s: hip::hipStream_t = core::ptr::null_mut();
        // SAFETY: `s` is a valid out-pointer.
        let e = unsafe { hip::hipStreamCreateWithFlags(&mut s, hip::hipStreamNonBlocking) };
        check(e, "hipStreamCreateWithFlags")?;
        Ok(HipStream::from_raw(s))
    }

    /// Destroy a stream made by [`create_stream`](Self::create_stream).
    pub fn destroy_stream(&self, stream: HipStream) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: a stream of this device the caller no longer uses;
        // destroying it twice is the runtime's error, not UB.
        check(
            unsafe { hip::hipStreamDestroy(stream.as_raw()) },
            "hipStreamDestroy",
        )
    }

    /// Block until all work on the device is done (`hipDeviceSynchronize`).
    pub fn synchronize_all(&self) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: plain call on the current device.
        let e = unsafe { hip::hipDeviceSynchronize() };
        check(e, "hipDeviceSynchronize")
    }

    /// Block until all work queued on `stream` is done.
    pub fn synchronize(&self, stream: HipStream) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: the default stream or one the caller keeps alive.
        check(
            unsafe { hip::hipStreamSynchronize(stream.as_raw()) },
            "hipStreamSynchronize",
        )
    }
}

impl DeviceBackend for HipBackend {
    type Stream = HipStream;
    type Event = HipEvent;
    type Error = HipError;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<HipError>> {
        let _bound = self.bind().map_err(MallocError::Other)?;
        let _relaxed = self.relaxed_if_capturing().map_err(MallocError::Other)?;
        let mut p: *mut core::ffi::c_void = core::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the memory is freed only through `free`.
        let e = unsafe { hip::hipMalloc(&mut p, size as usize) };
        if is_success(e) {
            Ok(DevicePtr(p as u64))
        } else if is_out_of_memory(e) {
            Err(MallocError::OutOfMemory)
        } else {
            Err(MallocError::Other(error(e, "hipMalloc")))
        }
    }

    fn free(&mut self, ptr: DevicePtr, _size: u64) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: only whole segments from `malloc`, once each.
        check(
            unsafe { hip::hipFree(ptr.0 as *mut core::ffi::c_void) },
            "hipFree",
        )
    }

    fn event_create(&mut self) -> Result<HipEvent, HipError> {
        let _bound = self.bind()?;
        let mut ev: hip::hipEvent_t = core::ptr::null_mut();
        // SAFETY: `ev` is a valid out-pointer.
        let e = unsafe { hip::hipEventCreateWithFlags(&mut ev, hip::hipEventDisableTiming) };
        check(e, "hipEventCreateWithFlags")?;
        Ok(HipEvent(ev))
    }

    fn event_record(&mut self, event: &HipEvent, stream: HipStream) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`, a stream of this device.
        check(
            unsafe { hip::hipEventRecord(event.0, stream.as_raw()) },
            "hipEventRecord",
        )
    }

    fn event_query(&mut self, event: &HipEvent) -> Result<EventStatus, HipError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`.
        let e = unsafe { hip::hipEventQuery(event.0) };
        if is_success(e) {
            Ok(EventStatus::Ready)
        } else if is_not_ready(e) {
            Ok(EventStatus::Pending)
        } else {
            Err(error(e, "hipEventQuery"))
        }
    }

    fn event_synchronize(&mut self, event: &HipEvent) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`.
        check(
            unsafe { hip::hipEventSynchronize(event.0) },
            "hipEventSynchronize",
        )
    }

    fn stream_wait_event(&mut self, stream: HipStream, event: &HipEvent) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`, recorded; a stream of
        // this device the caller keeps alive.
        check(
            unsafe { hip::hipStreamWaitEvent(stream.as_raw(), event.0, 0) },
            "hipStreamWaitEvent",
        )
    }

    fn event_destroy(&mut self, event: &HipEvent) -> Result<(), HipError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`; the allocator drops its
        // handle once this succeeds (a second destroy is the runtime's
        // error, not UB).
        check(unsafe { hip::hipEventDestroy(event.0) }, "hipEventDestroy")
    }

    fn mem_info(&mut self) -> Result<MemInfo, HipError> {
        let _bound = self.bind()?;
        let _relaxed = self.relaxed_if_capturing()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: valid out-pointers.
        let e = unsafe { hip::hipMemGetInfo(&mut free, &mut total) };
        check(e, "hipMemGetInfo")?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Device mallocs, page maps and memory info run in relaxed capture
    /// mode while a capture is under way (see `src/capture.rs`); when the
    /// last capture ends, what the graph walks found goes.
    fn set_capture_underway(&mut self, underway: bool) {
        self.capturing = underway;
        if !underway {
            self.graph.captures_ended();
        }
    }

    const CAPTURE_GRAPH: bool = true;

    fn capture_free_marker(
        &mut self,
        streams: &mut dyn Iterator<Item = HipStream>,
    ) -> Result<Option<u32>, HipError> {
        self.graph_free_marker(streams)
    }

    fn capture_walk(&mut self, stream: HipStream) -> Result<bool, HipError> {
        self.graph_walk(stream)
    }

    fn capture_marker_reached(&mut self, stream: HipStream, marker: u32) -> bool {
        self.graph.reached(stream, marker)
    }

    fn capture_marker_drop(&mut self, marker: u32) {
        self.graph.drop_marker(marker);
    }

    /// Microseconds since the Unix epoch (what PyTorch's history records).
    fn time_us(&mut self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }

    const PLATFORM: &'static str = "HIP";
    const NAME: &'static str = "the HIP backend";
    const VIRTUAL_MEMORY: bool = true;

    fn device_total_memory(&mut self) -> Result<u64, HipError> {
        self.vm_total_memory()
    }

    fn allocation_granularity(&mut self) -> Result<u64, VmError<HipError>> {
        self.vm_granularity()
    }

    fn reserve_address_space(&mut self, size: u64) -> Result<DevicePtr, VmError<HipError>> {
        let _relaxed = self.relaxed_if_capturing().map_err(VmError::Other)?;
        self.vm_reserve(size)
    }

    fn release_address_space(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(), VmError<HipError>> {
        self.vm_free(ptr, size)
    }

    fn map_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<HipError>> {
        let _relaxed = self.relaxed_if_capturing().map_err(VmError::Other)?;
        self.vm_map(ptr, pages, page_size)
    }

    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<HipError>> {
        self.vm_unmap(ptr, pages, page_size)
    }

    fn ipc_export_pages(
        &mut self,
        ptr: DevicePtr,
        page_size: u64,
        fds: &mut [i32],
    ) -> Result<(), VmError<HipError>> {
        self.vm_export(ptr, page_size, fds)
    }

    fn ipc_import_pages(
        &mut self,
        pid: u32,
        fds: &[i32],
        page_size: u64,
    ) -> Result<DevicePtr, VmError<HipError>> {
        self.vm_import(pid, fds, page_size)
    }

    fn ipc_close_pages(&mut self, base: DevicePtr) -> Result<(), VmError<HipError>> {
        self.vm_close_import(base)
    }

    fn synchronize_stream(&mut self, stream: HipStream) -> Result<(), HipError> {
        self.synchronize(stream)
    }

    fn ipc_get_handle(&mut self, base: DevicePtr) -> Result<IpcMemHandle, VmError<HipError>> {
        self.ipc_handle(base)
    }

    fn ipc_open_handle(&mut self, handle: &IpcMemHandle) -> Result<DevicePtr, VmError<HipError>> {
        self.ipc_open(handle)
    }

    fn ipc_close_handle(&mut self, base: DevicePtr) -> Result<(), VmError<HipError>> {
        self.ipc_close(base)
    }

    fn enable_peer_access(&mut self, peer: u32) -> Result<PeerAccess, VmError<HipError>> {
        self.peer_access(peer)
    }

    fn memcpy_async(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: HipStream,
    ) -> Result<(), VmError<HipError>> {
        self.copy(dst, src, bytes, stream)
    }

    fn memcpy_peer_async(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: HipStream,
    ) -> Result<(), VmError<HipError>> {
        self.copy_peer(dst, dst_device, src, src_device, bytes, stream)
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        let exported: Vec<u64> = self.exported.keys().copied().collect();
        for addr in exported {
            self.forget_export(addr);
        }
        // Other processes' pages still mapped here: unmapped, best effort.
        let imported: Vec<u64> = self.imported.keys().copied().collect();
        for base in imported {
            let _ = self.vm_close_import(DevicePtr(base));
        }
        if !self.unreleased.is_empty() {
            if let Ok(_bound) = self.bind() {
                self.release_unreleased();
            }
        }
    }
}

/// Restores the device that was current before a call.
pub(crate) struct Bound {
    /// The device to make current again, if we changed it.
    restore: Option<i32>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: plain call with the device that was current just
            // before; best effort, see the crate docs.
            let _ = unsafe { hip::hipSetDevice(prev) };
        }
    }
}
