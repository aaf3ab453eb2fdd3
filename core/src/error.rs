//! One error enum for every public operation.

use crate::backend::DevicePtr;
use crate::oom_cause::{OomCause, OomClass};
use crate::policy::FormatSize;
use crate::private_pool::MempoolId;
use crate::torch_version::TorchVersion;
use core::fmt;

/// The numbers of PyTorch's out-of-memory message. `Display` writes that
/// message ("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a
/// total capacity of ..."; "HIP out of memory" on a HIP backend).
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// use cachealloc_core::{BlockSlot, Config, DeviceAllocator, Error};
/// let mut a = DeviceAllocator::new(MockDevice::with_capacity(20 << 20), [BlockSlot::VACANT; 8], Config::DEFAULT);
/// let Err(Error::OutOfMemory(r)) = a.malloc(30 << 20, 0) else { panic!() };
/// assert_eq!((r.requested, r.alloc_size, r.platform), (30 << 20, 30 << 20, "CUDA"));
/// assert!(r.to_string().starts_with("CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OomReport {
    /// The platform, as PyTorch names it in the message ("CUDA", "HIP").
    pub platform: &'static str,
    /// The device ordinal.
    pub device: u32,
    /// The bytes the caller asked for.
    pub requested: u64,
    /// The request rounded to a block size.
    pub rounded: u64,
    /// The segment size that would have been device-malloc'd (PyTorch's "Tried to allocate").
    pub alloc_size: u64,
    /// Device memory in all (from `mem_info`; 0 if it failed).
    pub device_total: u64,
    /// Device memory free (from `mem_info`; 0 if it failed).
    pub device_free: u64,
    /// The per-process limit, when a memory fraction or limit is set.
    pub allowed: Option<u64>,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// `reserved_bytes.all.current`.
    pub reserved: u64,
    /// Bytes of the cached (free) blocks of private pools: PyTorch adds
    /// them to what "is allocated by PyTorch" and names them.
    pub private_pools: u64,
    /// Why it ran out: the verdict's class. The verdict with the bytes
    /// behind it ([`OomCause`]) is kept by the allocator under this
    /// report's [`seq`](Self::seq)
    /// ([`DeviceAllocator::oom_cause`](crate::DeviceAllocator::oom_cause))
    /// and given to the out-of-memory observers, not carried here: every
    /// result is as large as this error.
    pub class: OomClass,
    /// The device's number for this out-of-memory (1 for its first,
    /// rejections counted too, wrapping): the verdict is found by it.
    pub seq: u32,
    /// The torch release whose message is written (2.15 adds sentences).
    pub torch: TorchVersion,
    /// Whether expandable segments were on (torch 2.15 then says so in
    /// place of the advice to turn them on).
    pub expandable_segments: bool,
}

impl OomReport {
    /// PyTorch's message alone, without cachealloc's classification.
    pub fn pytorch_message(&self) -> PytorchMessage<'_> {
        PytorchMessage(self)
    }

    /// PyTorch's message, then the verdict with its bytes ("cachealloc:
    /// fragmentation: 150.00 MiB is cached ..."): `cause` is this
    /// out-of-memory's ([`DeviceAllocator::last_oom_cause`](crate::DeviceAllocator::last_oom_cause),
    /// or an observer's).
    pub fn explained<'a>(&'a self, cause: &'a OomCause) -> Explained<'a> {
        Explained(self, cause)
    }
}

impl fmt::Display for OomReport {
    /// PyTorch's message, then the verdict's class ("cachealloc:
    /// fragmentation."); [`explained`](Self::explained) adds its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} cachealloc: {}.",
            self.pytorch_message(),
            self.class.as_str()
        )
    }
}

/// PyTorch's out-of-memory message and the verdict with its bytes
/// ([`OomReport::explained`]).
#[derive(Clone, Copy, Debug)]
pub struct Explained<'a>(&'a OomReport, &'a OomCause);

impl fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.0.pytorch_message(), self.1)
    }
}

/// PyTorch's out-of-memory message for an [`OomReport`], exactly
/// ([`OomReport::pytorch_message`]): the pieces and the documentation link
/// of the `libc10_cuda.so` strings of torch 2.11 to 2.15 (the link was
/// pytorch.org's `#environment-variables` before). Not here: the "Process
/// N has X memory in use" lines torch adds where NVML answers. torch 2.15's
/// sentences for expandable segments' address space and for a `MemPool`
/// allocator that returned null are written for 2.15.
#[derive(Clone, Copy, Debug)]
pub struct PytorchMessage<'a>(&'a OomReport);

