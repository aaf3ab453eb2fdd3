//! Sharing memory with other processes, peer access and device-to-device
//! copies: the rest of PyTorch's `CUDAAllocator` interface
//! (`shareIpcHandle`, `getIpcDevPtr`, `enablePeerAccess`, `memcpyAsync`;
//! see `docs/ipc-notes.md` for what PyTorch does and where).
//!
//! - [`share_ipc_handle`](DeviceAllocator::share_ipc_handle): for the start
//!   of a live allocation, the driver's handle of its segment's base and the
//!   allocation's offset in it (PyTorch's `'c'` handle). A block of an
//!   expandable segment is shared as its pages instead (`ipc_pages.rs`).
//! - [`open_ipc_handle`](DeviceAllocator::open_ipc_handle): the handle's
//!   segment is opened once per allocator and kept with a use count; opening
//!   it again returns the same mapping (PyTorch's per-process cache).
//!   [`close_ipc_handle`](DeviceAllocator::close_ipc_handle) closes it with
//!   the driver when the last user is done. The table has a fixed capacity
//!   ([`DEFAULT_IPC_HANDLES`]); the count and the entry go together, under
//!   the caller's `&mut` (no window in which a reopen finds a dying entry).
//! - Keeping shared memory alive: each [`share_ipc_handle`](DeviceAllocator::share_ipc_handle)
//!   counts one consumer of the allocation. A [`free`](DeviceAllocator::free)
//!   while consumers are outstanding only marks it: the block stays
//!   allocated (so `empty_cache` cannot release its segment) until
//!   [`release_ipc_share`](DeviceAllocator::release_ipc_share) has been
//!   called once per share, and then it is freed; until then it is no
//!   longer the owner's (a second free, a `record_stream` or another share
//!   of it is an error, as for freed memory). This is the job of
//!   PyTorch's `CudaIPCSentData` and its limbo (`torch/csrc/CudaIPCTypes.cpp`),
//!   which keep the producer's block allocated until the consumers'
//!   shared-memory counter drops to zero; here the embedder reports each
//!   consumer's end (from its own counter, socket or pipe), and the table
//!   has a fixed capacity ([`DEFAULT_IPC_SHARES`]).

use super::{expandable::vm_error, DeviceAllocator, Res};
use crate::arena::Flags;
use crate::backend::{DeviceBackend, DevicePtr, IpcMemHandle, PeerAccess};
use crate::error::{Error, NotShareable};
use crate::history::HistoryStorage;

/// IPC handles an allocator can hold open at once.
pub const DEFAULT_IPC_HANDLES: usize = 16;

/// Allocations an allocator can have shared (with consumers outstanding)
/// at once.
pub const DEFAULT_IPC_SHARES: usize = 64;

/// A handle to share a live allocation: the driver's handle of its segment
/// and the allocation's offset in the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShareableHandle {
    /// The driver's handle of the segment's base.
    pub handle: IpcMemHandle,
    /// Bytes from the segment's base to the allocation.
    pub offset: u64,
}

/// One opened handle: where it is mapped and how many users it has.
#[derive(Clone, Copy, Debug)]
pub(super) struct OpenedHandle {
    /// The handle (for pages of an expandable segment, a key made of
    /// their exporter and descriptors: see `ipc_pages.rs`).
    pub(super) handle: IpcMemHandle,
    pub(super) base: DevicePtr,
    pub(super) uses: u32,
    /// Pages of another process's expandable segment (closed with
    /// `ipc_close_pages`), not a segment's handle.
    pub(super) pages: bool,
}

/// The handles opened by one allocator.
#[derive(Clone, Debug)]
pub(super) struct Opened(pub(super) heapless::Vec<OpenedHandle, DEFAULT_IPC_HANDLES>);

impl Opened {
    pub(super) const EMPTY: Opened = Opened(heapless::Vec::new());
}

/// One allocation shared with other processes.
#[derive(Clone, Copy, Debug)]
pub(super) struct SharedBlock {
    /// The allocation's address.
    ptr: u64,
    /// Shares not yet released.
    consumers: u32,
    /// Its owner freed it: it is freed when the last share is released.
    freed: bool,
}

