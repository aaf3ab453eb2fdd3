//! PyTorch's `CUDAPluggableAllocator` entry points, with the exact C
//! signatures PyTorch calls through (its `MallocFuncType` / `FreeFuncType`
//! and the `set_*_fn` hooks): `cachealloc_pluggable_alloc` and
//! `cachealloc_free` for `CUDAPluggableAllocator(path,
//! "cachealloc_pluggable_alloc", "cachealloc_free")` (never
//! `cachealloc_alloc`, whose NULL torch would turn into a tensor at address
//! 0; cachealloc's Python package installs an entry that raises
//! `torch.OutOfMemoryError` instead, where it can compile one), and the
//! optional hooks (`set_init_fn`, `set_reset_fn`,
//! `set_memory_fraction_fn`, `set_base_alloc_fn`, `set_record_stream_fn`,
//! `set_begin_allocate_to_pool`, `set_end_allocate_to_pool_fn`,
//! `set_release_pool`).

use crate::backend::{alloc_error, debug_inside_lock, on_device, text};
use crate::error::{guard, status, Res};
use crate::registry;
use crate::settings::settings;
use cachealloc_core::{DevicePtr, MallocFlags, SharedAllocator};
use std::ffi::{c_int, c_void};

/// The raw value of a stream handle.
fn stream_value(stream: *mut c_void) -> u64 {
    stream as usize as u64
}

/// Allocate `size` bytes on `device` for use on `stream` (a `cudaStream_t`;
/// NULL is the default stream). PyTorch's pluggable `alloc`.
///
/// Returns the device address, or NULL on failure with the reason in
/// `cachealloc_last_error()` (out of memory: PyTorch's message, "CUDA out
/// of memory. Tried to allocate ..."). A request of 0 bytes succeeds with
/// NULL and no error, as PyTorch's own allocator does (PyTorch never frees
/// a NULL data pointer; `cachealloc_free(NULL, ...)` is a no-op anyway).
/// Thread-safe; the device's allocator is created at its first use.
#[no_mangle]
pub extern "C" fn cachealloc_alloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard("cachealloc_alloc", std::ptr::null_mut(), || {
        let stream = stream_value(stream);
        let x = on_device!(registry::device(device)?, |a| {
            debug_inside_lock(a);
            a.malloc(size as u64, stream.into())
                .map_err(|e| alloc_error(&**a, e))
        })?;
        Ok(x.ptr.0 as usize as *mut c_void)
    })
}

/// `cachealloc_alloc` for torch's `CUDAPluggableAllocator`, whose interface
/// cannot report a failed allocation (a NULL becomes a tensor at address 0,
/// which kernels then write through). On any failure it writes the reason
/// (for an out-of-memory, PyTorch's message) to stderr and aborts the
/// process, after the out-of-memory observers ran (a snapshot taken there
/// is kept). cachealloc's Python package installs it only on its fallback
/// path; its native allocator for torch raises `torch.OutOfMemoryError`.
#[no_mangle]
pub extern "C" fn cachealloc_pluggable_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let ptr = cachealloc_alloc(size, device, stream);
    if ptr.is_null() && size > 0 {
        let why = crate::error::last_error_text();
        eprintln!(
            "cachealloc: {why}\ncachealloc: aborting: torch's pluggable allocator interface \
             cannot raise torch.OutOfMemoryError, and a NULL would become a tensor at address 0. \
             cachealloc.install() with a C++ compiler installs the native allocator, which raises."
        );
        std::process::abort();
    }
    ptr
}

/// `cachealloc_alloc` at an address that is a multiple of `alignment` (a
/// power of two; TensorFlow's `AllocateRaw(alignment, num_bytes)`). Up to
/// 512 it is `cachealloc_alloc` exactly (every block is 512-byte aligned);
/// a larger alignment cuts the allocation out of a block that much larger
/// (the rest stays cached). Free it with `cachealloc_free` like any other.
/// NULL on failure (a bad alignment, out of memory), with the reason in
/// `cachealloc_last_error()`; 0 bytes is NULL with no error.
#[no_mangle]
pub extern "C" fn cachealloc_alloc_aligned(
    size: usize,
    alignment: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guard("cachealloc_alloc_aligned", std::ptr::null_mut(), || {
        let stream = stream_value(stream);
        let x = on_device!(registry::device(device)?, |a| {
            debug_inside_lock(a);
            a.malloc_aligned(
                size as u64,
                alignment as u64,
                stream.into(),
                MallocFlags::empty(),
            )
            .map_err(|e| alloc_error(&**a, e))
        })?;
        Ok(x.ptr.0 as usize as *mut c_void)
    })
}

