//! # cachealloc-cuda
//!
//! A [`DeviceBackend`] for NVIDIA GPUs on the CUDA driver API, through
//! `cudarc`'s `sys` and `result` layers with dynamic loading (its `safe`
//! types free memory when dropped, which fights a cache). A machine without
//! a driver or a GPU gets an error value from [`CudaBackend::new`], never a
//! panic: the driver library is probed before the first call.
//!
//! Every call makes the device's primary context current on the calling
//! thread and, when another context was current, makes that one current
//! again afterwards (as PyTorch's device guards do), so a backend can be
//! used from any thread and never changes the caller's context. Restoring is
//! best effort: it follows a call whose effect cannot be undone, so its
//! failure is not reported.
//!
//! Expandable segments (`expandable_segments:True`) run on the driver's
//! virtual-memory API (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`), one
//! physical allocation per page as in PyTorch. A driver without them (older
//! than CUDA 10.2) makes `expandable_segments:True` an error value naming
//! this backend.
//!
//! CUDA graphs: while a capture is under way on the device (the allocator
//! calls [`DeviceBackend::set_capture_underway`]), the calls the allocator
//! still makes (`cuMemAlloc`, the page-mapping calls, `cuMemGetInfo`) run
//! in relaxed capture mode (`cuThreadExchangeStreamCaptureMode`), as
//! PyTorch's `cudaMallocMaybeCapturing` does, so that they cannot
//! invalidate the capture. For `graph_capture_record_stream_reuse:True` the
//! backend reads the graph a capture builds (`src/graph.rs`:
//! `cuStreamGetCaptureInfo_v2`, `cuGraphNodeGetDependencies`), as PyTorch
//! does to hand out again, within the capture, a block freed after other
//! streams used it.
//!
//! Sharing memory with other processes and between devices (`src/ipc.rs`):
//! `cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2` (lazy peer access, as
//! PyTorch opens handles), `cuIpcCloseMemHandle`, `cuCtxEnablePeerAccess`
//! ("already enabled" is no error), `cuMemcpyAsync` and `cuMemcpyPeerAsync`.
//! A peer device's primary context is retained at its first use and
//! released when the backend is dropped.
//!
//! ```no_run
//! use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
//! use cachealloc_cuda::{CudaBackend, CudaStream};
//! let backend = CudaBackend::new(0)?;
//! let mut a =
//!     DeviceAllocator::new(backend, vec![BlockSlot::VACANT; 1 << 16], Config::DEFAULT);
//! let x = a.malloc(1 << 20, CudaStream::DEFAULT).expect("malloc");
//! a.free(x.handle.unwrap()).expect("free");
//! # Ok::<(), cachealloc_cuda::CudaError>(())
//! ```

mod capture;
mod conv;
mod graph;
mod ipc;
mod vmm;
mod vmm_ipc;

pub use conv::CudaError;

use cachealloc_core::{
    DeviceBackend, DevicePtr, EventStatus, IpcMemHandle, MallocError, MemInfo, PeerAccess, VmError,
};
use conv::{check, driver_error, is_no_device, is_not_ready, is_out_of_memory};
use cudarc::driver::{result, sys};
use std::collections::BTreeMap;

/// A CUDA stream handle (`CUstream`), compared by its raw value as PyTorch
/// does. `CudaStream::DEFAULT` is the legacy default stream (null).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CudaStream(usize);

impl CudaStream {
    /// The default stream.
    pub const DEFAULT: CudaStream = CudaStream(0);

    /// Wrap a raw stream created elsewhere (by the runtime that owns it).
    pub fn from_raw(stream: sys::CUstream) -> CudaStream {
        CudaStream(stream as usize)
    }

