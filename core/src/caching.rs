//! The thread-safe front ends: [`CachingAllocator`], one device behind one
//! lock, and [`MultiDeviceAllocator`], a fixed set of devices that routes a
//! `free` or `record_stream` by pointer to the device that owns it.

use crate::allocation::{Allocation, MallocFlags};
use crate::allocator::{needs_peer_copy, DeviceAllocator, ShareableHandle, DEFAULT_POOLS};
use crate::arena::{BlockId, BlockSlot};
use crate::backend::{DeviceBackend, DevicePtr, PeerAccess};
use crate::error::Error;
use crate::history::{HistoryStorage, NoHistory};
use crate::invariants::InvariantViolation;
use crate::private_pool::{MempoolId, PoolOptions, StreamFilter};
use crate::snapshot::CacheInfo;
use crate::stats::DeviceStats;
use crate::sync::Mutex;

type Res<T, B> = Result<T, Error<<B as DeviceBackend>::Error>>;

/// One device's [`DeviceAllocator`] behind a lock: `Sync` whenever the
/// backend, its events and streams and the storage are `Send`. Every call
/// holds the lock for one operation; [`stats`](Self::stats) holds it only to
/// copy the counters.
///
/// ```
/// use cachealloc_core::{testing::TinyBackend, BlockSlot, CachingAllocator, Config, DeviceAllocator};
/// let a = CachingAllocator::new(DeviceAllocator::new(
///     TinyBackend::default(), [BlockSlot::VACANT; 64], Config::DEFAULT));
/// let x = a.malloc(4096, 0)?;
/// a.free(x.id.unwrap())?;
/// assert_eq!(a.stats().allocation.all().current, 0);
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
/// ```
pub struct CachingAllocator<
    B: DeviceBackend,
    S,
    const E: usize = 64,
    H = NoHistory,
    const P: usize = DEFAULT_POOLS,
> {
    inner: Mutex<DeviceAllocator<B, S, E, H, P>>,
}

