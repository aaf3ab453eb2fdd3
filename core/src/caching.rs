//! The thread-safe front ends: [`CachingAllocator`], one device behind one
//! lock, and [`MultiDeviceAllocator`], a fixed set of devices that routes a
//! `free` or `record_stream` by pointer to the device that owns it, found in
//! a [`SegmentRegistry`] without taking any device's lock.
//!
//! Both are safe inside a host process that calls back into them (a Python
//! interpreter): out-of-memory observers run after the device's lock is
//! released (PyTorch's order), so an observer may call the allocator again;
//! and a panic while a device's lock is held (a trace tracker's, say) marks
//! that device failed: its metadata may be half-updated, so every later
//! call on it is refused with [`Error::DeviceFailed`] instead of running on
//! it.

use crate::allocation::Allocation;
use crate::allocator::{needs_peer_copy, DeviceAllocator, ShareableHandle, DEFAULT_POOLS};
use crate::arena::BlockSlot;
use crate::backend::{DeviceBackend, DevicePtr, PeerAccess};
use crate::error::Error;
use crate::history::{HistoryStorage, NoHistory};
use crate::invariants::InvariantViolation;
use crate::segment_table::SegmentRegistry;
use crate::shared::SharedAllocator;
use crate::sync::{Guard, Held, HeldRef, Mutex};

type Res<T, B> = Result<T, Error<<B as DeviceBackend>::Error>>;

/// The allocator and whether a call is running on it: a call that never
/// finished (it panicked) leaves `busy` set, which fails the device.
struct Guarded<A> {
    alloc: A,
    busy: bool,
}

/// One device's [`DeviceAllocator`] behind a lock: `Sync` whenever the
/// backend, its events and streams and the storage are `Send`. Every call
/// holds the lock for one operation ([`with`](Self::with) for several);
/// [`stats`](Self::stats) holds it only to copy the counters.
///
/// Out-of-memory observers are called after the lock is released, so they
/// may call back (read the statistics, record an annotation). A call that
/// panics while it holds the lock fails the device: every later call
/// returns [`Error::DeviceFailed`].
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator, SharedAllocator};
/// let a = CachingAllocator::new(DeviceAllocator::new(
///     MockDevice::new(None), [BlockSlot::VACANT; 64], Config::DEFAULT));
/// let x = a.malloc(4096, 0)?;
/// a.free(x.handle.unwrap())?;
/// assert_eq!(a.stats()?.allocation.all().current, 0);
/// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
/// ```
pub struct CachingAllocator<
    B: DeviceBackend,
    S,
    const E: usize = 64,
    H = NoHistory,
    const P: usize = DEFAULT_POOLS,
> {
    inner: Mutex<Guarded<DeviceAllocator<B, S, E, H, P>>>,
    /// Whether a call holds `inner`, for waiters to back off on.
    held: Held,
    /// Makes a larger slot storage when a call runs out
    /// ([`with_storage_growth`](Self::with_storage_growth)).
    grow: Option<fn(u32) -> S>,
}

