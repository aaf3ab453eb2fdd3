//! The [`DeviceBackend`] trait: everything the allocator asks of a device.
//!
//! Backends know nothing of blocks or pools. The allocator calls `malloc`
//! only on a cache miss and `free` only for whole segments it releases.

use core::fmt;

/// A device address. `DevicePtr::NULL` is what a zero-byte request returns.
///
/// ```
/// use cachealloc_core::DevicePtr;
/// assert!(DevicePtr::NULL.is_null());
/// assert_eq!(DevicePtr(0x1000).offset(0x200), Some(DevicePtr(0x1200)));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Whether this is the null pointer.
    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// `self + bytes`, or `None` on overflow.
    pub const fn offset(self, bytes: u64) -> Option<DevicePtr> {
        match self.0.checked_add(bytes) {
            Some(v) => Some(DevicePtr(v)),
            None => None,
        }
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Why a device `malloc` failed: out of memory (the allocator then runs its
/// release-and-retry ladder) or any other error (returned to the caller at
/// once, as PyTorch does for every CUDA error but `cudaErrorMemoryAllocation`).
///
/// ```
/// use cachealloc_core::MallocError;
/// let e: MallocError<&str> = MallocError::OutOfMemory;
/// assert!(e.is_out_of_memory());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MallocError<E> {
    /// The device has no room for the request.
    OutOfMemory,
    /// Any other failure.
    Other(E),
}

impl<E> MallocError<E> {
    /// Whether this is an out-of-memory failure.
    pub const fn is_out_of_memory(&self) -> bool {
        matches!(self, MallocError::OutOfMemory)
    }
}

/// Why a virtual-memory call of a backend failed (see
/// [`DeviceBackend::VIRTUAL_MEMORY`]).
///
/// ```
/// use cachealloc_core::VmError;
/// let e: VmError<&str> = VmError::Unsupported;
/// assert!(!e.is_out_of_memory());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmError<E> {
    /// The backend has no virtual memory (the default of every call).
    Unsupported,
    /// The device has no room for the pages.
    OutOfMemory,
    /// Any other failure.
    Other(E),
}

impl<E> VmError<E> {
    /// Whether this is an out-of-memory failure.
    pub const fn is_out_of_memory(&self) -> bool {
        matches!(self, VmError::OutOfMemory)
    }
}

/// A driver's handle to share a device allocation with another process
/// (`cudaIpcMemHandle_t`, `hipIpcMemHandle_t`: 64 opaque bytes). The backend
/// gives one for the base of a segment it allocated; another process (or
/// allocator) opens it to map the same memory.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle(pub [u8; 64]);

impl fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcMemHandle(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// What [`DeviceBackend::enable_peer_access`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerAccess {
    /// Access was enabled by this call.
    Enabled,
    /// Access was already enabled (`cudaErrorPeerAccessAlreadyEnabled`, which
    /// PyTorch clears and ignores).
    AlreadyEnabled,
}

/// The state of an event. A pending event is a status, never an error.
///
/// ```
/// use cachealloc_core::EventStatus;
/// assert_ne!(EventStatus::Pending, EventStatus::Ready);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventStatus {
    /// The work recorded before the event has finished.
    Ready,
    /// The work is still running.
    Pending,
}