    /// The raw handle.
    pub fn as_raw(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

impl From<CudaStream> for u64 {
    fn from(s: CudaStream) -> u64 {
        s.0 as u64
    }
}

/// The stream of a raw handle value (what snapshots give back).
impl From<u64> for CudaStream {
    fn from(raw: u64) -> CudaStream {
        CudaStream(raw as usize)
    }
}

/// A CUDA event created with timing disabled.
#[derive(Debug)]
pub struct CudaEvent(sys::CUevent);

// SAFETY: a CUevent is a handle into the driver, which allows using it from
// any thread (the driver API is thread-safe); we never alias it mutably.
unsafe impl Send for CudaEvent {}

/// One CUDA device, through its primary context.
#[derive(Debug)]
pub struct CudaBackend {
    ordinal: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Mapped pages (expandable segments): address -> physical allocation.
    pages: BTreeMap<u64, sys::CUmemGenericAllocationHandle>,
    /// Unmapped allocations whose release failed, to release again.
    unreleased: Vec<sys::CUmemGenericAllocationHandle>,
    /// Mapped pages exported for another process: address -> the file
    /// descriptor (closed when the page is unmapped).
    exported: BTreeMap<u64, i32>,
    /// Other processes' pages mapped here: base -> their handles.
    imported: BTreeMap<u64, vmm_ipc::ImportedPages>,
    /// Whether the driver has the virtual-memory functions.
    vmm: bool,
    /// Other devices' primary contexts, retained for peer access and
    /// peer copies.
    peers: Vec<ipc::PeerContext>,
    /// A stream capture is under way on the device (the allocator said so):
    /// device mallocs, page maps and memory info run in relaxed capture mode.
    capturing: bool,
    /// Free markers and what the walks of the captures' graphs found.
    graph: cachealloc_capture_graph::CaptureGraph<CudaStream>,
}

// SAFETY: the primary context may be made current on any thread
// (`cuCtxSetCurrent`), which every call here does first; the handles are
// driver objects, not thread-bound memory.
unsafe impl Send for CudaBackend {}

/// The number of CUDA devices: `NoDriver` without a driver, 0 when the
/// driver finds no device.
pub fn device_count() -> Result<u32, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    match result::init() {
        Err(e) if is_no_device(&e) => return Ok(0),
        r => check(r, "cuInit")?,
    }
    Ok(check(result::device::get_count(), "cuDeviceGetCount")?.max(0) as u32)
}

impl CudaBackend {
    /// Open device `ordinal`: checks that the driver library loads and that
    /// the device exists, then retains its primary context.
    pub fn new(ordinal: u32) -> Result<CudaBackend, CudaError> {
        if !driver_present() {
            return Err(CudaError::NoDriver);
        }
        match result::init() {
            // A driver without a device fails cuInit itself.
            Err(e) if is_no_device(&e) => return Err(CudaError::NoDevice { ordinal, count: 0 }),
            r => check(r, "cuInit")?,
        }
        let count = check(result::device::get_count(), "cuDeviceGetCount")?.max(0) as u32;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let device = check(result::device::get(ordinal as i32), "cuDeviceGet")?;
        // SAFETY: `device` is a valid device handle from cuDeviceGet; the
        // retained context is released in Drop.
        let ctx = check(
            unsafe { result::primary_ctx::retain(device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(CudaBackend {
            ordinal,
            device,
            ctx,
            pages: BTreeMap::new(),
            unreleased: Vec::new(),
            exported: BTreeMap::new(),
            imported: BTreeMap::new(),
            vmm: vmm::driver_has_vmm(),
            peers: Vec::new(),
            capturing: false,
            graph: cachealloc_capture_graph::CaptureGraph::default(),
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// Make this device's primary context current on the calling thread
    /// until the guard is dropped; then the context that was current before
    /// is current again.
    fn bind(&self) -> Result<Bound, CudaError> {
        let prev = check(result::ctx::get_current(), "cuCtxGetCurrent")?;
        if prev == Some(self.ctx) {
            return Ok(Bound { restore: None });
        }
        // SAFETY: `ctx` is the primary context retained in `new` and not yet
        // released (that happens only in Drop).
        let r = unsafe { result::ctx::set_current(self.ctx) };
        check(r, "cuCtxSetCurrent")?;
        Ok(Bound {
            restore: Some(prev.unwrap_or(core::ptr::null_mut())),
        })
    }

    /// Make this device's primary context current on the calling thread and
    /// leave it so, for code that then calls the driver directly.
    pub fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: `ctx` is the primary context retained in `new`, not yet released.
        check(
            unsafe { result::ctx::set_current(self.ctx) },
            "cuCtxSetCurrent",
        )
    }

    /// A new non-blocking stream in this device's context; give it back with
    /// [`destroy_stream`](Self::destroy_stream).
    pub fn create_stream(&self) -> Result<CudaStream, CudaError> {
        let _bound = self.bind()?;
        let s = check(
            result::stream::create(result::stream::StreamKind::NonBlocking),
            "cuStreamCreate",
        )?;
        Ok(CudaStream::from_raw(s))
    }

    /// Destroy a stream made by [`create_stream`](Self::create_stream).
    pub fn destroy_stream(&self, stream: CudaStream) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: a stream of this context that the caller no longer uses;
        // destroying the same stream twice is the driver's error, not UB.
        check(
            unsafe { result::stream::destroy(stream.as_raw()) },
            "cuStreamDestroy_v2",
        )
    }

    /// Block until all work on the device is done (`cuCtxSynchronize`).
    pub fn synchronize_all(&self) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        check(result::ctx::synchronize(), "cuCtxSynchronize")
    }

    /// Block until all work queued on `stream` is done (`cuStreamSynchronize`).
    pub fn synchronize(&self, stream: CudaStream) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: the stream handle is the default stream or one the caller
        // created in this context and keeps alive while it uses it here.
        check(
            unsafe { result::stream::synchronize(stream.as_raw()) },
            "cuStreamSynchronize",
        )
    }
}

/// Restores the context that was current before a call.
struct Bound {
    /// The context to make current again (null: none), if we changed it.
    restore: Option<sys::CUcontext>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was current on this thread just before (or is
            // null, which unbinds); best effort, see the crate docs.
            let _ = unsafe { result::ctx::set_current(prev) };
        }
    }
}

/// Whether the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: this only tries to dlopen the candidate library names and
    // closes them again; no driver function is called.
    unsafe { sys::is_culib_present() }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if !self.unreleased.is_empty() {
            if let Ok(_bound) = self.bind() {
                self.release_unreleased();
            }
        }
        let exported: Vec<u64> = self.exported.keys().copied().collect();
        for addr in exported {
            self.forget_export(addr);
        }
        // Other processes' pages still mapped here: unmapped, best effort.
        let imported: Vec<u64> = self.imported.keys().copied().collect();
        for base in imported {
            let _ = self.vm_close_import(DevicePtr(base));
        }
        self.release_peers();
        // SAFETY: releases the reference taken by cuDevicePrimaryCtxRetain in `new`.
        let r = unsafe { result::primary_ctx::release(self.device) };
        let _ = check(r, "cuDevicePrimaryCtxRelease_v2"); // nothing to report it to
    }
}