/// The allocations this allocator shared, with consumers outstanding.
#[derive(Clone, Debug)]
pub(super) struct Shared(pub(super) heapless::Vec<SharedBlock, DEFAULT_IPC_SHARES>);

impl Shared {
    pub(super) const EMPTY: Shared = Shared(heapless::Vec::new());

    /// Whether no allocation is shared (the free path's one check).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[crate::BlockSlot]> + AsMut<[crate::BlockSlot]>,
    H: HistoryStorage,
{
    /// A handle another process can open to use the live allocation that
    /// starts at `ptr` (PyTorch's `shareIpcHandle`). Freed, unknown and
    /// interior pointers are errors, as in PyTorch ("invalid device
    /// pointer"), and so is memory its owner freed while it was shared
    /// (held for its consumers). A full table of shared allocations (or a
    /// count at `u32::MAX`) is `IpcSharesFull`.
    pub fn share_ipc_handle(&mut self, ptr: DevicePtr) -> Res<ShareableHandle, B> {
        let i = self.live_slot(ptr)?;
        if self.slot(i).has(Flags::EXPANDABLE) {
            return Err(Error::IpcNotShareable {
                ptr,
                why: NotShareable::ExpandableSegment,
            });
        }
        let owner = self.slot(i).owner;
        if owner != 0 && self.private.get(owner).is_some_and(|p| p.source.is_some()) {
            // Its memory is the source's, not a device malloc the driver
            // can export (torch's cudaIpcGetMemHandle fails on it).
            return Err(Error::IpcNotShareable {
                ptr,
                why: NotShareable::PoolWithSource,
            });
        }
        let known = self.may_share(ptr)?;
        let base = self.slot(self.segment_of(ptr)?).addr;
        let handle = self
            .backend
            .ipc_get_handle(DevicePtr(base))
            .map_err(optional_error::<B>(IPC))?;
        self.count_share(ptr, known)?;
        Ok(ShareableHandle {
            handle,
            offset: ptr.0 - base,
        })
    }

    /// Whether the live allocation at `ptr` may be shared once more: not
    /// held for its consumers (its owner freed it), and room in the table.
    /// Its entry in the table, if it has one.
    pub(super) fn may_share(&self, ptr: DevicePtr) -> Res<Option<usize>, B> {
        let known = self.ipc_shared.0.iter().position(|e| e.ptr == ptr.0);
        if known.is_some_and(|k| self.ipc_shared.0[k].freed) {
            // Its owner freed it: held for its consumers only.
            return Err(Error::NotAllocated { ptr });
        }
        if known.is_none() && self.ipc_shared.0.is_full() {
            return Err(Error::IpcSharesFull {
                capacity: DEFAULT_IPC_SHARES,
            });
        }
        Ok(known)
    }

    /// Count one more consumer of the allocation at `ptr` (`known`: its
    /// entry, from [`may_share`](Self::may_share)).
    pub(super) fn count_share(&mut self, ptr: DevicePtr, known: Option<usize>) -> Res<(), B> {
        if known.is_some_and(|k| self.ipc_shared.0[k].consumers == u32::MAX) {
            return Err(Error::IpcSharesFull {
                capacity: DEFAULT_IPC_SHARES,
            });
        }
        match known {
            Some(k) => self.ipc_shared.0[k].consumers += 1,
            // Not full: checked by `may_share`.
            None => {
                let _ = self.ipc_shared.0.push(SharedBlock {
                    ptr: ptr.0,
                    consumers: 1,
                    freed: false,
                });
            }
        }
        Ok(())
    }

    /// One consumer of a share of the allocation at `ptr` is done with it
    /// (it closed its mapping). When the last one is done and the owner has
    /// freed the allocation, it is freed now. If that free fails, the share
    /// stays counted (call again).
    pub fn release_ipc_share(&mut self, ptr: DevicePtr) -> Res<(), B> {
        let k = self
            .ipc_shared
            .0
            .iter()
            .position(|e| e.ptr == ptr.0)
            .ok_or(Error::IpcNotShared { ptr })?;
        let e = &mut self.ipc_shared.0[k];
        if e.consumers > 1 {
            e.consumers -= 1;
            return Ok(());
        }
        if e.freed {
            let i = self.live_slot(ptr)?;
            self.free_slot(i)?;
        }
        self.ipc_shared.0.swap_remove(k);
        Ok(())
    }

    /// Allocations shared with consumers outstanding, and how many of
    /// them their owners have freed (held until the consumers are done).
    pub fn ipc_shares(&self) -> (usize, usize) {
        let freed = self.ipc_shared.0.iter().filter(|e| e.freed).count();
        (self.ipc_shared.0.len(), freed)
    }

    /// The owner's free of live block `i`, which has shares outstanding:
    /// held until they are released (a second free is a double free).
    /// `None` when the block is not shared.
    pub(super) fn free_shared(&mut self, i: u32) -> Option<Res<(), B>> {
        let ptr = self.slot(i).addr;
        let e = self.ipc_shared.0.iter_mut().find(|e| e.ptr == ptr)?;
        if e.freed {
            return Some(Err(Error::NotAllocated {
                ptr: DevicePtr(ptr),
            }));
        }
        e.freed = true;
        Some(Ok(()))
    }

    /// Whether live block `i` was freed by its owner and is held for the
    /// consumers of its shares (no longer the owner's to use).
    pub(super) fn is_held(&self, i: u32) -> bool {
        let ptr = self.slot(i).addr;
        self.ipc_shared.0.iter().any(|e| e.ptr == ptr && e.freed)
    }

    /// Put an entry in the table of shares as it is (for the checker's tests).
    #[cfg(test)]
    pub(super) fn push_share_for_test(&mut self, ptr: u64, consumers: u32) {
        let _ = self.ipc_shared.0.push(SharedBlock {
            ptr,
            consumers,
            freed: false,
        });
    }

    /// Each shared allocation is a live allocation, named once.
    pub(super) fn check_ipc_shares(&self) -> Result<(), crate::InvariantViolation> {
        for (k, e) in self.ipc_shared.0.iter().enumerate() {
            let i = self.live.find(self.arena.slots(), e.ptr);
            crate::invariants::ensure(
                i != crate::arena::NIL,
                "every allocation shared through IPC is live",
                None,
            )?;
            crate::invariants::ensure(
                e.consumers > 0 && !self.ipc_shared.0[..k].iter().any(|o| o.ptr == e.ptr),
                "every shared allocation has consumers and one entry",
                Some(i),
            )?;
        }
        Ok(())
    }

    /// The device address of a shared allocation (PyTorch's
    /// `getIpcDevPtr` plus the offset): its segment is opened at the first
    /// use and shared by later ones.
    pub fn open_ipc_handle(&mut self, h: &ShareableHandle) -> Res<DevicePtr, B> {
        let at = |base: DevicePtr| {
            base.offset(h.offset).ok_or(Error::SizeOverflow {
                requested: h.offset,
            })
        };
        if let Some(e) = self.ipc_opened.0.iter_mut().find(|e| e.handle == h.handle) {
            let p = at(e.base)?;
            e.uses = e.uses.checked_add(1).ok_or(Error::IpcTableFull {
                capacity: DEFAULT_IPC_HANDLES,
            })?;
            return Ok(p);
        }
        if self.ipc_opened.0.is_full() {
            return Err(Error::IpcTableFull {
                capacity: DEFAULT_IPC_HANDLES,
            });
        }
        let base = self
            .backend
            .ipc_open_handle(&h.handle)
            .map_err(optional_error::<B>(IPC))?;
        let ptr = match at(base) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.backend.ipc_close_handle(base);
                return Err(e);
            }
        };
        // Not full: checked above.
        let _ = self.ipc_opened.0.push(OpenedHandle {
            handle: h.handle,
            base,
            uses: 1,
            pages: false,
        });
        Ok(ptr)
    }

    /// One user of an opened handle is done; the last one closes it with
    /// the driver.
    pub fn close_ipc_handle(&mut self, h: &ShareableHandle) -> Res<(), B> {
        let k = self
            .ipc_opened
            .0
            .iter()
            .position(|e| e.handle == h.handle)
            .ok_or(Error::IpcNotOpen)?;
        let e = &mut self.ipc_opened.0[k];
        if e.uses > 1 {
            e.uses -= 1;
            return Ok(());
        }
        let (base, pages) = (e.base, e.pages);
        self.close_opened(base, pages)?;
        self.ipc_opened.0.swap_remove(k);
        Ok(())
    }

    /// Close an opened handle's mapping with the driver.
    pub(super) fn close_opened(&mut self, base: DevicePtr, pages: bool) -> Res<(), B> {
        if pages {
            self.backend.ipc_close_pages(base)
        } else {
            self.backend.ipc_close_handle(base)
        }
        .map_err(optional_error::<B>(IPC))
    }

    /// Close every handle opened here with the driver, whatever its use
    /// count (teardown: `release_all`). One that fails stays, to retry.
    pub(super) fn close_all_ipc_handles(&mut self) -> Res<(), B> {
        while let Some(e) = self.ipc_opened.0.last() {
            let (base, pages) = (e.base, e.pages);
            self.close_opened(base, pages)?;
            self.ipc_opened.0.pop();
        }
        Ok(())
    }

    /// Whether an allocation in `[lo, hi)` is shared (a pool with one
    /// cannot be restored from a checkpoint).
    pub(super) fn shares_in(&self, lo: u64, hi: u64) -> Option<u64> {
        self.ipc_shared
            .0
            .iter()
            .find(|e| lo <= e.ptr && e.ptr < hi)
            .map(|e| e.ptr)
    }

    /// Handles opened here and not yet closed by their last user.
    pub fn open_ipc_handles(&self) -> usize {
        self.ipc_opened.0.len()
    }

    /// Let this device access device `peer`'s memory (PyTorch's
    /// `enablePeerAccess`: access that is already enabled is no error).
    pub fn enable_peer_access(&mut self, peer: u32) -> Res<PeerAccess, B> {
        self.backend
            .enable_peer_access(peer)
            .map_err(optional_error::<B>("peer access"))
    }

    /// Whether this allocator holds any expandable segment (PyTorch's
    /// `hasAllocatedExpandableSegments`, which decides how `memcpyAsync`
    /// copies between devices).
    pub fn has_expandable_segments(&self) -> bool {
        self.segments().any(|s| s.is_expandable)
    }

    /// Queue a copy between devices through the driver's peer copy
    /// (`cudaMemcpyPeerAsync`; see [`DeviceBackend::memcpy_peer_async`]).
    pub fn memcpy_peer_async(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: B::Stream,
    ) -> Res<(), B> {
        self.backend
            .memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream)
            .map_err(optional_error::<B>("device-to-device copies"))
    }

    /// Queue a device-to-device copy on `stream` (PyTorch's `memcpyAsync`).
    pub fn memcpy_async(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: B::Stream,
    ) -> Res<(), B> {
        self.backend
            .memcpy_async(dst, src, bytes, stream)
            .map_err(optional_error::<B>("device-to-device copies"))
    }
}

