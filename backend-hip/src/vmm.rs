//! Virtual memory for expandable segments, on HIP's VMM API:
//! `hipMemGetAllocationGranularity`, `hipMemAddressReserve` /
//! `hipMemAddressFree`, and per page `hipMemCreate`, `hipMemMap`,
//! `hipMemSetAccess`, `hipMemUnmap`, `hipMemRelease` (PyTorch's
//! `ExpandableSegment` on the CUDA driver API, translated; PyTorch's own
//! HIP builds do not offer expandable segments at the commit we follow).
//! The backend keeps the handle of every mapped page by address.

use crate::backend::HipBackend;
use crate::conv::{error, is_out_of_memory, is_success, HipError};
use crate::hip;
use cachealloc_core::{DeviceBackend, DevicePtr, VmError};
use cachealloc_vmm::{map_with_rollback, PageDriver};
use core::ffi::c_void;

pub(crate) type Vm<T> = Result<T, VmError<HipError>>;

/// A runtime result as a virtual-memory result.
pub(crate) fn vm(e: hip::hipError_t, call: &'static str) -> Vm<()> {
    if is_success(e) {
        Ok(())
    } else if is_out_of_memory(e) {
        Err(VmError::OutOfMemory)
    } else {
        Err(VmError::Other(error(e, call)))
    }
}

/// A handle as the backend stores it (a plain number, so the backend stays `Send`).
pub(crate) fn handle(raw: usize) -> hip::hipMemGenericAllocationHandle_t {
    raw as hip::hipMemGenericAllocationHandle_t
}

impl HipBackend {
    /// Pinned memory on this device, shareable through a file descriptor.
    pub(crate) fn allocation_prop(&self) -> hip::hipMemAllocationProp {
        hip::hipMemAllocationProp {
            type_: hip::hipMemAllocationType::hipMemAllocationTypePinned,
            requestedHandleType:
                hip::hipMemAllocationHandleType::hipMemHandleTypePosixFileDescriptor,
            location: self.location(),
            win32HandleMetaData: core::ptr::null_mut(),
            allocFlags: Default::default(),
        }
    }

    pub(crate) fn location(&self) -> hip::hipMemLocation {
        hip::hipMemLocation {
            type_: hip::hipMemLocationType::hipMemLocationTypeDevice,
            id: self.ordinal() as i32,
        }
    }

    pub(crate) fn vm_total_memory(&self) -> Result<u64, HipError> {
        let _bound = self.bind()?;
        let mut bytes = 0usize;
        // SAFETY: a valid out-pointer and a device number checked at open.
        let e = unsafe { hip::hipDeviceTotalMem(&mut bytes, self.ordinal() as i32) };
        if !is_success(e) {
            return Err(error(e, "hipDeviceTotalMem"));
        }
        Ok(bytes as u64)
    }

