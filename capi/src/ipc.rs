//! Sharing memory between processes, peer access and device-to-device
//! copies: PyTorch's `shareIpcHandle`, `getIpcDevPtr`, `enablePeerAccess`
//! and `memcpyAsync`, plus the release of a share (the end of a consumer,
//! which PyTorch learns from its shared-memory counter).

use crate::backend::{on_device, text, Device};
use crate::error::{
    guard, mark_code, status, CACHEALLOC_ERROR_BUFFER_TOO_SMALL,
    CACHEALLOC_ERROR_EXPANDABLE_SEGMENT,
};
use crate::registry;
use cachealloc_core::{
    needs_peer_copy, DevicePtr, Error, IpcMemHandle, NotShareable, PagesShare, ShareableHandle,
    SharedAllocator,
};
use std::ffi::{c_int, c_void};

/// A handle to share an allocation with another process: the driver's IPC
/// handle of its segment (`cudaIpcMemHandle_t`, 64 bytes) and the
/// allocation's offset in the segment. Plain bytes: send it as it is.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_ipc_handle {
    /// The driver's handle of the segment.
    pub handle: [u8; 64],
    /// Bytes from the segment's base to the allocation.
    pub offset: u64,
}

impl From<&cachealloc_ipc_handle> for ShareableHandle {
    fn from(h: &cachealloc_ipc_handle) -> Self {
        ShareableHandle {
            handle: IpcMemHandle(h.handle),
            offset: h.offset,
        }
    }
}

/// The handle behind a C pointer, or why not.
///
/// # Safety
///
/// `h` is NULL or points to a readable `cachealloc_ipc_handle`.
unsafe fn handle_at(
    h: *const cachealloc_ipc_handle,
    what: &str,
) -> Result<ShareableHandle, String> {
    if h.is_null() {
        return Err(format!("{what}: the handle pointer is NULL"));
    }
    // SAFETY: non-null, so readable (see # Safety), maybe unaligned (a
    // network or file buffer); plain bytes, any value is valid.
    let h = unsafe { h.read_unaligned() };
    Ok(ShareableHandle::from(&h))
}

/// Fill `*out` with a handle another process can open to use the live
/// allocation that starts at `ptr` (PyTorch's `shareIpcHandle`). Each call
/// counts one consumer: while any is outstanding, a free of the allocation
/// is held (its memory stays allocated) until `cachealloc_release_ipc_share`
/// has been called once per call here. Returns 0, or -1 (freed, unknown or
/// interior pointer; the driver's error; a backend without IPC; a block
/// of an expandable segment, with `cachealloc_last_error_code()`
/// `CACHEALLOC_ERROR_EXPANDABLE_SEGMENT`: share it with
/// `cachealloc_share_ipc_pages`).
///
/// # Safety
///
/// `out` is NULL (an error) or points to a writable `cachealloc_ipc_handle`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_share_ipc_handle(
    ptr: *mut c_void,
    out: *mut cachealloc_ipc_handle,
) -> c_int {
    status("cachealloc_share_ipc_handle", || {
        if out.is_null() {
            return Err("cachealloc_share_ipc_handle: out is NULL".to_string());
        }
        let p = ptr as usize as u64;
        let h = on_device!(registry::owner(p)?, |a| a
            .share_ipc_handle(DevicePtr(p))
            .map_err(|e| {
                if let Error::IpcNotShareable {
                    why: NotShareable::ExpandableSegment,
                    ..
                } = e
                {
                    mark_code(CACHEALLOC_ERROR_EXPANDABLE_SEGMENT);
                }
                text(e)
            }))?;
        // SAFETY: `out` is non-null and points to a writable handle (see
        // # Safety).
        unsafe {
            out.write_unaligned(cachealloc_ipc_handle {
                handle: h.handle.0,
                offset: h.offset,
            })
        };
        Ok(())
    })
}

/// The address, on `device`, of the allocation another process shared
/// (PyTorch's `getIpcDevPtr` plus the offset). The segment is opened once
/// per device and kept until its last user calls `cachealloc_close_ipc_handle`;
/// opening it again returns the same address. NULL on failure (a bad or
/// stale handle, a full table of opened handles, a backend without IPC).
///
/// # Safety
///
/// `handle` is NULL (an error) or points to a readable `cachealloc_ipc_handle`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_open_ipc_handle(
    handle: *const cachealloc_ipc_handle,
    device: c_int,
) -> *mut c_void {
    guard("cachealloc_open_ipc_handle", std::ptr::null_mut(), || {
        // SAFETY: `handle` is NULL or readable (see # Safety).
        let h = unsafe { handle_at(handle, "cachealloc_open_ipc_handle") }?;
        let p = on_device!(registry::device(device)?, |a| a
            .open_ipc_handle(&h)
            .map_err(text))?;
        Ok(p.0 as usize as *mut c_void)
    })
}