/// Free and total device memory, as `cudaMemGetInfo` reports them.
///
/// ```
/// use cachealloc_core::MemInfo;
/// let m = MemInfo { free: 1 << 30, total: 2 << 30 };
/// assert!(m.free <= m.total);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// Bytes the device could still hand out.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// A device: memory, events and memory information. Nothing else is
/// required of a backend.
///
/// A stream is its raw handle value: the allocator keeps it as a `u64`
/// (`Into<u64>`) and orders free blocks by it, exactly as PyTorch orders its
/// free sets by the unsigned stream handle, and gives it back in snapshots
/// (`From<u64>`).
///
/// ```
/// use cachealloc_core::{DeviceBackend, DevicePtr, EventStatus, MallocError, MemInfo};
///
/// /// A device with 1 GiB that finishes all work at once.
/// struct Toy { next: u64, held: u64 }
///
/// /// Its errors (it has none).
/// #[derive(Debug)]
/// struct ToyError;
/// impl core::fmt::Display for ToyError {
///     fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result { f.write_str("toy") }
/// }
/// impl core::error::Error for ToyError {}
///
/// impl DeviceBackend for Toy {
///     type Stream = u64;
///     type Event = ();
///     type Error = ToyError;
///     fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<Self::Error>> {
///         if self.held + size > 1 << 30 { return Err(MallocError::OutOfMemory); }
///         let p = self.next;
///         self.next += size.div_ceil(2 << 20) * (2 << 20);
///         self.held += size;
///         Ok(DevicePtr(p))
///     }
///     fn free(&mut self, _ptr: DevicePtr, size: u64) -> Result<(), Self::Error> {
///         self.held -= size;
///         Ok(())
///     }
///     fn event_create(&mut self) -> Result<(), Self::Error> { Ok(()) }
///     fn event_record(&mut self, _e: &(), _s: u64) -> Result<(), Self::Error> { Ok(()) }
///     fn event_query(&mut self, _e: &()) -> Result<EventStatus, Self::Error> { Ok(EventStatus::Ready) }
///     fn event_destroy(&mut self, _e: &()) -> Result<(), Self::Error> { Ok(()) }
///     fn mem_info(&mut self) -> Result<MemInfo, Self::Error> {
///         Ok(MemInfo { free: (1 << 30) - self.held, total: 1 << 30 })
///     }
/// }
/// let mut t = Toy { next: 1 << 32, held: 0 };
/// assert_eq!(t.malloc(1).unwrap(), DevicePtr(1 << 32));
/// ```
pub trait DeviceBackend {
    /// A stream (a queue of device work). `0` is conventionally the default stream.
    type Stream: Copy + Eq + fmt::Debug + Into<u64> + From<u64> + 'static;
    /// An event that can be recorded on a stream and queried.
    type Event;
    /// The backend's error: a `core::error::Error`, which
    /// [`Error::Backend`](crate::Error::Backend) gives as its `source()`.
    type Error: core::error::Error + 'static;