impl<B, S, const E: usize, H, const P: usize> CachingAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Wrap an allocator (`const`, for statics; not under loom).
    #[cfg(not(loom))]
    pub const fn new(allocator: DeviceAllocator<B, S, E, H, P>) -> Self {
        CachingAllocator {
            inner: Mutex::new(allocator),
        }
    }

    /// Wrap an allocator.
    #[cfg(loom)]
    pub fn new(allocator: DeviceAllocator<B, S, E, H, P>) -> Self {
        CachingAllocator {
            inner: Mutex::new(allocator),
        }
    }

    /// [`DeviceAllocator::malloc`].
    pub fn malloc(&self, size: u64, stream: B::Stream) -> Res<Allocation, B> {
        self.inner.lock().malloc(size, stream)
    }

    /// [`DeviceAllocator::malloc_with`].
    pub fn malloc_with(
        &self,
        size: u64,
        stream: B::Stream,
        flags: MallocFlags,
    ) -> Res<Allocation, B> {
        self.inner.lock().malloc_with(size, stream, flags)
    }

    /// [`DeviceAllocator::free`].
    pub fn free(&self, id: BlockId) -> Res<(), B> {
        self.inner.lock().free(id)
    }

    /// [`DeviceAllocator::free_ptr`].
    pub fn free_ptr(&self, ptr: DevicePtr) -> Res<(), B> {
        self.inner.lock().free_ptr(ptr)
    }

    /// [`DeviceAllocator::record_stream`].
    pub fn record_stream(&self, id: BlockId, stream: B::Stream) -> Res<(), B> {
        self.inner.lock().record_stream(id, stream)
    }

    /// [`DeviceAllocator::record_stream_ptr`].
    pub fn record_stream_ptr(&self, ptr: DevicePtr, stream: B::Stream) -> Res<(), B> {
        self.inner.lock().record_stream_ptr(ptr, stream)
    }

    /// [`DeviceAllocator::empty_cache`].
    pub fn empty_cache(&self) -> Res<(), B> {
        self.inner.lock().empty_cache()
    }

    /// A copy of the statistics (the lock is held only for the copy).
    pub fn stats(&self) -> DeviceStats {
        *self.inner.lock().stats()
    }

    /// [`DeviceAllocator::cache_info`].
    pub fn cache_info(&self) -> CacheInfo {
        self.inner.lock().cache_info()
    }

    /// Whether `ptr` lies in a segment of this device.
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        self.inner.lock().owns(ptr)
    }

    /// [`DeviceAllocator::share_ipc_handle`].
    pub fn share_ipc_handle(&self, ptr: DevicePtr) -> Res<ShareableHandle, B> {
        self.inner.lock().share_ipc_handle(ptr)
    }

    /// [`DeviceAllocator::release_ipc_share`].
    pub fn release_ipc_share(&self, ptr: DevicePtr) -> Res<(), B> {
        self.inner.lock().release_ipc_share(ptr)
    }

    /// [`DeviceAllocator::open_ipc_handle`].
    pub fn open_ipc_handle(&self, handle: &ShareableHandle) -> Res<DevicePtr, B> {
        self.inner.lock().open_ipc_handle(handle)
    }

    /// [`DeviceAllocator::close_ipc_handle`].
    pub fn close_ipc_handle(&self, handle: &ShareableHandle) -> Res<(), B> {
        self.inner.lock().close_ipc_handle(handle)
    }

    /// [`DeviceAllocator::enable_peer_access`].
    pub fn enable_peer_access(&self, peer: u32) -> Res<PeerAccess, B> {
        self.inner.lock().enable_peer_access(peer)
    }

    /// [`DeviceAllocator::check_invariants`].
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.inner.lock().check_invariants()
    }

    /// Run `f` with the allocator locked (several operations as one).
    pub fn with<R>(&self, f: impl FnOnce(&mut DeviceAllocator<B, S, E, H, P>) -> R) -> R {
        f(&mut self.inner.lock())
    }

    /// The allocator, unlocked.
    pub fn into_inner(self) -> DeviceAllocator<B, S, E, H, P> {
        self.inner.into_inner()
    }

    /// [`DeviceAllocator::create_pool`].
    pub fn create_pool(&self, id: MempoolId, options: PoolOptions) -> Res<(), B> {
        self.inner.lock().create_pool(id, options)
    }

    /// [`DeviceAllocator::begin_allocate_to_pool`]: from now on, requests on
    /// the streams `filter` accepts (from any thread) go to pool `id`.
    pub fn begin_allocate_to_pool(
        &self,
        id: MempoolId,
        filter: StreamFilter<B::Stream>,
    ) -> Res<(), B> {
        self.inner.lock().begin_allocate_to_pool(id, filter)
    }

    /// [`DeviceAllocator::end_allocate_to_pool`].
    pub fn end_allocate_to_pool(&self, id: MempoolId) -> Res<(), B> {
        self.inner.lock().end_allocate_to_pool(id)
    }

    /// [`DeviceAllocator::capture_begin`].
    pub fn capture_begin(&self, id: MempoolId, filter: StreamFilter<B::Stream>) -> Res<(), B> {
        self.inner.lock().capture_begin(id, filter)
    }

    /// [`DeviceAllocator::capture_end`].
    pub fn capture_end(&self, id: MempoolId) -> Res<(), B> {
        self.inner.lock().capture_end(id)
    }

    /// [`DeviceAllocator::release_pool`].
    pub fn release_pool(&self, id: MempoolId) -> Res<(), B> {
        self.inner.lock().release_pool(id)
    }

    /// [`DeviceAllocator::pool_use_count`].
    pub fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.inner.lock().pool_use_count(id)
    }

    /// [`DeviceAllocator::empty_cache_pool`].
    pub fn empty_cache_pool(&self, id: MempoolId) -> Res<(), B> {
        self.inner.lock().empty_cache_pool(id)
    }
}

/// An allocation and the device it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAllocation {
    /// Index of the device in the [`MultiDeviceAllocator`].
    pub device: usize,
    /// The allocation.
    pub allocation: Allocation,
}

/// A fixed set of devices, each behind its own lock. `free_ptr` and
/// `record_stream_ptr` find the device that owns the pointer.
///
/// ```
/// use cachealloc_core::{testing::TinyBackend, BlockSlot, CachingAllocator, Config, DeviceAllocator,
///     MultiDeviceAllocator};
/// let dev = |base: u64| CachingAllocator::new(DeviceAllocator::new(
///     TinyBackend { next: base, ..TinyBackend::default() }, [BlockSlot::VACANT; 32], Config::DEFAULT));
/// let m = MultiDeviceAllocator::new([dev(1 << 40), dev(2 << 40)]);
/// let x = m.malloc(1, 512, 0)?;
/// m.free_ptr(x.allocation.ptr)?;                       // routed to device 1
/// assert_eq!(m.device(1).unwrap().stats().allocation.all().allocated, 1);
/// # Ok::<(), cachealloc_core::Error<cachealloc_core::testing::TinyError>>(())
/// ```
pub struct MultiDeviceAllocator<B: DeviceBackend, S, const E: usize, const D: usize, H = NoHistory>
{
    devices: [CachingAllocator<B, S, E, H>; D],
}