/// One user of a handle opened on `device` is done; the last one closes it
/// with the driver. Returns 0, or -1 (not open there).
///
/// # Safety
///
/// `handle` is NULL (an error) or points to a readable `cachealloc_ipc_handle`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_close_ipc_handle(
    handle: *const cachealloc_ipc_handle,
    device: c_int,
) -> c_int {
    status("cachealloc_close_ipc_handle", || {
        // SAFETY: `handle` is NULL or readable (see # Safety).
        let h = unsafe { handle_at(handle, "cachealloc_close_ipc_handle") }?;
        on_device!(registry::existing(device)?, |a| a
            .close_ipc_handle(&h)
            .map_err(text))
    })
}

/// Pages of an expandable segment shared with another process (PyTorch's
/// `'e'` IPC handle, its header): the process that shares them, how many
/// (one POSIX file descriptor each, sent beside this), the page size and
/// the allocation's offset from the first page. Plain numbers: send it as
/// it is, with the descriptors' numbers (the receiver takes them from the
/// sender with `pidfd_getfd`: the sender must be alive, and the receiver
/// allowed to trace it).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_ipc_pages {
    /// The sharing process's pid.
    pub pid: u32,
    /// Pages (and descriptors).
    pub pages: u32,
    /// Bytes a page.
    pub page_size: u64,
    /// Bytes from the first page to the allocation.
    pub offset: u64,
}

/// The pages and descriptors behind two C pointers, or why not.
///
/// # Safety
///
/// `h` is NULL or readable; `fds` is NULL or holds `h->pages` ints.
unsafe fn pages_at<'a>(
    h: *const cachealloc_ipc_pages,
    fds: *const c_int,
    what: &str,
) -> Result<(u32, PagesShare, &'a [i32]), String> {
    if h.is_null() || fds.is_null() {
        return Err(format!("{what}: a pointer is NULL"));
    }
    // SAFETY: non-null, so readable (see # Safety); plain numbers.
    let h = unsafe { h.read_unaligned() };
    // SAFETY: non-null, holding `h.pages` ints (see # Safety).
    let fds = unsafe { std::slice::from_raw_parts(fds, h.pages as usize) };
    let share = PagesShare {
        page_size: h.page_size,
        pages: h.pages,
        offset: h.offset,
    };
    Ok((h.pid, share, fds))
}

/// Share the live allocation at `ptr`, a block of an expandable segment
/// (`expandable_segments:True`), with another process: `*out` gets the
/// header and `fds` (room for `capacity`) the descriptors of the pages
/// that hold it. Each call counts one consumer, as
/// `cachealloc_share_ipc_handle` does (release it with
/// `cachealloc_release_ipc_share`). The descriptors stay this process's
/// until the pages are unmapped: do not close them. Returns 0, or -1 (not
/// a block of an expandable segment: use `cachealloc_share_ipc_handle`;
/// freed, unknown or interior pointer; a backend without it; too small a
/// `capacity`, with `cachealloc_last_error_code()`
/// `CACHEALLOC_ERROR_BUFFER_TOO_SMALL` and the descriptors needed in
/// `out->pages`, nothing counted).
///
/// # Safety
///
/// `out` is NULL (an error) or writable; `fds` is NULL (an error) or has
/// room for `capacity` ints.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_share_ipc_pages(
    ptr: *mut c_void,
    fds: *mut c_int,
    capacity: usize,
    out: *mut cachealloc_ipc_pages,
) -> c_int {
    status("cachealloc_share_ipc_pages", || {
        if out.is_null() || fds.is_null() {
            return Err("cachealloc_share_ipc_pages: a pointer is NULL".to_string());
        }
        // SAFETY: non-null with room for `capacity` ints (see # Safety).
        let fds = unsafe { std::slice::from_raw_parts_mut(fds, capacity) };
        let p = ptr as usize as u64;
        let h = on_device!(registry::owner(p)?, |a| a
            .share_ipc_pages(DevicePtr(p), fds)
            .map_err(|e| {
                if let Error::BufferTooSmall { needed } = e {
                    mark_code(CACHEALLOC_ERROR_BUFFER_TOO_SMALL);
                    // SAFETY: non-null and writable (see # Safety).
                    unsafe {
                        out.write_unaligned(cachealloc_ipc_pages {
                            pid: std::process::id(),
                            pages: u32::try_from(needed).unwrap_or(u32::MAX),
                            page_size: 0,
                            offset: 0,
                        })
                    };
                }
                text(e)
            }))?;
        // SAFETY: non-null and writable (see # Safety).
        unsafe {
            out.write_unaligned(cachealloc_ipc_pages {
                pid: std::process::id(),
                pages: h.pages,
                page_size: h.page_size,
                offset: h.offset,
            })
        };
        Ok(())
    })
}

