//! Expandable segments across processes, on HIP: a mapped page's
//! physical memory exported as a POSIX file descriptor
//! (`hipMemExportToShareableHandle`), and another process's pages imported
//! (`pidfd_getfd`, `hipMemImportFromShareableHandle`) and mapped into a
//! reservation of exactly their size. The CUDA backend's `vmm_ipc.rs`,
//! translated.

use crate::backend::HipBackend;
use crate::conv::HipError;
use crate::hip;
use crate::vmm::{handle, vm, Driver, Vm};
use cachealloc_core::{DevicePtr, VmError};
use cachealloc_vmm::{import_with_rollback, ImportDriver};
use core::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Pages imported from another process, mapped at a base (handles as
/// numbers, so the backend stays `Send`).
#[derive(Debug)]
pub(crate) struct ImportedPages {
    handles: Vec<usize>,
    page: u64,
}

const POSIX_FD: hip::hipMemAllocationHandleType =
    hip::hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor;

fn system(call: &'static str, e: std::io::Error) -> VmError<HipError> {
    VmError::Other(HipError::System {
        call,
        errno: e.raw_os_error().unwrap_or(0),
        message: cachealloc_vmm::take_fds_message(call, &e),
    })
}

impl HipBackend {
    pub(crate) fn vm_export(&mut self, ptr: DevicePtr, page: u64, fds: &mut [i32]) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let export = |h: usize| {
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
            vm(r, "hipMemExportToShareableHandle").map(|()| fd)
        };
        let missing = |addr: u64| {
            VmError::Other(HipError::System {
                call: "hipMemExportToShareableHandle",
                errno: 0,
                message: format!("no page of this backend is mapped at {addr:#x}"),
            })
        };
        cachealloc_vmm::export_pages(
            &self.pages,
            &mut self.exported,
            ptr.0,
            page,
            fds,
            export,
            missing,
        )
    }

    pub(crate) fn vm_import(&mut self, pid: u32, fds: &[i32], page: u64) -> Vm<DevicePtr> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let taken = cachealloc_vmm::take_fds(pid, fds).map_err(|(call, e)| system(call, e))?;
        let raw: Vec<i32> = taken.iter().map(AsRawFd::as_raw_fd).collect();
        let prop = self.allocation_prop();
        let mut driver = Driver {
            prop: &prop,
            location: self.location(),
        };
        // The copies taken here close when `taken` goes: the runtime keeps
        // what it needs.
        let (base, handles) = import_with_rollback(&mut driver, &raw, page)?;
        self.imported.insert(base, ImportedPages { handles, page });
        Ok(DevicePtr(base))
    }

    pub(crate) fn vm_close_import(&mut self, base: DevicePtr) -> Vm<()> {
        let Some(pages) = self.imported.get(&base.0) else {
            return Err(VmError::Other(HipError::System {
                call: "hipMemUnmap",
                errno: 0,
                message: format!("no imported pages at {base}"),
            }));
        };
        // Checked at import (a reservation of exactly this size was made).
        let size = pages.page.saturating_mul(pages.handles.len() as u64);
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

/// The HIP version from which `hipMemImportFromShareableHandle` takes the
/// file descriptor by value: ROCm 7.1 (`HIP_VERSION` encoding, major times
/// 10^7 plus minor times 10^5 plus patch).
const IMPORT_BY_VALUE_FROM: i32 = 70_100_000;

/// The runtime's HIP version (0 when it does not say).
fn runtime_version() -> i32 {
    let mut v = 0;
    // SAFETY: a valid out-pointer for the call.
    let r = unsafe { hip::hipRuntimeGetVersion(&mut v) };
    if crate::conv::is_success(r) {
        v
    } else {
        0
    }
}

impl ImportDriver for Driver<'_> {
    fn import(&mut self, fd: i32) -> Vm<usize> {
        let mut h: hip::hipMemGenericAllocationHandle_t = core::ptr::null_mut();
        let mut fd = fd;
        // From ROCm 7.1 the runtime takes the descriptor in the pointer's
        // bits, before it a pointer to the descriptor (torch's
        // `ROCM_VERSION >= 70100` split).
        let os_handle = if runtime_version() >= IMPORT_BY_VALUE_FROM {
            fd as usize as *mut c_void
        } else {
            (&mut fd as *mut i32).cast::<c_void>()
        };
        // SAFETY: valid out-pointer; `fd` is open and, for an older runtime,
        // `os_handle` points at it for the duration of the call.
        let r = unsafe { hip::hipMemImportFromShareableHandle(&mut h, os_handle, POSIX_FD) };
        vm(r, "hipMemImportFromShareableHandle")?;
        Ok(h as usize)
    }

    fn reserve(&mut self, size: u64) -> Vm<u64> {
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; no fixed address, default alignment.
        let r = unsafe {
            hip::hipMemAddressReserve(&mut p, size as usize, 0, core::ptr::null_mut(), 0)
        };
        vm(r, "hipMemAddressReserve")?;
        Ok(p as u64)
    }

    fn free_reservation(&mut self, base: u64, size: u64) {
        // SAFETY: undoing this call's own reservation, nothing mapped in it.
        let _ = unsafe { hip::hipMemAddressFree(base as *mut c_void, size as usize) };
    }
}