impl<B, S, const E: usize, const D: usize, H> MultiDeviceAllocator<B, S, E, D, H>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// The devices, index = device number. Their address ranges must not overlap.
    pub const fn new(devices: [CachingAllocator<B, S, E, H>; D]) -> Self {
        MultiDeviceAllocator { devices }
    }

    /// One device.
    pub fn device(&self, device: usize) -> Option<&CachingAllocator<B, S, E, H>> {
        self.devices.get(device)
    }

    fn get(&self, device: usize) -> Res<&CachingAllocator<B, S, E, H>, B> {
        self.devices.get(device).ok_or(Error::NoSuchDevice {
            device: device as u32,
        })
    }

    /// Allocate on `device`.
    pub fn malloc(&self, device: usize, size: u64, stream: B::Stream) -> Res<DeviceAllocation, B> {
        Ok(DeviceAllocation {
            device,
            allocation: self.get(device)?.malloc(size, stream)?,
        })
    }

    /// Free by handle (the allocation names its device).
    pub fn free(&self, a: &DeviceAllocation) -> Res<(), B> {
        match a.allocation.id {
            Some(id) => self.get(a.device)?.free(id),
            None => Ok(()),
        }
    }

    /// The device whose segments contain `ptr`.
    pub fn owner(&self, ptr: DevicePtr) -> Option<usize> {
        self.devices.iter().position(|d| d.owns(ptr))
    }

    /// Free by address, on whichever device owns it (null is a no-op).
    pub fn free_ptr(&self, ptr: DevicePtr) -> Res<(), B> {
        if ptr.is_null() {
            return Ok(());
        }
        let d = self.owner(ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.devices[d].free_ptr(ptr)
    }

    /// `record_stream` by address, on whichever device owns it.
    pub fn record_stream_ptr(&self, ptr: DevicePtr, stream: B::Stream) -> Res<(), B> {
        if ptr.is_null() {
            return Ok(());
        }
        let d = self.owner(ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.devices[d].record_stream_ptr(ptr, stream)
    }

    /// A handle to share the live allocation at `ptr`, from whichever
    /// device owns it ([`DeviceAllocator::share_ipc_handle`]).
    pub fn share_ipc_handle(&self, ptr: DevicePtr) -> Res<ShareableHandle, B> {
        let d = self.owner(ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.devices[d].share_ipc_handle(ptr)
    }

    /// One consumer of a share of `ptr` is done, on whichever device owns
    /// it ([`DeviceAllocator::release_ipc_share`]).
    pub fn release_ipc_share(&self, ptr: DevicePtr) -> Res<(), B> {
        let d = self.owner(ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.devices[d].release_ipc_share(ptr)
    }

    /// Open a shared allocation on `device` (PyTorch's `getIpcDevPtr` on
    /// the current device, plus the offset).
    pub fn open_ipc_handle(&self, device: usize, handle: &ShareableHandle) -> Res<DevicePtr, B> {
        self.get(device)?.open_ipc_handle(handle)
    }

    /// One user of a handle opened on `device` is done.
    pub fn close_ipc_handle(&self, device: usize, handle: &ShareableHandle) -> Res<(), B> {
        self.get(device)?.close_ipc_handle(handle)
    }

    /// Let device `device` access the memory of `peer` (PyTorch's
    /// `enablePeerAccess(dev, dev_to_access)`: access already enabled is no
    /// error). Asking for a device's access to itself is the driver's error.
    pub fn enable_peer_access(&self, device: usize, peer: usize) -> Res<PeerAccess, B> {
        self.get(peer)?;
        self.get(device)?.enable_peer_access(peer as u32)
    }

    /// Queue a copy of `bytes` from `src` on `src_device` to `dst` on
    /// `dst_device`, on `stream` of `src_device` (PyTorch's `memcpyAsync`):
    /// plain, or through the driver's peer copy as [`needs_peer_copy`]
    /// decides.
    #[allow(clippy::too_many_arguments)]
    pub fn memcpy_async(
        &self,
        dst: DevicePtr,
        dst_device: usize,
        src: DevicePtr,
        src_device: usize,
        bytes: u64,
        stream: B::Stream,
        p2p_enabled: bool,
    ) -> Res<(), B> {
        let to = self.get(dst_device)?;
        let from = self.get(src_device)?;
        let expandable =
            to.with(|a| a.has_expandable_segments()) || from.with(|a| a.has_expandable_segments());
        from.with(|a| {
            if !needs_peer_copy(src_device, dst_device, expandable, p2p_enabled) {
                a.memcpy_async(dst, src, bytes, stream)
            } else {
                a.memcpy_peer_async(
                    dst,
                    dst_device as u32,
                    src,
                    src_device as u32,
                    bytes,
                    stream,
                )
            }
        })
    }

    /// `empty_cache` on every device (PyTorch's counts a sync on each).
    pub fn empty_cache(&self) -> Res<(), B> {
        for d in &self.devices {
            d.empty_cache()?;
        }
        Ok(())
    }

    /// The devices, unwrapped.
    pub fn into_devices(self) -> [CachingAllocator<B, S, E, H>; D] {
        self.devices
    }

    /// Check every device.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        for d in &self.devices {
            d.check_invariants()?;
        }
        Ok(())
    }
}
