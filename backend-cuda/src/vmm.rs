//! Virtual memory for expandable segments, on the driver's VMM API:
//! `cuMemGetAllocationGranularity`, `cuMemAddressReserve` /
//! `cuMemAddressFree`, and per page `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`, as PyTorch's
//! `ExpandableSegment` calls them. The backend keeps the handle of every
//! mapped page by address: the allocator speaks of pages by address only.

use crate::conv::{driver_error, is_out_of_memory};
use crate::{CudaBackend, CudaError};
use cachealloc_core::{DevicePtr, VmError};
use cachealloc_vmm::{map_with_rollback, PageDriver};
use cudarc::driver::sys;

pub(crate) type Vm<T> = Result<T, VmError<CudaError>>;

/// A driver result as a virtual-memory result.
pub(crate) fn vm(r: sys::CUresult, call: &'static str) -> Vm<()> {
    r.result().map_err(|e| {
        if is_out_of_memory(&e) {
            VmError::OutOfMemory
        } else {
            VmError::Other(driver_error(e, call))
        }
    })
}

/// The driver functions expandable segments call.
const VMM_FUNCTIONS: [&str; 9] = [
    "cuDeviceTotalMem_v2",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
];

/// Whether the loaded driver has every function of [`VMM_FUNCTIONS`]
/// (cudarc panics on a call to one it lacks: an old driver must get an
/// error value instead).
pub(crate) fn driver_has_vmm() -> bool {
    VMM_FUNCTIONS.iter().all(|name| {
        // SAFETY: only called once the driver library is known to load
        // (`CudaBackend::new`); looking a symbol up calls nothing.
        unsafe { sys::culib().get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
    })
}

impl CudaBackend {
    /// [`VmError::Unsupported`] when the driver lacks the VMM functions.
    fn need_vmm(&self) -> Vm<()> {
        if self.vmm {
            Ok(())
        } else {
            Err(VmError::Unsupported)
        }
    }

    /// Pinned device memory on this device, shareable through a file
    /// descriptor (what PyTorch asks for, for IPC).
    pub(crate) fn allocation_prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: the struct is plain old data (integers, a null pointer,
        // bytes): all zeroes is a valid value, the fields set below aside.
        let mut prop: sys::CUmemAllocationProp = unsafe { core::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.device;
        prop
    }

    pub(crate) fn vm_total_memory(&mut self) -> Result<u64, CudaError> {
        if !self.vmm {
            return Ok(cachealloc_core::DeviceBackend::mem_info(self)?.total);
        }
        let _bound = self.bind()?;
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid out-pointer; `device` came from cuDeviceGet.
        let r = unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, self.device) };
        r.result()
            .map_err(|e| driver_error(e, "cuDeviceTotalMem_v2"))?;
        Ok(bytes as u64)
    }

    pub(crate) fn vm_granularity(&self) -> Vm<u64> {
        self.need_vmm()?;
        let _bound = self.bind().map_err(VmError::Other)?;
        let prop = self.allocation_prop();
        let mut g = 0usize;
        // SAFETY: valid out-pointer and a fully initialised property struct.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        vm(r, "cuMemGetAllocationGranularity")?;
        Ok(g as u64)
    }

    pub(crate) fn vm_reserve(&self, size: u64) -> Vm<DevicePtr> {
        self.need_vmm()?;
        let _bound = self.bind().map_err(VmError::Other)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; no fixed address, default alignment.
        let r = unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, 0, 0, 0) };
        vm(r, "cuMemAddressReserve")?;
        Ok(DevicePtr(ptr))
    }

    pub(crate) fn vm_free(&self, ptr: DevicePtr, size: u64) -> Vm<()> {
        self.need_vmm()?;
        let _bound = self.bind().map_err(VmError::Other)?;
        let r = {
            // SAFETY: a whole reservation from `vm_reserve` with nothing mapped
            // in it (the allocator unmaps every page first).
            unsafe { sys::cuMemAddressFree(ptr.0, size as usize) }
        };
        vm(r, "cuMemAddressFree")
    }

    /// Create, map and open `pages` pages from `ptr`: all or nothing (what
    /// was done is undone when a step fails).
    pub(crate) fn vm_map(&mut self, ptr: DevicePtr, pages: u64, page: u64) -> Vm<()> {
        self.need_vmm()?;
        let _bound = self.bind().map_err(VmError::Other)?;
        let prop = self.allocation_prop();
        let made = map_with_rollback(&mut Driver { prop: &prop }, ptr.0, pages, page)?;
        self.pages.extend(made);
        Ok(())
    }

    /// Unmap and release `pages` pages from `ptr`. Pages already gone (a
    /// call that failed half way) are skipped, so a failed unmap can be
    /// retried; an allocation whose release failed is released later.
    pub(crate) fn vm_unmap(&mut self, ptr: DevicePtr, pages: u64, page: u64) -> Vm<()> {
        self.need_vmm()?;
        let _bound = self.bind().map_err(VmError::Other)?;
        self.release_unreleased();
        for k in 0..pages {
            let addr = ptr.0 + k * page;
            let Some(&h) = self.pages.get(&addr) else {
                continue;
            };
            let r = {
                // SAFETY: `addr` is a page this backend mapped (its handle is
                // recorded) and the allocator no longer uses.
                unsafe { sys::cuMemUnmap(addr, page as usize) }
            };
            vm(r, "cuMemUnmap")?;
            self.pages.remove(&addr);
            self.forget_export(addr);
            // SAFETY: the page's allocation, now unmapped, released once.
            if let Err(e) = vm(unsafe { sys::cuMemRelease(h) }, "cuMemRelease") {
                self.unreleased.push(h);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Release the allocations whose release failed before (best effort:
    /// those that fail again stay for the next time).
    pub(crate) fn release_unreleased(&mut self) {
        // SAFETY: unmapped allocations of this backend, each released once.
        self.unreleased
            .retain(|&h| unsafe { sys::cuMemRelease(h) }.result().is_err());
    }
}

/// The driver's page calls, for [`map_with_rollback`] (and, with the
/// import calls of `vmm_ipc.rs`, `import_with_rollback`).
pub(crate) struct Driver<'a> {
    /// The physical allocations' properties (device, pinned).
    pub(crate) prop: &'a sys::CUmemAllocationProp,
}

impl PageDriver for Driver<'_> {
    type Handle = sys::CUmemGenericAllocationHandle;
    type Error = VmError<CudaError>;

    fn create(&mut self, size: u64) -> Vm<Self::Handle> {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer and property struct; `size` is a
        // multiple of the granularity (the allocator checked).
        let r = unsafe { sys::cuMemCreate(&mut h, size as usize, self.prop, 0) };
        vm(r, "cuMemCreate")?;
        Ok(h)
    }

    fn map(&mut self, addr: u64, size: u64, handle: Self::Handle) -> Vm<()> {
        // SAFETY: `addr` lies in a reservation of this allocator, with no
        // page mapped there; `handle` is a fresh allocation of one page.
        vm(
            unsafe { sys::cuMemMap(addr, size as usize, 0, handle, 0) },
            "cuMemMap",
        )
    }

    fn set_access(&mut self, addr: u64, size: u64) -> Vm<()> {
        let desc = sys::CUmemAccessDesc {
            location: self.prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole range was just mapped; one valid descriptor.
        vm(
            unsafe { sys::cuMemSetAccess(addr, size as usize, &desc, 1) },
            "cuMemSetAccess",
        )
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        // SAFETY: undoing this call's own map; best effort (the original
        // error is what is reported).
        let _ = unsafe { sys::cuMemUnmap(addr, size as usize) };
    }

    fn release(&mut self, handle: Self::Handle) {
        // SAFETY: undoing this call's own creation, released once.
        let _ = unsafe { sys::cuMemRelease(handle) };
    }
}