/// The address, on `device`, of the allocation another process shared with
/// `cachealloc_share_ipc_pages`: its pages are taken from the sender
/// (`pidfd_getfd`), imported and mapped into a reservation of exactly
/// their size at the first open, and kept until their last user calls
/// `cachealloc_close_ipc_pages`; opening them again returns the same
/// address. NULL on failure (the sender gone or its pages unmapped, no
/// permission to take its descriptors, a backend without it).
///
/// # Safety
///
/// `h` is NULL (an error) or readable; `fds` NULL (an error) or holding
/// `h->pages` ints.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_open_ipc_pages(
    h: *const cachealloc_ipc_pages,
    fds: *const c_int,
    device: c_int,
) -> *mut c_void {
    guard("cachealloc_open_ipc_pages", std::ptr::null_mut(), || {
        // SAFETY: see # Safety.
        let (pid, share, fds) = unsafe { pages_at(h, fds, "cachealloc_open_ipc_pages") }?;
        let p = on_device!(registry::device(device)?, |a| a
            .open_ipc_pages(pid, &share, fds)
            .map_err(text))?;
        Ok(p.0 as usize as *mut c_void)
    })
}

/// One user of pages opened on `device` is done; the last one unmaps them.
/// Returns 0, or -1 (not open there).
///
/// # Safety
///
/// As for `cachealloc_open_ipc_pages`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_close_ipc_pages(
    h: *const cachealloc_ipc_pages,
    fds: *const c_int,
    device: c_int,
) -> c_int {
    status("cachealloc_close_ipc_pages", || {
        // SAFETY: see # Safety.
        let (pid, share, fds) = unsafe { pages_at(h, fds, "cachealloc_close_ipc_pages") }?;
        on_device!(registry::existing(device)?, |a| a
            .close_ipc_pages(pid, &share, fds)
            .map_err(text))
    })
}

/// Let `device` access the memory of `peer` (PyTorch's `enablePeerAccess`:
/// access that is already enabled is no error). Returns 0, or -1 (the
/// driver's error: the same device, a missing device, a pair that cannot).
#[no_mangle]
pub extern "C" fn cachealloc_enable_peer_access(device: c_int, peer: c_int) -> c_int {
    status("cachealloc_enable_peer_access", || {
        let p = u32::try_from(peer).map_err(|_| format!("peer device {peer}: negative"))?;
        registry::device(peer)?;
        on_device!(registry::device(device)?, |a| a
            .enable_peer_access(p)
            .map(|_| ())
            .map_err(text))
    })
}

/// Queue a copy of `count` bytes from `src` on `src_device` to `dst` on
/// `dst_device`, on `stream` of `src_device` (PyTorch's `memcpyAsync`): a
/// plain copy within one device, or when neither device holds an expandable
/// segment; otherwise the driver's peer copy. `p2p_enabled` is PyTorch's
/// parameter; PyTorch copies plainly when it is set because its peer access
/// also covers expandable segments' pages, which cachealloc's does not, so
/// here it changes nothing (`needs_peer_copy` in the core). Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachealloc_memcpy_async(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    count: usize,
    stream: *mut c_void,
    p2p_enabled: c_int,
) -> c_int {
    status("cachealloc_memcpy_async", || {
        let to = registry::device(dst_device)?;
        let from = registry::device(src_device)?;
        let expandable = |d: &Device| on_device!(d, |a| a.has_expandable_segments().map_err(text));
        let expandable = expandable(to)? || expandable(from)?;
        let _ = p2p_enabled; // changes nothing here: see above
        let (dd, sd) = (dst_device as usize, src_device as usize);
        let peer =
            needs_peer_copy(sd, dd, expandable).then_some((dst_device as u32, src_device as u32));
        let (dst, src) = (
            DevicePtr(dst as usize as u64),
            DevicePtr(src as usize as u64),
        );
        let stream = stream as usize as u64;
        on_device!(from, |a| a
            .memcpy_async(dst, src, count as u64, stream.into(), peer)
            .map_err(text))
    })
}