impl DeviceBackend for CudaBackend {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Error = CudaError;

    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<CudaError>> {
        let _bound = self.bind().map_err(MallocError::Other)?;
        let _relaxed = self.relaxed_if_capturing().map_err(MallocError::Other)?;
        // SAFETY: a plain device allocation in the current (primary) context;
        // the pointer is freed only through `free` below.
        match unsafe { result::malloc_sync(size as usize) } {
            Ok(p) => Ok(DevicePtr(p)),
            Err(e) if is_out_of_memory(&e) => Err(MallocError::OutOfMemory),
            Err(e) => Err(MallocError::Other(driver_error(e, "cuMemAlloc_v2"))),
        }
    }

    fn free(&mut self, ptr: DevicePtr, _size: u64) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: the allocator frees only whole segments it obtained from
        // `malloc` above, once each.
        check(unsafe { result::free_sync(ptr.0) }, "cuMemFree_v2")
    }

    fn event_create(&mut self) -> Result<CudaEvent, CudaError> {
        let _bound = self.bind()?;
        let e = check(
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
            "cuEventCreate",
        )?;
        Ok(CudaEvent(e))
    }

    fn event_record(&mut self, event: &CudaEvent, stream: CudaStream) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: `event` was created by `event_create` and not destroyed;
        // the stream belongs to this context.
        check(
            unsafe { result::event::record(event.0, stream.as_raw()) },
            "cuEventRecord",
        )
    }

    fn event_query(&mut self, event: &CudaEvent) -> Result<EventStatus, CudaError> {
        let _bound = self.bind()?;
        // SAFETY: `event` is a live event from `event_create`.
        match unsafe { result::event::query(event.0) } {
            Ok(()) => Ok(EventStatus::Ready),
            Err(e) if is_not_ready(&e) => Ok(EventStatus::Pending),
            Err(e) => Err(driver_error(e, "cuEventQuery")),
        }
    }

    fn event_synchronize(&mut self, event: &CudaEvent) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: `event` is a live event from `event_create`.
        check(
            unsafe { result::event::synchronize(event.0) },
            "cuEventSynchronize",
        )
    }

    fn stream_wait_event(
        &mut self,
        stream: CudaStream,
        event: &CudaEvent,
    ) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`, recorded; a stream of
        // this context the caller keeps alive.
        check(
            unsafe {
                result::stream::wait_event(
                    stream.as_raw(),
                    event.0,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            },
            "cuStreamWaitEvent",
        )
    }

    fn event_destroy(&mut self, event: &CudaEvent) -> Result<(), CudaError> {
        let _bound = self.bind()?;
        // SAFETY: a live event from `event_create`; the allocator drops its
        // handle once this succeeds, so it is destroyed once (a second
        // destroy would be the driver's error, not UB).
        check(
            unsafe { result::event::destroy(event.0) },
            "cuEventDestroy_v2",
        )
    }

    fn mem_info(&mut self) -> Result<MemInfo, CudaError> {
        let _bound = self.bind()?;
        let _relaxed = self.relaxed_if_capturing()?;
        let (free, total) = check(result::mem_get_info(), "cuMemGetInfo_v2")?;
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
        streams: &mut dyn Iterator<Item = CudaStream>,
    ) -> Result<Option<u32>, CudaError> {
        self.graph_free_marker(streams)
    }

    fn capture_walk(&mut self, stream: CudaStream) -> Result<bool, CudaError> {
        self.graph_walk(stream)
    }

    fn capture_marker_reached(&mut self, stream: CudaStream, marker: u32) -> bool {
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

    const PLATFORM: &'static str = "CUDA";
    const NAME: &'static str = "the CUDA backend";
    const VIRTUAL_MEMORY: bool = true;

    fn device_total_memory(&mut self) -> Result<u64, CudaError> {
        self.vm_total_memory()
    }

    fn allocation_granularity(&mut self) -> Result<u64, VmError<CudaError>> {
        self.vm_granularity()
    }

    fn reserve_address_space(&mut self, size: u64) -> Result<DevicePtr, VmError<CudaError>> {
        let _relaxed = self.relaxed_if_capturing().map_err(VmError::Other)?;
        self.vm_reserve(size)
    }

    fn release_address_space(
        &mut self,
        ptr: DevicePtr,
        size: u64,
    ) -> Result<(), VmError<CudaError>> {
        self.vm_free(ptr, size)
    }

    fn map_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<CudaError>> {
        let _relaxed = self.relaxed_if_capturing().map_err(VmError::Other)?;
        self.vm_map(ptr, pages, page_size)
    }

    fn unmap_pages(
        &mut self,
        ptr: DevicePtr,
        pages: u64,
        page_size: u64,
    ) -> Result<(), VmError<CudaError>> {
        self.vm_unmap(ptr, pages, page_size)
    }

    fn ipc_export_pages(
        &mut self,
        ptr: DevicePtr,
        page_size: u64,
        fds: &mut [i32],
    ) -> Result<(), VmError<CudaError>> {
        self.vm_export(ptr, page_size, fds)
    }

    fn ipc_import_pages(
        &mut self,
        pid: u32,
        fds: &[i32],
        page_size: u64,
    ) -> Result<DevicePtr, VmError<CudaError>> {
        self.vm_import(pid, fds, page_size)
    }

    fn ipc_close_pages(&mut self, base: DevicePtr) -> Result<(), VmError<CudaError>> {
        self.vm_close_import(base)
    }

    fn synchronize_stream(&mut self, stream: CudaStream) -> Result<(), CudaError> {
        self.synchronize(stream)
    }

    fn ipc_get_handle(&mut self, base: DevicePtr) -> Result<IpcMemHandle, VmError<CudaError>> {
        self.ipc_handle(base)
    }

    fn ipc_open_handle(&mut self, handle: &IpcMemHandle) -> Result<DevicePtr, VmError<CudaError>> {
        self.ipc_open(handle)
    }

    fn ipc_close_handle(&mut self, base: DevicePtr) -> Result<(), VmError<CudaError>> {
        self.ipc_close(base)
    }

    fn enable_peer_access(&mut self, peer: u32) -> Result<PeerAccess, VmError<CudaError>> {
        self.peer_access(peer)
    }

    fn memcpy_async(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: CudaStream,
    ) -> Result<(), VmError<CudaError>> {
        self.copy(dst, src, bytes, stream)
    }

    fn memcpy_peer_async(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: CudaStream,
    ) -> Result<(), VmError<CudaError>> {
        self.copy_peer(dst, dst_device, src, src_device, bytes, stream)
    }
}