impl<B, S, const E: usize, H, const P: usize> CachingAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Wrap an allocator (`const`, for statics; not under loom).
    #[cfg(not(loom))]
    #[inline(always)]
    pub const fn new(mut allocator: DeviceAllocator<B, S, E, H, P>) -> Self {
        // Its out-of-memory observers are called once the lock is released.
        allocator.keep_oom = true;
        CachingAllocator {
            inner: Mutex::new(Guarded {
                alloc: allocator,
                busy: false,
            }),
            held: Held::new(),
            grow: None,
        }
    }

    /// Wrap an allocator.
    #[cfg(loom)]
    #[inline(always)]
    pub fn new(mut allocator: DeviceAllocator<B, S, E, H, P>) -> Self {
        allocator.keep_oom = true;
        CachingAllocator {
            inner: Mutex::new(Guarded {
                alloc: allocator,
                busy: false,
            }),
            held: Held::new(),
            grow: None,
        }
    }

    /// Take the lock for one call (the refusal of a failed device, or of a
    /// call from a callback that finds the lock held). The device is marked
    /// busy until the call's work returns ([`try_run`](Self::try_run)), so
    /// a call whose work never returns (it panicked) fails the device.
    #[inline]
    fn enter(&self) -> Option<Guard<'_, Guarded<DeviceAllocator<B, S, E, H, P>>>> {
        let mut g = self.inner.lock_marked(&self.held)?;
        if g.busy {
            self.held.by_ref().clear();
            return None;
        }
        g.busy = true;
        Some(g)
    }

    /// Why [`enter`](Self::enter) refused: a call from a callback that
    /// found the lock held, or a failed device.
    #[cold]
    #[inline(never)]
    fn failed(&self) -> Error<B::Error> {
        match self.inner.lock_marked(&self.held) {
            None => Error::CalledFromCallback,
            Some(g) => {
                self.held.by_ref().clear();
                Error::DeviceFailed {
                    device: g.alloc.backend().ordinal(),
                }
            }
        }
    }

    /// Take the out-of-memory notices, release the lock, tell the
    /// observers.
    #[cold]
    #[inline(never)]
    fn deliver_after_unlock(mut g: Guard<'_, Guarded<DeviceAllocator<B, S, E, H, P>>>) {
        let delivery = g.alloc.take_oom_notices();
        drop(g);
        delivery.deliver();
    }

    /// Run `f` on the allocator for one call.
    #[inline]
    fn run<R>(&self, f: impl FnOnce(&mut DeviceAllocator<B, S, E, H, P>) -> R) -> Res<R, B> {
        self.try_run(|a| Ok(f(a)))
    }

    /// Run `f`, which returns a result, on the allocator for one call: take
    /// the lock ([`enter`](Self::enter)), run `f`, clear the busy mark,
    /// and return `f`'s result; the lock is released when the [`Call`] is
    /// dropped, after the result is in place (released between `f` and the
    /// return, the result would be moved out after the unlock).
    #[inline]
    fn try_run<R>(
        &self,
        f: impl FnOnce(&mut DeviceAllocator<B, S, E, H, P>) -> Res<R, B>,
    ) -> Res<R, B> {
        let Some(g) = self.enter() else {
            return Err(self.failed());
        };
        let mut call = Call(Some(g), self.held.by_ref());
        match call.0.as_mut() {
            Some(g) => {
                let r = f(&mut g.alloc);
                g.busy = false;
                r
            }
            // `enter` makes a call that holds the lock; only `drop` takes it.
            None => Err(self.failed()),
        }
    }

    /// Whether a call panicked while it held the lock: the device refuses
    /// every call from then on ([`Error::DeviceFailed`]). From a callback
    /// that finds the lock held (its own call's, say): false (that call
    /// has not failed).
    pub fn is_failed(&self) -> bool {
        match self.inner.lock_marked(&self.held) {
            Some(g) => {
                self.held.by_ref().clear();
                g.busy
            }
            None => false,
        }
    }

    /// Run `f` with the allocator locked (several operations as one).
    /// Out-of-memory observers are told once the lock is released (of the
    /// first 4 out-of-memory errors `f` ran into). Refused on a failed
    /// device; a panic in `f` fails the device.
    pub fn with<R>(&self, f: impl FnOnce(&mut DeviceAllocator<B, S, E, H, P>) -> R) -> Res<R, B> {
        self.run(f)
    }

    /// [`with`](Self::with) for an `f` that returns a result: its error, or
    /// the refusal of a failed device.
    pub fn try_with<R>(
        &self,
        f: impl FnOnce(&mut DeviceAllocator<B, S, E, H, P>) -> Res<R, B>,
    ) -> Res<R, B> {
        self.try_run(f)
    }

    /// The allocator, unlocked (out-of-memory observers are called at the
    /// failing allocation again). A failed device's allocator may be
    /// half-updated: check it before trusting it.
    pub fn into_inner(self) -> DeviceAllocator<B, S, E, H, P> {
        let mut a = self.inner.into_inner().alloc;
        a.keep_oom = false;
        a.oom_kept.clear();
        a
    }

    /// Grow the slot storage whenever a call runs out of slots: `bigger`
    /// makes a larger storage from the storage's capacity (say, twice as
    /// many slots), the blocks move into it, and the call runs again (the
    /// lock is taken anew for the retry; a call that ran out changed
    /// nothing, and one that finds the storage grown by another call
    /// meanwhile runs again without growing it). For a host that can
    /// allocate; without it, running out is a
    /// [`MetadataExhausted`](Error::MetadataExhausted) error.
    pub fn with_storage_growth(mut self, bigger: fn(u32) -> S) -> Self {
        self.grow = Some(bigger);
        self
    }

    /// [`try_run`](Self::try_run) for a call that may run out of slots:
    /// with [`with_storage_growth`](Self::with_storage_growth), grow and
    /// run it again.
    #[inline]
    pub(crate) fn try_growing<R>(
        &self,
        mut op: impl FnMut(&mut DeviceAllocator<B, S, E, H, P>) -> Res<R, B>,
    ) -> Res<R, B> {
        // The call runs once; only a call that ran out of slots goes on,
        // out of line, to take the lock again, grow and run again. The
        // check is made on the call's result once the lock is released:
        // a retry loop around the call inside the lock moves the result
        // through it on the hot path.
        let Some(bigger) = self.grow else {
            return self.try_run(op);
        };
        match self.try_run(&mut op) {
            Err(Error::MetadataExhausted { capacity }) => {
                self.try_run(|a| Self::grow_and_retry(a, capacity, bigger, op))
            }
            other => other,
        }
    }

    /// Grow the storage of `a`, which ran out at `capacity` slots (unless
    /// another call grew it since), and run `op` again, until it no longer
    /// runs out or the storage cannot grow.
    #[cold]
    #[inline(never)]
    fn grow_and_retry<R>(
        a: &mut DeviceAllocator<B, S, E, H, P>,
        mut capacity: u32,
        bigger: fn(u32) -> S,
        mut op: impl FnMut(&mut DeviceAllocator<B, S, E, H, P>) -> Res<R, B>,
    ) -> Res<R, B> {
        loop {
            if a.slot_capacity() <= capacity && a.grow_storage(bigger(capacity)).is_err() {
                return Err(Error::MetadataExhausted { capacity });
            }
            match op(a) {
                Err(Error::MetadataExhausted { capacity: now }) => capacity = now,
                r => return r,
            }
        }
    }
}