impl fmt::Display for PytorchMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.0;
        if r.class == OomClass::Rejected {
            return write!(
                f,
                "{} out of memory. Allocation was preemptively rejected because it would exceed per_process_memory_fraction limit. Requested size: {}",
                r.platform,
                FormatSize(r.requested)
            );
        }
        write!(
            f,
            "{} out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
            r.platform,
            FormatSize(r.alloc_size),
            r.device,
            FormatSize(r.device_total),
            FormatSize(r.device_free)
        )?;
        if let Some(allowed) = r.allowed {
            write!(f, "{} allowed; ", FormatSize(allowed))?;
        }
        let allocated = r.allocated.saturating_add(r.private_pools);
        write!(
            f,
            "Of the allocated memory {} is allocated by PyTorch, ",
            FormatSize(allocated)
        )?;
        if r.private_pools > 0 {
            write!(
                f,
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                FormatSize(r.private_pools)
            )?;
        }
        write!(
            f,
            "and {} is reserved by PyTorch but unallocated.",
            FormatSize(r.reserved.saturating_sub(allocated)),
        )?;
        // torch 2.15 (its wheel's `malloc`): with expandable segments on,
        // a sentence on their address space instead of the advice to turn
        // them on; after everything, one for a pool's allocator that
        // returned null.
        let since_2_15 = r.torch.decisions_of() >= TorchVersion::V2_15;
        if since_2_15 && r.expandable_segments {
            write!(
                f,
                " expandable_segments is enabled. If instead the process is running out of virtual address space (VSZ), \
                 expandable segments may be over-reserving VA (each segment reserves ~9/8 of device memory, times the number of streams); \
                 reduce it via PYTORCH_{}_ALLOC_CONF expandable_segments_reserve / expandable_segments_reserve_by_class.",
                r.platform
            )?;
        } else {
            write!(
                f,
                " If reserved but unallocated memory is large try setting PYTORCH_{}_ALLOC_CONF=expandable_segments:True \
                 to avoid fragmentation.  See documentation for Memory Management  \
                 (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
                r.platform
            )?;
        }
        if since_2_15 && r.class == OomClass::PoolAllocator {
            write!(
                f,
                " The custom allocator backing this MemPool returned nullptr. Check preceding allocator warnings or logs for the underlying cause. \
                 This can indicate an allocator-specific error or memory constraint, even when device-wide free memory is available."
            )?;
        }
        Ok(())
    }
}

