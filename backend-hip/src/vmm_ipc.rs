//! Expandable segments across processes, on HIP: a mapped page's
//! physical memory exported as a POSIX file descriptor
//! (`hipMemExportToShareableHandle`), and another process's pages imported
//! (`pidfd_getfd`, `hipMemImportFromShareableHandle`) and mapped into a
//! reservation of exactly their size. The CUDA backend's `vmm_ipc.rs`,
//! translated.

use crate::backend::HipBackend;
use crate::conv::{error, is_out_of_memory, is_success, HipError};
use cachealloc_core::{DevicePtr, VmError};
use core::ffi::c_void;
use hip_sys::hiprt as hip;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

type Vm<T> = Result<T, VmError<HipError>>;

/// Pages imported from another process, mapped at a base (handles as
/// numbers, so the backend stays `Send`).
#[derive(Debug)]
pub(crate) struct ImportedPages {
    handles: Vec<usize>,
    page: u64,
}

fn vm(e: hip::hipError_t, call: &'static str) -> Vm<()> {
    if is_success(e) {
        Ok(())
    } else if is_out_of_memory(e) {
        Err(VmError::OutOfMemory)
    } else {
        Err(VmError::Other(error(e, call)))
    }
}

fn handle(raw: usize) -> hip::hipMemGenericAllocationHandle_t {
    raw as hip::hipMemGenericAllocationHandle_t
}

const POSIX_FD: hip::hipMemAllocationHandleType =
    hip::hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor;

fn system(call: &'static str, e: std::io::Error) -> VmError<HipError> {
    VmError::Other(HipError::System {
        call,
        errno: e.raw_os_error().unwrap_or(0),
        message: if e.raw_os_error() == Some(38) {
            format!(
                "the kernel on this machine does not support the {call} syscall needed to share \
                 expandable segments between processes"
            )
        } else {
            e.to_string()
        },
    })
}

impl HipBackend {
    pub(crate) fn vm_export(&mut self, ptr: DevicePtr, page: u64, fds: &mut [i32]) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        for (k, out) in fds.iter_mut().enumerate() {
            let addr = ptr.0 + k as u64 * page;
            if let Some(&fd) = self.exported.get(&addr) {
                *out = fd;
                continue;
            }
            let Some(&h) = self.pages.get(&addr) else {
                return Err(VmError::Other(HipError::System {
                    call: "hipMemExportToShareableHandle",
                    errno: 0,
                    message: format!("no page of this backend is mapped at {addr:#x}"),
                }));
            };
            let mut fd: i32 = -1;
            // SAFETY: `h` is a live allocation of this backend (created with
            // the POSIX file descriptor type); the runtime writes an int.
            let r = unsafe {
                hip::hipMemExportToShareableHandle(
                    (&mut fd as *mut i32).cast(),
                    handle(h),
                    POSIX_FD,
                    0,
                )
            };
            vm(r, "hipMemExportToShareableHandle")?;
            self.exported.insert(addr, fd);
            *out = fd;
        }
        Ok(())
    }

    pub(crate) fn vm_import(&mut self, pid: u32, fds: &[i32], page: u64) -> Vm<DevicePtr> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let taken = cachealloc_vmm::take_fds(pid, fds).map_err(|(call, e)| system(call, e))?;
        let mut handles: Vec<usize> = Vec::with_capacity(taken.len());
        let undo = |handles: &[usize]| {
            for &h in handles {
                // SAFETY: imported here, not mapped: released once.
                let _ = unsafe { hip::hipMemRelease(handle(h)) };
            }
        };
        for fd in &taken {
            let mut h: hip::hipMemGenericAllocationHandle_t = core::ptr::null_mut();
            // SAFETY: valid out-pointer; the descriptor is open (the runtime
            // reads it as an int passed in the pointer's bits).
            let r = unsafe {
                hip::hipMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as usize as *mut c_void,
                    POSIX_FD,
                )
            };
            if let Err(e) = vm(r, "hipMemImportFromShareableHandle") {
                undo(&handles);
                return Err(e);
            }
            handles.push(h as usize);
        }
        drop(taken);
        let size = page * handles.len() as u64;
        let base = match self.vm_reserve(size) {
            Ok(b) => b,
            Err(e) => {
                undo(&handles);
                return Err(e);
            }
        };
        let unmap = |n: usize| {
            for j in 0..n {
                // SAFETY: undoing this call's own maps.
                let _ = unsafe {
                    hip::hipMemUnmap((base.0 + j as u64 * page) as *mut c_void, page as usize)
                };
            }
        };
        for (k, &h) in handles.iter().enumerate() {
            let addr = base.0 + k as u64 * page;
            // SAFETY: inside the reservation just made, nothing mapped there;
            // `h` an imported allocation of one page.
            let r = unsafe { hip::hipMemMap(addr as *mut c_void, page as usize, 0, handle(h), 0) };
            if let Err(e) = vm(r, "hipMemMap") {
                unmap(k);
                undo(&handles);
                let _ = self.vm_free(base, size);
                return Err(e);
            }
        }
        let desc = hip::hipMemAccessDesc {
            location: self.location(),
            flags: hip::hipMemAccessFlags::hipMemAccessFlagsProtReadWrite,
        };
        // SAFETY: the whole range was just mapped; one valid descriptor.
        let r = unsafe { hip::hipMemSetAccess(base.0 as *mut c_void, size as usize, &desc, 1) };
        if let Err(e) = vm(r, "hipMemSetAccess") {
            unmap(handles.len());
            undo(&handles);
            let _ = self.vm_free(base, size);
            return Err(e);
        }
        self.imported
            .insert(base.0, ImportedPages { handles, page });
        Ok(base)
    }

    pub(crate) fn vm_close_import(&mut self, base: DevicePtr) -> Vm<()> {
        let Some(pages) = self.imported.get(&base.0) else {
            return Err(VmError::Other(HipError::System {
                call: "hipMemUnmap",
                errno: 0,
                message: format!("no imported pages at {base}"),
            }));
        };
        let size = pages.page * pages.handles.len() as u64;
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the whole range this backend mapped at import.
        let r = unsafe { hip::hipMemUnmap(base.0 as *mut c_void, size as usize) };
        // On a failure the import stays recorded: closing can be retried.
        vm(r, "hipMemUnmap")?;
        if let Some(pages) = self.imported.remove(&base.0) {
            for &h in &pages.handles {
                // SAFETY: imported here, now unmapped: released once.
                let _ = unsafe { hip::hipMemRelease(handle(h)) };
            }
        }
        self.vm_free(base, size)
    }

    /// Close the descriptor a page was exported as (the page is being
    /// unmapped).
    pub(crate) fn forget_export(&mut self, addr: u64) {
        if let Some(fd) = self.exported.remove(&addr) {
            // SAFETY: a descriptor the runtime gave this backend and nothing
            // else owns: closed once, here.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}