/// One call's hold of a device's lock ([`CachingAllocator::enter`]). When
/// it is dropped the lock is released; then, if the call finished (it is no
/// longer busy), the out-of-memory observers are told of the notices it
/// left. A call that panicked is dropped busy: the device stays failed and
/// nobody is told.
struct Call<'a, B: DeviceBackend, S, const E: usize, H, const P: usize>(
    Option<Guard<'a, Guarded<DeviceAllocator<B, S, E, H, P>>>>,
    HeldRef<'a>,
)
where
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage;

impl<B: DeviceBackend, S, const E: usize, H, const P: usize> Drop for Call<'_, B, S, E, H, P>
where
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    #[inline]
    fn drop(&mut self) {
        if let Some(g) = self.0.take() {
            self.1.clear();
            if !g.busy && g.alloc.has_oom_notices() {
                CachingAllocator::deliver_after_unlock(g);
            }
        }
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

/// A fixed set of devices, each behind its own lock. `free_ptr`,
/// `record_stream_ptr` and the IPC calls find the device that owns a
/// pointer in a [`SegmentRegistry`] that every device keeps up to date,
/// without taking any device's lock: a `record_stream` on one device never
/// waits behind an `empty_cache` or a device free on another.
///
/// ```
/// # use cachealloc_mock::MockDevice;
/// use cachealloc_core::{BlockSlot, CachingAllocator, Config, DeviceAllocator, SharedAllocator,
///     MultiDeviceAllocator, SegmentTable};
/// static SEGMENTS: SegmentTable<64> = SegmentTable::new();
/// let dev = |base: u64| CachingAllocator::new(DeviceAllocator::new(
///     MockDevice::new(None).with_base(base), [BlockSlot::VACANT; 32], Config::DEFAULT));
/// let m = MultiDeviceAllocator::new([dev(1 << 40), dev(2 << 40)], &SEGMENTS)?;
/// let x = m.malloc(1, 512, 0)?;
/// assert_eq!(m.owner(x.allocation.ptr), Some(1));      // no device locked
/// m.free_ptr(x.allocation.ptr)?;                       // routed to device 1
/// assert_eq!(m.device(1).unwrap().stats()?.allocation.all().allocated, 1);
/// # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
/// ```
pub struct MultiDeviceAllocator<A: SharedAllocator, const D: usize> {
    devices: [A; D],
    registry: &'static dyn SegmentRegistry,
}

type MRes<T, A> = Result<T, Error<<A as SharedAllocator>::BackendError>>;

impl<A: SharedAllocator, const D: usize> MultiDeviceAllocator<A, D> {
    /// The devices, index = device number (their address ranges must not
    /// overlap), each registering its segments in `registry` under its
    /// number (the segments they hold already too). Give each
    /// `MultiDeviceAllocator` a registry of its own. Fails if the registry
    /// refuses a segment a device holds, or a device failed.
    pub fn new(devices: [A; D], registry: &'static dyn SegmentRegistry) -> MRes<Self, A> {
        for (k, d) in devices.iter().enumerate() {
            if let Err(e) = d.attach_segment_registry(registry, k as u32) {
                for d in &devices[..k] {
                    let _ = d.detach_segment_registry();
                }
                return Err(e);
            }
        }
        Ok(MultiDeviceAllocator { devices, registry })
    }

    /// One device.
    pub fn device(&self, device: usize) -> Option<&A> {
        self.devices.get(device)
    }

    fn get(&self, device: usize) -> MRes<&A, A> {
        self.devices.get(device).ok_or(Error::NoSuchDevice {
            device: device as u32,
        })
    }

    /// The device that owns `ptr`, or the error naming an unknown pointer.
    fn owning(&self, ptr: DevicePtr) -> MRes<&A, A> {
        let d = self.owner(ptr).ok_or(Error::UnknownPointer { ptr })?;
        self.get(d)
    }

    /// Allocate on `device`.
    pub fn malloc(&self, device: usize, size: u64, stream: A::Stream) -> MRes<DeviceAllocation, A> {
        Ok(DeviceAllocation {
            device,
            allocation: self.get(device)?.malloc(size, stream)?,
        })
    }

    /// Free by handle (the allocation names its device).
    pub fn free(&self, a: &DeviceAllocation) -> MRes<(), A> {
        match a.allocation.handle {
            Some(id) => self.get(a.device)?.free(id),
            None => Ok(()),
        }
    }

    /// The device whose segments contain `ptr`, from the registry: no
    /// device's lock is taken. A pointer to a live allocation is always
    /// found on its device; one to memory being created or released right
    /// now may be `None`, and is never another device's.
    pub fn owner(&self, ptr: DevicePtr) -> Option<usize> {
        self.registry
            .owner(ptr.0)
            .map(|d| d as usize)
            .filter(|&d| d < D)
    }

    /// Free by address, on whichever device owns it (null is a no-op).
    pub fn free_ptr(&self, ptr: DevicePtr) -> MRes<(), A> {
        if ptr.is_null() {
            return Ok(());
        }
        self.owning(ptr)?.free_ptr(ptr)
    }

    /// `record_stream` by address, on whichever device owns it.
    pub fn record_stream_ptr(&self, ptr: DevicePtr, stream: A::Stream) -> MRes<(), A> {
        if ptr.is_null() {
            return Ok(());
        }
        self.owning(ptr)?.record_stream_ptr(ptr, stream)
    }

    /// A handle to share the live allocation at `ptr`, from whichever
    /// device owns it ([`DeviceAllocator::share_ipc_handle`]).
    pub fn share_ipc_handle(&self, ptr: DevicePtr) -> MRes<ShareableHandle, A> {
        self.owning(ptr)?.share_ipc_handle(ptr)
    }

    /// One consumer of a share of `ptr` is done, on whichever device owns
    /// it ([`DeviceAllocator::release_ipc_share`]).
    pub fn release_ipc_share(&self, ptr: DevicePtr) -> MRes<(), A> {
        self.owning(ptr)?.release_ipc_share(ptr)
    }

    /// Open a shared allocation on `device` (PyTorch's `getIpcDevPtr` on
    /// the current device, plus the offset).
    pub fn open_ipc_handle(&self, device: usize, handle: &ShareableHandle) -> MRes<DevicePtr, A> {
        self.get(device)?.open_ipc_handle(handle)
    }

    /// One user of a handle opened on `device` is done.
    pub fn close_ipc_handle(&self, device: usize, handle: &ShareableHandle) -> MRes<(), A> {
        self.get(device)?.close_ipc_handle(handle)
    }

    /// Let device `device` access the memory of `peer` (PyTorch's
    /// `enablePeerAccess(dev, dev_to_access)`: access already enabled is no
    /// error). Asking for a device's access to itself is the driver's error.
    pub fn enable_peer_access(&self, device: usize, peer: usize) -> MRes<PeerAccess, A> {
        self.get(peer)?;
        self.get(device)?.enable_peer_access(peer as u32)
    }

    /// Queue a copy of `bytes` from `src` on `src_device` to `dst` on
    /// `dst_device`, on `stream` of `src_device` (PyTorch's `memcpyAsync`):
    /// plain, or through the driver's peer copy as [`needs_peer_copy`]
    /// decides.
    pub fn memcpy_async(
        &self,
        dst: DevicePtr,
        dst_device: usize,
        src: DevicePtr,
        src_device: usize,
        bytes: u64,
        stream: A::Stream,
    ) -> MRes<(), A> {
        let to = self.get(dst_device)?;
        let from = self.get(src_device)?;
        let expandable = to.has_expandable_segments()? || from.has_expandable_segments()?;
        let peer = needs_peer_copy(src_device, dst_device, expandable)
            .then_some((dst_device as u32, src_device as u32));
        from.memcpy_async(dst, src, bytes, stream, peer)
    }

    /// `empty_cache` on every device (PyTorch's counts a sync on each).
    pub fn empty_cache(&self) -> MRes<(), A> {
        for d in &self.devices {
            d.empty_cache()?;
        }
        Ok(())
    }

    /// The devices, unwrapped (their segments stay in the registry, which
    /// they keep up to date, until they are detached from it).
    pub fn into_devices(self) -> [A; D] {
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