/// What went wrong. Every variant leaves the allocator consistent; all but
/// `OutOfMemory` and `Backend` (which may follow cache releases, as in
/// PyTorch) leave it exactly as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error<E> {
    /// No cached block fits and the device (or the memory limit) cannot supply a segment.
    OutOfMemory(OomReport),
    /// A request of 1 EiB or more, refused before the allocator (no `num_ooms`).
    TooLarge {
        /// The bytes asked for.
        requested: u64,
        /// The platform, as in [`OomReport::platform`].
        platform: &'static str,
    },
    /// Rounding the request overflowed 64 bits.
    SizeOverflow {
        /// The bytes asked for.
        requested: u64,
    },
    /// All block slots are in use (malloc keeps two in reserve).
    MetadataExhausted {
        /// The number of slots the storage has.
        capacity: u32,
    },
    /// The queue of pending end-of-life events is full.
    EventQueueFull {
        /// Its capacity.
        capacity: usize,
    },
    /// The table of streams recorded by `record_stream` is full.
    StreamUsesFull {
        /// Its capacity.
        capacity: usize,
    },
    /// A handle whose slot does not exist or holds no allocation.
    InvalidHandle {
        /// The slot index of the handle.
        index: u32,
    },
    /// A handle of an allocation that was already freed (double free or use after free).
    StaleHandle {
        /// The slot index of the handle.
        index: u32,
        /// The generation the handle carries.
        generation: u32,
    },
    /// A pointer in no segment of this allocator.
    UnknownPointer {
        /// The pointer.
        ptr: DevicePtr,
    },
    /// A pointer inside a live allocation, not at its start.
    InteriorPointer {
        /// The pointer.
        ptr: DevicePtr,
        /// The start of the allocation that contains it.
        base: DevicePtr,
    },
    /// A pointer to cached or pending memory, not a live allocation (double free?).
    NotAllocated {
        /// The pointer.
        ptr: DevicePtr,
    },
    /// An alignment that is zero or not a power of two.
    BadAlignment {
        /// The alignment asked for.
        alignment: u64,
    },
    /// A memory fraction outside `[0, 1]`.
    InvalidFraction,
    /// A device number beyond those of a `MultiDeviceAllocator`.
    NoSuchDevice {
        /// The device number.
        device: u32,
    },
    /// Every entry of the private-pool table holds a pool.
    PoolTableFull {
        /// The table's capacity (`P`).
        capacity: usize,
    },
    /// No private pool has this id (or it is `(0, 0)`, the default pools,
    /// where a private pool is needed).
    UnknownPool {
        /// The id.
        id: MempoolId,
    },
    /// `begin_allocate_to_pool` of a pool already routed to (PyTorch:
    /// "beginAllocateToPool: already recording to mempool_id").
    AlreadyRouting {
        /// The id.
        id: MempoolId,
    },
    /// `end_allocate_to_pool` (or `capture_end`) of a pool not routed to (or
    /// not captured into).
    NotRouting {
        /// The id.
        id: MempoolId,
    },
    /// A pool whose use count reached 0 (freeable) cannot be used again
    /// until `empty_cache` deletes it.
    PoolFreeable {
        /// The id.
        id: MempoolId,
    },
    /// A buffer the caller gave holds fewer entries than needed (the
    /// descriptors of `share_ipc_pages`); nothing changed.
    BufferTooSmall {
        /// Entries needed.
        needed: usize,
    },
    /// Shared pages described inconsistently: a page count that is not
    /// the number of descriptors given, or none, a size (page size times
    /// pages) beyond 64 bits, or an offset outside it.
    BadIpcPages {
        /// Pages the share says.
        pages: u32,
        /// Descriptors given.
        fds: usize,
    },
    /// `malloc_with_address` at an address that is not a multiple of 512
    /// (PyTorch's `mallocWithAddress` check).
    UnalignedAddress {
        /// The address.
        ptr: DevicePtr,
    },
    /// `malloc_with_address`: no free block of the request's stream and
    /// pool holds the address with room for the rounded size there.
    NoFreeBlockAt {
        /// The address.
        ptr: DevicePtr,
        /// The rounded size.
        size: u64,
    },
    /// A pool with a segment source of its own must be a new pool: pool
    /// `id` exists already (PyTorch asserts this in
    /// `create_or_incref_pool`).
    PoolExists {
        /// The id.
        id: MempoolId,
    },
    /// A pool checkpoint cannot be taken or restored (PyTorch's checks of
    /// `getCheckpointState` / `setCheckpointPoolState`); nothing changed.
    Checkpoint {
        /// What is wrong.
        what: &'static str,
        /// The block or segment involved (null when none).
        ptr: DevicePtr,
    },
    /// The table of IPC handles opened by this allocator is full.
    IpcTableFull {
        /// Its capacity.
        capacity: usize,
    },
    /// A close of an IPC handle this allocator has not opened (or closed
    /// as often as it was opened).
    IpcNotOpen,
    /// The table of allocations shared with other processes is full.
    IpcSharesFull {
        /// Its capacity.
        capacity: usize,
    },
    /// A release of a share of an allocation that has none outstanding.
    IpcNotShared {
        /// The allocation's address.
        ptr: DevicePtr,
    },
    /// A call into a thread-safe front end from a callback that runs while
    /// a device's lock is held (a trace tracker, a segment source, a stream
    /// filter, a free-memory callback) found the lock it needs held: it may
    /// be the one held around the callback, which it would wait for for
    /// ever (with `std`; without it such a call deadlocks).
    CalledFromCallback,
    /// A live allocation that cannot be shared with another process as a
    /// handle, on any device ([`NotShareable`] says why).
    IpcNotShareable {
        /// The allocation's address.
        ptr: DevicePtr,
        /// Why.
        why: NotShareable,
    },
    /// The backend cannot do what the configuration asks (expandable
    /// segments need virtual memory).
    Unsupported {
        /// What was asked.
        what: &'static str,
        /// The backend ([`DeviceBackend::NAME`](crate::DeviceBackend::NAME)).
        backend: &'static str,
    },
    /// The backend broke its contract (a null or overlapping segment).
    BackendContract {
        /// What it did.
        what: &'static str,
        /// The address involved.
        ptr: DevicePtr,
    },
    /// An operation that must not run while a stream capture is under way
    /// on the device (it would make device calls that invalidate it).
    CaptureUnderway {
        /// The operation.
        what: &'static str,
    },
    /// `markCaptureEnd` on a device with no capture marked
    /// ([`DeviceAllocator::mark_capture_end`](crate::DeviceAllocator::mark_capture_end)).
    NoCaptureMarked,
    /// An earlier call panicked while it held this device's lock, so the
    /// device's metadata may be half-updated: the thread-safe front ends
    /// refuse every later call on it.
    DeviceFailed {
        /// The device's ordinal.
        device: u32,
    },
    /// The table that maps segment addresses to devices is full: the new
    /// segment was given back to the device.
    SegmentTableFull {
        /// Its capacity.
        capacity: usize,
    },
    /// A device holds as many callbacks of this kind as it has room for
    /// (trace trackers, out-of-memory observers).
    CallbacksFull {
        /// The kind ("trace trackers").
        what: &'static str,
        /// How many a device holds.
        capacity: usize,
    },
    /// The backend failed.
    Backend(E),
}