    pub(crate) fn vm_granularity(&self) -> Vm<u64> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let prop = self.allocation_prop();
        let mut g = 0usize;
        // SAFETY: a valid out-pointer and a fully initialised property struct.
        let e = unsafe {
            hip::hipMemGetAllocationGranularity(
                &mut g,
                &prop,
                hip::hipMemAllocationGranularity_flags::hipMemAllocationGranularityMinimum,
            )
        };
        vm(e, "hipMemGetAllocationGranularity")?;
        Ok(g as u64)
    }

    pub(crate) fn vm_reserve(&self, size: u64) -> Vm<DevicePtr> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; no fixed address, default alignment.
        let e = unsafe {
            hip::hipMemAddressReserve(&mut p, size as usize, 0, core::ptr::null_mut(), 0)
        };
        vm(e, "hipMemAddressReserve")?;
        Ok(DevicePtr(p as u64))
    }

    pub(crate) fn vm_free(&self, ptr: DevicePtr, size: u64) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let r = {
            // SAFETY: a whole reservation from `vm_reserve`, nothing mapped in it.
            unsafe { hip::hipMemAddressFree(ptr.0 as *mut c_void, size as usize) }
        };
        vm(r, "hipMemAddressFree")
    }

    /// Create, map and open `pages` pages from `ptr`: all or nothing.
    pub(crate) fn vm_map(&mut self, ptr: DevicePtr, pages: u64, page: u64) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        let prop = self.allocation_prop();
        let mut driver = Driver {
            prop: &prop,
            location: self.location(),
        };
        let made = map_with_rollback(&mut driver, ptr.0, pages, page)?;
        self.pages.extend(made);
        Ok(())
    }

    /// Unmap and release `pages` pages from `ptr`; pages already gone are
    /// skipped (a failed unmap can be retried), an allocation whose release
    /// failed is released later.
    pub(crate) fn vm_unmap(&mut self, ptr: DevicePtr, pages: u64, page: u64) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        self.release_unreleased();
        for k in 0..pages {
            let addr = ptr.0 + k * page;
            let Some(&h) = self.pages.get(&addr) else {
                continue;
            };
            let r = {
                // SAFETY: a page this backend mapped and the allocator no longer uses.
                unsafe { hip::hipMemUnmap(addr as *mut c_void, page as usize) }
            };
            vm(r, "hipMemUnmap")?;
            self.pages.remove(&addr);
            self.forget_export(addr);
            // SAFETY: the page's allocation, now unmapped, released once.
            if let Err(e) = vm(unsafe { hip::hipMemRelease(handle(h)) }, "hipMemRelease") {
                self.unreleased.push(h);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Release the allocations whose release failed before (best effort).
    pub(crate) fn release_unreleased(&mut self) {
        // SAFETY: unmapped allocations of this backend, each released once.
        self.unreleased
            .retain(|&h| !is_success(unsafe { hip::hipMemRelease(handle(h)) }));
    }
}

/// HIP's page calls, for [`map_with_rollback`] (handles as plain numbers,
/// as the backend stores them).
pub(crate) struct Driver<'a> {
    /// The physical allocations' properties (device, pinned).
    pub(crate) prop: &'a hip::hipMemAllocationProp,
    /// The device that gets access.
    pub(crate) location: hip::hipMemLocation,
}

impl PageDriver for Driver<'_> {
    type Handle = usize;
    type Error = VmError<HipError>;

    fn create(&mut self, size: u64) -> Vm<usize> {
        let mut h: hip::hipMemGenericAllocationHandle_t = core::ptr::null_mut();
        // SAFETY: a valid out-pointer and property struct; `size` is a
        // multiple of the granularity (the allocator checked).
        let r = unsafe { hip::hipMemCreate(&mut h, size as usize, self.prop, 0) };
        vm(r, "hipMemCreate")?;
        Ok(h as usize)
    }

    fn map(&mut self, addr: u64, size: u64, h: usize) -> Vm<()> {
        // SAFETY: `addr` lies in a reservation of this allocator with
        // nothing mapped there; `h` is a fresh one-page allocation.
        let r = unsafe { hip::hipMemMap(addr as *mut c_void, size as usize, 0, handle(h), 0) };
        vm(r, "hipMemMap")
    }

    fn set_access(&mut self, addr: u64, size: u64) -> Vm<()> {
        let desc = hip::hipMemAccessDesc {
            location: self.location,
            flags: hip::hipMemAccessFlags::hipMemAccessFlagsProtReadWrite,
        };
        // SAFETY: the whole range was just mapped; one valid descriptor.
        let r = unsafe { hip::hipMemSetAccess(addr as *mut c_void, size as usize, &desc, 1) };
        vm(r, "hipMemSetAccess")
    }

    fn unmap(&mut self, addr: u64, size: u64) {
        // SAFETY: undoing this call's own map, best effort (the original
        // error is what is reported).
        let _ = unsafe { hip::hipMemUnmap(addr as *mut c_void, size as usize) };
    }

    fn release(&mut self, h: usize) {
        // SAFETY: undoing this call's own creation, released once.
        let _ = unsafe { hip::hipMemRelease(handle(h)) };
    }
}
