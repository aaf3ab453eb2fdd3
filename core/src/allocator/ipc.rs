//! Sharing memory with other processes, peer access and device-to-device
//! copies: the rest of PyTorch's `CUDAAllocator` interface
//! (`shareIpcHandle`, `getIpcDevPtr`, `enablePeerAccess`, `memcpyAsync`;
//! see `docs/ipc-notes.md` for what PyTorch does and where).
//!
//! - [`share_ipc_handle`](DeviceAllocator::share_ipc_handle): for the start
//!   of a live allocation, the driver's handle of its segment's base and the
//!   allocation's offset in it (PyTorch's `'c'` handle). Expandable segments
//!   are refused (PyTorch's older path refuses them too).
//! - [`open_ipc_handle`](DeviceAllocator::open_ipc_handle): the handle's
//!   segment is opened once per allocator and kept with a use count; opening
//!   it again returns the same mapping (PyTorch's per-process cache).
//!   [`close_ipc_handle`](DeviceAllocator::close_ipc_handle) closes it with
//!   the driver when the last user is done. The table has a fixed capacity
//!   ([`DEFAULT_IPC_HANDLES`]); the count and the entry go together, under
//!   the caller's `&mut` (no window in which a reopen finds a dying entry).

use super::{expandable::vm_error, DeviceAllocator, Res};
use crate::arena::Flags;
use crate::backend::{DeviceBackend, DevicePtr, IpcMemHandle, PeerAccess};
use crate::error::Error;
use crate::history::HistoryStorage;

/// IPC handles an allocator can hold open at once.
pub const DEFAULT_IPC_HANDLES: usize = 16;

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
struct OpenedHandle {
    handle: IpcMemHandle,
    base: DevicePtr,
    uses: u32,
}

/// The handles opened by one allocator.
#[derive(Clone, Debug)]
pub(super) struct Opened(heapless::Vec<OpenedHandle, DEFAULT_IPC_HANDLES>);

impl Opened {
    pub(super) const EMPTY: Opened = Opened(heapless::Vec::new());
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
    /// pointer").
    pub fn share_ipc_handle(&mut self, ptr: DevicePtr) -> Res<ShareableHandle, B> {
        let i = self.live_slot(ptr)?;
        if self.slot(i).has(Flags::EXPANDABLE) {
            return Err(Error::Unsupported {
                what: "sharing a block of an expandable segment with another process",
                backend: B::NAME,
            });
        }
        let base = self.slot(self.segment_of(ptr)?).addr;
        let handle = self
            .backend
            .ipc_get_handle(DevicePtr(base))
            .map_err(optional_error::<B>(IPC))?;
        Ok(ShareableHandle {
            handle,
            offset: ptr.0 - base,
        })
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
            e.uses += 1;
            return at(e.base);
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
        let base = e.base;
        self.backend
            .ipc_close_handle(base)
            .map_err(optional_error::<B>(IPC))?;
        self.ipc_opened.0.swap_remove(k);
        Ok(())
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

/// What an unsupported IPC call names.
const IPC: &str = "sharing memory through IPC handles";

/// A failed optional backend call as the allocator reports it: an
/// unsupported one names `what`.
fn optional_error<B: DeviceBackend>(
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