/// PyTorch's `allocateWithAddress` (torch 2.13 on,
/// `UntypedStorage._resize_with_addr_`): `size` bytes for `stream` at
/// exactly `addr`, carved out of the free block of the request's pool and
/// stream that holds it (at its start, middle or end); never a new
/// segment. Free it with `cachealloc_free` like any other. NULL on failure
/// with the reason in `cachealloc_last_error()`: "mallocWithAddress: addr
/// must be aligned to kMinBlockSize (512 bytes), got 0x…", or "Could not
/// allocate CUDA storage at exact address 0x…" (a live block there, no
/// segment, another stream's or pool's block, too little room), as
/// PyTorch's. 0 bytes is NULL with no error.
#[no_mangle]
pub extern "C" fn cachealloc_alloc_at(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    addr: *mut c_void,
) -> *mut c_void {
    guard("cachealloc_alloc_at", std::ptr::null_mut(), || {
        let stream = stream_value(stream);
        let at = DevicePtr(addr as usize as u64);
        let x = on_device!(registry::device(device)?, |a| {
            debug_inside_lock(a);
            a.malloc_with_address(size as u64, at, stream.into())
                .map_err(|e| alloc_error(&**a, e))
        })?;
        Ok(x.ptr.0 as usize as *mut c_void)
    })
}

/// The body of the frees.
#[inline(always)]
fn free(ptr: *mut c_void, device: c_int) -> Res<()> {
    if ptr.is_null() {
        return Ok(());
    }
    if device == -1 {
        let p = ptr as usize as u64;
        return on_device!(registry::owner(p)?, |a| {
            debug_inside_lock(a);
            a.free_ptr(DevicePtr(p))
                .map_err(|e| format!("free of {ptr:p}: {e}"))
        });
    }
    let d = registry::existing(device).map_err(|e| format!("free of {ptr:p}: {e}"))?;
    on_device!(d, |a| {
        debug_inside_lock(a);
        a.free_ptr(DevicePtr(ptr as usize as u64))
            .map_err(|e| format!("free of {ptr:p} on device {device}: {e}"))
    })
}

/// Free `ptr`, allocated on `device` by `cachealloc_alloc`. PyTorch's
/// pluggable `free`, with its four parameters: `size` and `stream` are
/// those of the allocation; the allocator knows both already and ignores
/// them. If other streams used the memory (`cachealloc_record_stream`), it
/// is reused only once their work queued so far is done. NULL is a no-op.
///
/// `device` -1 frees it on the device whose segment holds it (torch's
/// `raw_delete` knows no device).
///
/// A bad free (a pointer not allocated here, a double free, the wrong
/// device) changes nothing and leaves the reason in
/// `cachealloc_last_error()`; `cachealloc_free_checked` also returns it.
#[no_mangle]
pub extern "C" fn cachealloc_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, stream);
    guard("cachealloc_free", (), || free(ptr, device));
}

/// `cachealloc_free` that returns 0, or -1 for a bad free (the reason in
/// `cachealloc_last_error()`).
#[no_mangle]
pub extern "C" fn cachealloc_free_checked(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    let _ = (size, stream);
    status("cachealloc_free_checked", || free(ptr, device))
}

/// PyTorch's `init` hook (`set_init_fn`): called with 0 when the pluggable
/// allocator is made, then with the device count at CUDA's initialisation.
/// Idempotent: it reads and checks the settings (errors go to
/// `cachealloc_last_error()`); devices are created at their first use.
#[no_mangle]
pub extern "C" fn cachealloc_init(device_count: c_int) {
    guard("cachealloc_init", (), || {
        settings()?;
        if usize::try_from(device_count).is_ok_and(|n| n > registry::MAX_DEVICES) {
            return Err(format!(
                "cachealloc_init: {device_count} devices, of which cachealloc can use the first {}",
                registry::MAX_DEVICES
            ));
        }
        Ok(())
    });
}

/// PyTorch's `base_alloc` hook (`set_base_alloc_fn`, `getBaseAllocation`):
/// the base of the segment (device allocation) that holds `ptr`, with its
/// size written to `*size`. NULL on failure (the reason in
/// `cachealloc_last_error()`; `*size` untouched).
///
/// # Safety
///
/// `size` is NULL (an error) or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_base_alloc(ptr: *mut c_void, size: *mut usize) -> *mut c_void {
    guard("cachealloc_base_alloc", std::ptr::null_mut(), || {
        if size.is_null() {
            return Err("cachealloc_base_alloc: size is NULL".to_string());
        }
        let p = ptr as usize as u64;
        let (base, bytes) = on_device!(registry::owner(p)?, |a| a
            .base_allocation(DevicePtr(p))
            .map_err(text))?;
        // SAFETY: `size` is non-null and points to a writable size_t (see # Safety).
        unsafe { size.write(bytes as usize) };
        Ok(base.0 as usize as *mut c_void)
    })
}

/// PyTorch's `record_stream` hook (`set_record_stream_fn`,
/// `Tensor.record_stream`): the allocation at `ptr` is used on `stream`
/// too; once freed, its memory is reused only after the work queued on
/// `stream` until the free is done. Errors (a pointer not allocated here)
/// go to `cachealloc_last_error()`.
#[no_mangle]
pub extern "C" fn cachealloc_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guard("cachealloc_record_stream", (), || {
        if ptr.is_null() {
            return Ok(());
        }
        let p = ptr as usize as u64;
        let stream = stream_value(stream);
        on_device!(registry::owner(p)?, |a| a
            .record_stream_ptr(DevicePtr(p), stream.into())
            .map_err(text))
    });
}