/// PyTorch's `memcpyAsync` choice as built here: whether a copy from
/// `src_device` to `dst_device` goes through the driver's peer copy, which
/// also moves mapped pages (`expandable`: either device holds an
/// expandable segment), or is a plain copy (within one device, or between
/// plain driver allocations). PyTorch also copies plainly when its caller
/// says peer access is enabled (`p2p_enabled`), because its
/// `enablePeerAccess` grants the peer access to every expandable segment's
/// pages (`addPeerAccess`); that grant is not built here, so there is no
/// such case, and no such parameter (the C library takes torch's and
/// documents that it changes nothing).
pub fn needs_peer_copy(src_device: usize, dst_device: usize, expandable: bool) -> bool {
    src_device != dst_device && expandable
}

/// What an unsupported IPC call names.
pub(super) const IPC: &str = "sharing memory through IPC handles";

/// A failed optional backend call as the allocator reports it: an
/// unsupported one names `what`.
pub(super) fn optional_error<B: DeviceBackend>(
    what: &'static str,
) -> impl Fn(crate::VmError<B::Error>) -> Error<B::Error> {
    move |e| match e {
        crate::VmError::Unsupported => Error::Unsupported {
            what,
            backend: B::NAME,
        },
        other => vm_error::<B>(other),
    }
}
