//! Expandable segments across processes: a mapped page's physical memory
//! exported as a POSIX file descriptor (`cuMemExportToShareableHandle`),
//! and another process's pages imported (`pidfd_getfd`,
//! `cuMemImportFromShareableHandle`) and mapped into a reservation of
//! exactly their size (PyTorch 2.11 to 2.14 reserve 9/8 of the device's
//! memory per import, pytorch#198129; 2.15 reserves what the pages fill).

use crate::vmm::{vm, Driver, Vm};
use crate::{CudaBackend, CudaError};
use cachealloc_core::{DevicePtr, VmError};
use cachealloc_vmm::{import_with_rollback, ImportDriver};
use cudarc::driver::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Pages imported from another process, mapped at a base.
#[derive(Debug)]
pub(crate) struct ImportedPages {
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    page: u64,
}

/// Whether the driver has the two handle calls (cudarc panics on a call
/// to a function the library lacks).
fn driver_has_handles() -> bool {
    [
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
    ]
    .iter()
    .all(|name| {
        // SAFETY: the driver library is loaded (a backend exists);
        // looking a symbol up calls nothing.
        unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
    })
}

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

impl CudaBackend {
    pub(crate) fn vm_export(&mut self, ptr: DevicePtr, page: u64, fds: &mut [i32]) -> Vm<()> {
        if !self.vmm || !driver_has_handles() {
            return Err(VmError::Unsupported);
        }
        let _bound = self.bind().map_err(VmError::Other)?;
        let export = |h| {
            let mut fd: i32 = -1;
            // SAFETY: `h` is a live allocation of this backend (created with
            // the POSIX file descriptor type); the driver writes an int.
            let r = unsafe {
                sys::cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, POSIX_FD, 0)
            };
            vm(r, "cuMemExportToShareableHandle").map(|()| fd)
        };
        let missing = |addr: u64| {
            VmError::Other(CudaError::System {
                call: "cuMemExportToShareableHandle",
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
        if !self.vmm || !driver_has_handles() {
            return Err(VmError::Unsupported);
        }
        let _bound = self.bind().map_err(VmError::Other)?;
        let taken = cachealloc_vmm::take_fds(pid, fds).map_err(|(call, e)| {
            VmError::Other(CudaError::System {
                call,
                errno: e.raw_os_error().unwrap_or(0),
                message: cachealloc_vmm::take_fds_message(call, &e),
            })
        })?;
        let raw: Vec<i32> = taken.iter().map(AsRawFd::as_raw_fd).collect();
        let prop = self.allocation_prop();
        // The copies taken here close when `taken` goes: the driver keeps
        // what it needs.
        let (base, handles) = import_with_rollback(&mut Driver { prop: &prop }, &raw, page)?;
        self.imported.insert(base, ImportedPages { handles, page });
        Ok(DevicePtr(base))
    }

    pub(crate) fn vm_close_import(&mut self, base: DevicePtr) -> Vm<()> {
        let Some(pages) = self.imported.get(&base.0) else {
            return Err(VmError::Other(CudaError::System {
                call: "cuMemUnmap",
                errno: 0,
                message: format!("no imported pages at {base}"),
            }));
        };
        // Checked at import (a reservation of exactly this size was made).
        let size = pages.page.saturating_mul(pages.handles.len() as u64);
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the whole range this backend mapped at import.
        let r = unsafe { sys::cuMemUnmap(base.0, size as usize) };
        // On a failure the import stays recorded: closing can be retried.
        vm(r, "cuMemUnmap")?;
        if let Some(pages) = self.imported.remove(&base.0) {
            for &h in &pages.handles {
                // SAFETY: imported here, now unmapped: released once.
                let _ = unsafe { sys::cuMemRelease(h) };
            }
        }
        self.vm_free(base, size)
    }

    /// Close the descriptor a page was exported as (the page is being
    /// unmapped).
    pub(crate) fn forget_export(&mut self, addr: u64) {
        if let Some(fd) = self.exported.remove(&addr) {
            // SAFETY: a descriptor the driver gave this backend and nothing
            // else owns: closed once, here.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

impl ImportDriver for Driver<'_> {
    fn import(&mut self, fd: i32) -> Vm<Self::Handle> {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; `fd` is open (the driver reads it as an
        // int passed in the pointer's bits).
        let r = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                fd as usize as *mut std::ffi::c_void,
                POSIX_FD,
            )
        };
        vm(r, "cuMemImportFromShareableHandle")?;
        Ok(h)
    }

    fn reserve(&mut self, size: u64) -> Vm<u64> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address, default alignment.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, 0, 0, 0) };
        vm(r, "cuMemAddressReserve")?;
        Ok(ptr)
    }

    fn free_reservation(&mut self, base: u64, size: u64) {
        // SAFETY: undoing this call's own reservation, nothing mapped in it.
        let _ = unsafe { sys::cuMemAddressFree(base, size as usize) };
    }
}