    /// Allocate `size` bytes of device memory (one segment). The allocator
    /// hands out blocks at multiples of 512 bytes from the segment's base,
    /// so the base must be at least 512-byte aligned for those blocks (and
    /// `malloc_aligned` up to 512) to be aligned: the drivers give segments
    /// of 2 MiB and more at 2 MiB boundaries in practice (CUDA documents
    /// 256 bytes).
    fn malloc(&mut self, size: u64) -> Result<DevicePtr, MallocError<Self::Error>>;
    /// Return a segment obtained from [`malloc`](Self::malloc), whole.
    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), Self::Error>;
    /// Create an event (timing disabled).
    fn event_create(&mut self) -> Result<Self::Event, Self::Error>;
    /// Record `event` on `stream`: it completes when the stream's work queued so far has.
    fn event_record(
        &mut self,
        event: &Self::Event,
        stream: Self::Stream,
    ) -> Result<(), Self::Error>;
    /// Whether `event` has completed.
    fn event_query(&mut self, event: &Self::Event) -> Result<EventStatus, Self::Error>;
    /// Destroy an event. The caller drops its handle only when this
    /// succeeds (so a failed destroy leaves the event with the caller, to
    /// retry, rather than lost).
    fn event_destroy(&mut self, event: &Self::Event) -> Result<(), Self::Error>;
    /// Free and total device memory.
    fn mem_info(&mut self) -> Result<MemInfo, Self::Error>;

    /// Block the host until `event` has completed. The provided method polls
    /// [`event_query`](Self::event_query); backends with a blocking wait
    /// (`cuEventSynchronize`) or a simulated clock override it.
    fn event_synchronize(&mut self, event: &Self::Event) -> Result<(), Self::Error> {
        loop {
            match self.event_query(event)? {
                EventStatus::Ready => return Ok(()),
                EventStatus::Pending => core::hint::spin_loop(),
            }
        }
    }

    /// Make `stream`'s work queued from now on wait, on the device, until
    /// `event` has completed (`cuStreamWaitEvent`): how the compact policy
    /// hands a block freed on one stream to another without the host
    /// waiting. The wait takes the event as recorded now; the caller may
    /// record it again afterwards. The provided one waits on the host
    /// ([`event_synchronize`](Self::event_synchronize)), which is correct
    /// but blocks.
    fn stream_wait_event(
        &mut self,
        _stream: Self::Stream,
        event: &Self::Event,
    ) -> Result<(), Self::Error> {
        self.event_synchronize(event)
    }

    /// The device's ordinal, used in out-of-memory messages ("GPU 0 has ...").
    fn ordinal(&self) -> u32 {
        0
    }

    /// A monotonic clock for the memory history's `time_us` (PyTorch's is
    /// microseconds since the Unix epoch). The provided one is always 0; a
    /// simulated device can count.
    fn time_us(&mut self) -> u64 {
        0
    }

    /// Whether a stream capture (a CUDA graph being recorded) is under way
    /// on this device. The allocator says `true` when the first capture
    /// begins (`capture_begin`, before the runtime begins capturing) and
    /// `false` when the last one ends (`capture_end`, after the runtime
    /// ended it). In between it calls only [`malloc`](Self::malloc),
    /// [`mem_info`](Self::mem_info) and the calls that map pages
    /// ([`device_total_memory`](Self::device_total_memory),
    /// [`allocation_granularity`](Self::allocation_granularity),
    /// [`reserve_address_space`](Self::reserve_address_space),
    /// [`map_pages`](Self::map_pages)), and the IPC calls its caller asks
    /// for: never a free, an unmap, an event record, query or
    /// synchronization, or a stream synchronization. A GPU backend makes
    /// those calls in relaxed capture mode (PyTorch's
    /// `cudaMallocMaybeCapturing`), so that the driver's default (global)
    /// mode does not refuse them and invalidate the capture. The provided
    /// one ignores it.
    fn set_capture_underway(&mut self, _underway: bool) {}

    /// The platform's name in messages, as PyTorch prints it: "CUDA out of
    /// memory", "PYTORCH_CUDA_ALLOC_CONF" (PyTorch on ROCm says "HIP").
    const PLATFORM: &'static str = "CUDA";

    /// The backend's name in messages ("the CUDA backend", "the simulated
    /// device").
    const NAME: &'static str = "this backend";

    // ----------------------------------------------- virtual memory (optional)

    /// Whether the backend implements the virtual-memory calls below, which
    /// expandable segments (`expandable_segments:True`) need: PyTorch's
    /// `ExpandableSegment` over `cuMemAddressReserve`, `cuMemCreate`,
    /// `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease` and
    /// `cuMemAddressFree`. A backend without them keeps the defaults, which
    /// refuse with [`VmError::Unsupported`].
    const VIRTUAL_MEMORY: bool = false;

    /// The device's total memory (`cudaDeviceProp::totalGlobalMem`), which
    /// sizes an expandable segment's reservation. The provided one is
    /// [`mem_info`](Self::mem_info)'s total.
    fn device_total_memory(&mut self) -> Result<u64, Self::Error> {
        Ok(self.mem_info()?.total)
    }

    /// The granularity physical memory is created and mapped in
    /// (`cuMemGetAllocationGranularity`, minimum): expandable segments map
    /// pages of 2 MiB (small pool) and 20 MiB (large pool), which must be
    /// multiples of it.
    fn allocation_granularity(&mut self) -> Result<u64, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Reserve `size` bytes of device address space, with no memory behind
    /// it (`cuMemAddressReserve`).
    fn reserve_address_space(&mut self, _size: u64) -> Result<DevicePtr, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Give back a reservation made by
    /// [`reserve_address_space`](Self::reserve_address_space), with no page
    /// mapped in it (`cuMemAddressFree`).
    fn release_address_space(
        &mut self,
        _ptr: DevicePtr,
        _size: u64,
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Back `pages` pages of `page_size` bytes from `ptr` (inside a
    /// reservation, none of them mapped) with new physical memory, one
    /// allocation per page (`cuMemCreate`, `cuMemMap`, `cuMemSetAccess`),
    /// all or nothing: when one page cannot be had, those made in this call
    /// are released again and the call fails ([`VmError::OutOfMemory`] when
    /// the device is full).
    fn map_pages(
        &mut self,
        _ptr: DevicePtr,
        _pages: u64,
        _page_size: u64,
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Unmap `pages` mapped pages of `page_size` bytes from `ptr` and
    /// release their memory (`cuMemUnmap`, `cuMemRelease`).
    fn unmap_pages(
        &mut self,
        _ptr: DevicePtr,
        _pages: u64,
        _page_size: u64,
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// An IPC handle for the segment that starts at `base`
    /// (`cuIpcGetMemHandle`). Optional: the default says unsupported.
    fn ipc_get_handle(&mut self, _base: DevicePtr) -> Result<IpcMemHandle, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Map the memory of another process's (or allocator's) handle here and
    /// return its base (`cuIpcOpenMemHandle` with lazy peer access).
    fn ipc_open_handle(
        &mut self,
        _handle: &IpcMemHandle,
    ) -> Result<DevicePtr, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Unmap memory opened by [`ipc_open_handle`](Self::ipc_open_handle)
    /// (`cuIpcCloseMemHandle`).
    fn ipc_close_handle(&mut self, _base: DevicePtr) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// The physical memory of the `fds.len()` mapped pages of `page_size`
    /// bytes from `ptr` (pages of an expandable segment), as POSIX file
    /// descriptors of this process, one a page, written to `fds`
    /// (`cuMemExportToShareableHandle`): what PyTorch's `'e'` IPC handle
    /// sends with this process's pid. A page keeps its descriptor (the
    /// same one when shared again) until it is unmapped, which closes it.
    /// Optional: the default says unsupported.
    fn ipc_export_pages(
        &mut self,
        _ptr: DevicePtr,
        _page_size: u64,
        _fds: &mut [i32],
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Map here the pages process `pid` exported as descriptors `fds`
    /// ([`ipc_export_pages`](Self::ipc_export_pages)), each `page_size`
    /// bytes: take the descriptors (`pidfd_getfd`), import them
    /// (`cuMemImportFromShareableHandle`), reserve exactly the address
    /// space they fill, map them there and grant this device access. The
    /// base of the range; on a failure nothing stays imported, reserved
    /// or mapped.
    fn ipc_import_pages(
        &mut self,
        _pid: u32,
        _fds: &[i32],
        _page_size: u64,
    ) -> Result<DevicePtr, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Undo [`ipc_import_pages`](Self::ipc_import_pages) of the range at
    /// `base`: unmap and release its pages, free its reservation.
    fn ipc_close_pages(&mut self, _base: DevicePtr) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Let this device access the memory of device `peer`
    /// (`cudaDeviceEnablePeerAccess`).
    fn enable_peer_access(&mut self, _peer: u32) -> Result<PeerAccess, VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Queue a copy of `bytes` from `src` to `dst` on `stream`
    /// (`cuMemcpyAsync`; the addresses may be on other devices with peer
    /// access, or opened IPC memory).
    fn memcpy_async(
        &mut self,
        _dst: DevicePtr,
        _src: DevicePtr,
        _bytes: u64,
        _stream: Self::Stream,
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Queue a copy of `bytes` from `src` on device `src_device` to `dst` on
    /// device `dst_device` on `stream`, through the driver's peer copy
    /// (`cuMemcpyPeerAsync`), which needs no peer access and also moves
    /// memory that is not the driver's plain allocations (expandable
    /// segments). Optional: the default says unsupported.
    fn memcpy_peer_async(
        &mut self,
        _dst: DevicePtr,
        _dst_device: u32,
        _src: DevicePtr,
        _src_device: u32,
        _bytes: u64,
        _stream: Self::Stream,
    ) -> Result<(), VmError<Self::Error>> {
        Err(VmError::Unsupported)
    }

    /// Block the host until the work queued on `stream` is done (PyTorch
    /// synchronizes a segment's stream before unmapping its pages). The
    /// provided one does nothing: only backends with virtual memory are
    /// asked.
    fn synchronize_stream(&mut self, _stream: Self::Stream) -> Result<(), Self::Error> {
        Ok(())
    }

    // ------------------------------------------ capture graphs (optional)

    /// Whether the backend reads the graph a capture is building
    /// (`cudaStreamGetCaptureInfo`, `cudaGraphNodeGetDependencies`), which
    /// `graph_capture_record_stream_reuse:True` needs: PyTorch's proof that
    /// a block freed during a capture, used by other streams, may be handed
    /// out again within it. A backend without it keeps the defaults below,
    /// and an allocator configured for the reuse refuses to start on it.
    const CAPTURE_GRAPH: bool = false;

    /// PyTorch's `record_free_markers`: the current terminal nodes of the
    /// capture of every stream in `streams` (a freed block's allocation
    /// stream and the streams that used it), kept by the backend under a new
    /// marker number (never [`NO_MARKER`]). `None` when one of the streams
    /// is not capturing (the block then waits for the capture's end).
    fn capture_free_marker(
        &mut self,
        _streams: &mut dyn Iterator<Item = Self::Stream>,
    ) -> Result<Option<u32>, Self::Error> {
        Ok(None)
    }

    /// PyTorch's `update_visited`: add to `stream`'s record of its capture's
    /// nodes those that precede (or are) the stream's current terminal
    /// nodes, by a walk up the dependencies. `false` when the stream is not
    /// capturing or has no terminal node (nothing can be reused).
    fn capture_walk(&mut self, _stream: Self::Stream) -> Result<bool, Self::Error> {
        Ok(false)
    }

    /// Whether every node of `marker` is among those [`capture_walk`](Self::capture_walk)
    /// found for `stream`: all later work on the stream runs after the
    /// block's last uses.
    fn capture_marker_reached(&mut self, _stream: Self::Stream, _marker: u32) -> bool {
        false
    }

    /// Forget `marker` (its block was reused, or settled after the capture).
    fn capture_marker_drop(&mut self, _marker: u32) {}
}

/// The marker number no marker has: a parked block without one waits for
/// the capture's end.
pub const NO_MARKER: u32 = u32::MAX;