/// Why a live allocation cannot be shared as an IPC handle
/// ([`Error::IpcNotShareable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotShareable {
    /// It lives in an expandable segment: its pages are shared instead
    /// (`share_ipc_pages`).
    ExpandableSegment,
    /// It belongs to a pool whose segments come from its own allocator
    /// (a `SegmentSource`).
    PoolWithSource,
}

impl<E: fmt::Display> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::OutOfMemory(r) => r.fmt(f),
            Error::TooLarge {
                requested,
                platform,
            } => write!(
                f,
                "{platform} out of memory. Tried to allocate more than 1EB memory ({requested} bytes requested)."
            ),
            Error::SizeOverflow { requested } => {
                write!(f, "size overflow: {requested} bytes cannot be rounded to a block size")
            }
            Error::MetadataExhausted { capacity } => write!(
                f,
                "block metadata exhausted: all {capacity} slots in use (malloc keeps 2 in reserve); give the allocator more slots"
            ),
            Error::EventQueueFull { capacity } => {
                write!(f, "pending-event queue full ({capacity} events); free fewer record_stream'd blocks at once")
            }
            Error::StreamUsesFull { capacity } => {
                write!(f, "record_stream table full ({capacity} entries)")
            }
            Error::InvalidHandle { index } => write!(f, "invalid handle: slot {index} holds no allocation"),
            Error::StaleHandle { index, generation } => write!(
                f,
                "stale handle: allocation (slot {index}, generation {generation}) was already freed (double free?)"
            ),
            Error::UnknownPointer { ptr } => write!(f, "invalid device pointer {ptr}: not allocated by this allocator"),
            Error::InteriorPointer { ptr, base } => {
                write!(f, "invalid device pointer {ptr}: inside the allocation at {base}, not its start")
            }
            Error::NotAllocated { ptr } => {
                write!(f, "invalid device pointer {ptr}: not a live allocation (already freed?)")
            }
            Error::InvalidFraction => write!(f, "invalid memory fraction: must be between 0 and 1"),
            Error::NoSuchDevice { device } => write!(f, "no device {device} in this allocator"),
            Error::PoolTableFull { capacity } => write!(
                f,
                "private pool table full ({capacity} pools exist); release pools, or build the allocator with room for more"
            ),
            Error::UnknownPool { id } => write!(f, "no private pool ({}, {})", id.0, id.1),
            Error::AlreadyRouting { id } => write!(
                f,
                "beginAllocateToPool: already recording to mempool_id ({}, {})",
                id.0, id.1
            ),
            Error::NotRouting { id } => write!(
                f,
                "endAllocateToPool: not currently recording to mempool_id ({}, {})",
                id.0, id.1
            ),
            Error::PoolFreeable { id } => write!(
                f,
                "private pool ({}, {}) was released (use count 0) and cannot be used until empty_cache deletes it",
                id.0, id.1
            ),
            Error::BufferTooSmall { needed } => {
                write!(f, "buffer too small: {needed} entries needed")
            }
            Error::BadIpcPages { pages, fds } => write!(
                f,
                "shared pages described wrongly: {pages} page(s) with {fds} descriptor(s) (or a \
                 size beyond 64 bits, or an offset outside them)"
            ),
            Error::UnalignedAddress { ptr } => write!(
                f,
                "mallocWithAddress: addr must be aligned to kMinBlockSize (512 bytes), got {ptr}"
            ),
            Error::NoFreeBlockAt { ptr, size } => write!(
                f,
                "Could not allocate CUDA storage at exact address {ptr}: no free block of the \
                 stream and pool holds {size} bytes there"
            ),
            Error::PoolExists { id } => write!(
                f,
                "private pool ({}, {}) exists: a pool with an allocator of its own must be new",
                id.0, id.1
            ),
            Error::Checkpoint { what, ptr } if ptr.is_null() => write!(f, "pool checkpoint: {what}"),
            Error::Checkpoint { what, ptr } => write!(f, "pool checkpoint: {what} (at {ptr})"),
            Error::IpcTableFull { capacity } => write!(
                f,
                "all {capacity} entries of the table of opened IPC handles are in use: close one first"
            ),
            Error::BadAlignment { alignment } => {
                write!(f, "alignment {alignment} is not a power of two (1, 2, 4, ... bytes)")
            }
            Error::IpcNotOpen => write!(f, "close of an IPC handle that is not open here"),
            Error::IpcSharesFull { capacity } => write!(
                f,
                "all {capacity} entries of the table of allocations shared through IPC are in use: release a share first"
            ),
            Error::CalledFromCallback => write!(
                f,
                "called from a callback that runs under a device's lock (a trace tracker, a \
                 segment source, a stream filter, a free-memory callback), and the lock this \
                 call needs is held: it may be the callback's own, which it would wait for for \
                 ever"
            ),
            Error::IpcNotShareable { ptr, why } => match why {
                NotShareable::ExpandableSegment => write!(
                    f,
                    "{ptr} is a block of an expandable segment: it is shared as its pages \
                     (share_ipc_pages), not as a handle"
                ),
                NotShareable::PoolWithSource => write!(
                    f,
                    "{ptr} is a block of a pool whose segments come from its own allocator: \
                     that memory is the allocator's, not a device allocation the driver can \
                     export (torch's cudaIpcGetMemHandle refuses it too)"
                ),
            },
            Error::IpcNotShared { ptr } => write!(f, "release of an IPC share of {ptr}, which has no share outstanding"),
            Error::Unsupported { what, backend } => write!(f, "{what} is not supported by {backend}"),
            Error::BackendContract { what, ptr } => write!(f, "backend contract violation at {ptr}: {what}"),
            Error::CaptureUnderway { what } => write!(
                f,
                "{what} is refused while a stream capture (CUDA graph) is under way on this device: \
                 it would make device calls that invalidate the capture"
            ),
            Error::NoCaptureMarked => write!(
                f,
                "markCaptureEnd without a markCaptureBegin on this device (no capture is marked)"
            ),
            Error::DeviceFailed { device } => write!(
                f,
                "device {device} failed: an earlier call panicked while it held the device's lock, \
                 so its allocator's metadata may be half-updated; every call on it is refused"
            ),
            Error::SegmentTableFull { capacity } => write!(
                f,
                "the segment table is full ({capacity} segments): give it more entries"
            ),
            Error::CallbacksFull { what, capacity } => write!(
                f,
                "the device has {capacity} {what} already, as many as it holds"
            ),
            Error::Backend(e) => write!(f, "device backend error: {e}"),
        }
    }
}

impl<E> Error<E> {
    /// Whether this is an out-of-memory error (`OutOfMemory` or `TooLarge`).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_) | Error::TooLarge { .. })
    }
}

/// The backend's error is the `source()` of [`Error::Backend`] (and of
/// nothing else: every other variant is the allocator's own).
impl<E: core::error::Error + 'static> core::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Error::Backend(e) => Some(e),
            _ => None,
        }
    }
}
