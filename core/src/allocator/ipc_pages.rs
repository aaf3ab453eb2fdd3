//! Expandable segments across processes (PyTorch's `'e'` IPC handle): a
//! block of an expandable segment is shared as the pages that hold it,
//! exported by the backend as POSIX file descriptors that the receiving
//! process takes with `pidfd_getfd` (the sender's pid travels with them).
//! The receiver maps them into a reservation of exactly their size (torch
//! 2.11 to 2.14 reserve 9/8 of the device per import, pytorch#198129),
//! opened once per allocator with a use count, as `'c'` handles are. The
//! sender's block is counted as shared, and held when freed, exactly as
//! for [`share_ipc_handle`](DeviceAllocator::share_ipc_handle).
//! `docs/expandable-ipc-notes.md` has torch's layout of the handle.

use super::ipc::{optional_error, OpenedHandle, DEFAULT_IPC_HANDLES, IPC};
use super::{DeviceAllocator, Res};
use crate::arena::{BlockSlot, Flags};
use crate::backend::{DeviceBackend, DevicePtr, IpcMemHandle};
use crate::error::Error;
use crate::history::HistoryStorage;
use crate::pool::Pool;

/// What [`share_ipc_pages`](DeviceAllocator::share_ipc_pages) hands out
/// besides the descriptors: torch's `ShareHeader` fields and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagesShare {
    /// The page size (torch's `segment_size`): 2 MiB in the small pool,
    /// the large pool's page in the large one.
    pub page_size: u64,
    /// The pages shared (torch's `num_handles`): every page the block
    /// touches.
    pub pages: u32,
    /// Bytes from the first shared page to the block.
    pub offset: u64,
}

impl<B, S, const E: usize, H, const P: usize> DeviceAllocator<B, S, E, H, P>
where
    B: DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
    H: HistoryStorage,
{
    /// Share the live allocation at `ptr`, a block of an expandable
    /// segment, with another process: the descriptors of the pages that
    /// hold it go to `fds` (the first [`PagesShare::pages`]). The process
    /// that opens them needs this process's pid. Errors as for
    /// [`share_ipc_handle`](Self::share_ipc_handle); a block not of an
    /// expandable segment is `Unsupported` (it has a segment handle); too
    /// small an `fds` is [`Error::BufferTooSmall`], with nothing counted.
    pub fn share_ipc_pages(&mut self, ptr: DevicePtr, fds: &mut [i32]) -> Res<PagesShare, B> {
        let i = self.live_slot(ptr)?;
        if !self.slot(i).has(Flags::EXPANDABLE) {
            return Err(Error::Unsupported {
                what: "sharing pages of a block that is not in an expandable segment",
                backend: B::NAME,
            });
        }
        let known = self.may_share(ptr)?;
        let head = self.segment_of(ptr)?;
        let (base, size) = (self.slot(head).addr, self.slot(i).size);
        let page = self.page_of(head, Pool::of(self.slot(i).flags));
        let first = (ptr.0 - base) / page;
        let end = (ptr.0 - base + size).div_ceil(page);
        let pages = (end - first) as usize;
        let Some(out) = fds.get_mut(..pages) else {
            return Err(Error::BufferTooSmall { needed: pages });
        };
        let at = base + first * page;
        self.backend
            .ipc_export_pages(DevicePtr(at), page, out)
            .map_err(optional_error::<B>(IPC))?;
        self.count_share(ptr, known)?;
        Ok(PagesShare {
            page_size: page,
            pages: pages as u32,
            offset: ptr.0 - at,
        })
    }

    /// The address here of a block another process shared with
    /// [`share_ipc_pages`](Self::share_ipc_pages) (`pid`: that process,
    /// `fds`: its descriptors): the pages are taken, imported and mapped at
    /// the first open, and shared by later opens of the same pages.
    pub fn open_ipc_pages(
        &mut self,
        pid: u32,
        share: &PagesShare,
        fds: &[i32],
    ) -> Res<DevicePtr, B> {
        let key = pages_key(pid, share, fds)?;
        if let Some(e) = self.ipc_opened.0.iter_mut().find(|e| e.handle == key) {
            e.uses = e.uses.checked_add(1).ok_or(Error::IpcTableFull {
                capacity: DEFAULT_IPC_HANDLES,
            })?;
            return Ok(DevicePtr(e.base.0 + share.offset));
        }
        if self.ipc_opened.0.is_full() {
            return Err(Error::IpcTableFull {
                capacity: DEFAULT_IPC_HANDLES,
            });
        }
        let base = self
            .backend
            .ipc_import_pages(pid, fds, share.page_size)
            .map_err(optional_error::<B>(IPC))?;
        // Not full: checked above.
        let _ = self.ipc_opened.0.push(OpenedHandle {
            handle: key,
            base,
            uses: 1,
            pages: true,
        });
        Ok(DevicePtr(base.0 + share.offset))
    }

    /// One user of pages opened with [`open_ipc_pages`](Self::open_ipc_pages)
    /// is done; the last one unmaps them.
    pub fn close_ipc_pages(&mut self, pid: u32, share: &PagesShare, fds: &[i32]) -> Res<(), B> {
        let key = pages_key(pid, share, fds)?;
        let k = self
            .ipc_opened
            .0
            .iter()
            .position(|e| e.handle == key)
            .ok_or(Error::IpcNotOpen)?;
        let e = &mut self.ipc_opened.0[k];
        if e.uses > 1 {
            e.uses -= 1;
            return Ok(());
        }
        let base = e.base;
        self.close_opened(base, true)?;
        self.ipc_opened.0.swap_remove(k);
        Ok(())
    }
}

/// The key of shared pages in the table of opened handles: the exporter,
/// the page size and the descriptors (the exporter's descriptors of
/// mapped pages are unique while they are shared). A marker byte keeps it
/// apart from every driver handle's bytes; more than 11 descriptors are
/// folded into the last 8 bytes.
fn pages_key<E>(pid: u32, share: &PagesShare, fds: &[i32]) -> Result<IpcMemHandle, Error<E>> {
    // Another process's numbers: their product and the offset are checked
    // before anything is imported.
    let span = share.page_size.checked_mul(u64::from(share.pages));
    let fits = span.is_some_and(|s| share.offset < s);
    if fds.len() != share.pages as usize || fds.is_empty() || share.page_size == 0 || !fits {
        return Err(Error::BadIpcPages {
            pages: share.pages,
            fds: fds.len(),
        });
    }
    let mut k = [0u8; 64];
    k[0] = b'e';
    k[1..5].copy_from_slice(&pid.to_le_bytes());
    k[5..13].copy_from_slice(&share.page_size.to_le_bytes());
    k[13..17].copy_from_slice(&share.pages.to_le_bytes());
    for (n, fd) in fds.iter().take(11).enumerate() {
        k[17 + 4 * n..21 + 4 * n].copy_from_slice(&fd.to_le_bytes());
    }
    let mut fold: u64 = 0xcbf2_9ce4_8422_2325;
    for fd in fds.iter().skip(11) {
        fold = (fold ^ (*fd as u32 as u64)).wrapping_mul(0x0100_0000_01b3);
    }
    k[56..64].copy_from_slice(&fold.to_le_bytes());
    Ok(IpcMemHandle(k))
}
