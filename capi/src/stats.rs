//! Statistics and the cache, what `torch.cuda.memory_stats()`,
//! `reset_peak_memory_stats`, `reset_accumulated_memory_stats`,
//! `empty_cache` and `cudaCacheInfo` give (PyTorch raises on all of these
//! once a pluggable allocator is installed: these are cachealloc's own).

use crate::error::status;
use crate::registry;
use std::ffi::{c_char, c_int, c_void, CString};

/// Called once per statistic: its key (as `torch.cuda.memory_stats()` names
/// it, e.g. `"allocated_bytes.all.current"`; valid during the call only),
/// its value, and the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_stat_callback = Option<extern "C" fn(*const c_char, i64, *mut c_void)>;

/// Call `callback(key, value, user)` for every key of
/// `torch.cuda.memory_stats()` of `device`, in its (sorted) order: the
/// same keys and values PyTorch's native allocator reports. Returns 0, or
/// -1 (NULL callback, bad device; the reason in `cachealloc_last_error()`).
#[no_mangle]
pub extern "C" fn cachealloc_memory_stats(
    device: c_int,
    callback: cachealloc_stat_callback,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_memory_stats", || {
        let callback = callback.ok_or("cachealloc_memory_stats: callback is NULL")?;
        let stats = registry::device(device)?.stats()?;
        let mut keys = Vec::new();
        stats.for_each(|key, value| keys.push((key, value)));
        for (key, value) in keys {
            let key = CString::new(key).map_err(|e| e.to_string())?;
            callback(key.as_ptr(), value, user);
        }
        Ok(())
    })
}

/// `torch.cuda.reset_peak_memory_stats(device)`: every peak becomes its
/// current value. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachealloc_reset_peak_stats(device: c_int) -> c_int {
    status("cachealloc_reset_peak_stats", || {
        registry::device(device)?.reset_peak_stats()
    })
}

/// `torch.cuda.reset_accumulated_memory_stats(device)`: the accumulated
/// counts (`allocated`, `freed`, `num_alloc_retries`, `num_ooms`, ...)
/// become 0. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachealloc_reset_accumulated_stats(device: c_int) -> c_int {
    status("cachealloc_reset_accumulated_stats", || {
        registry::device(device)?.reset_accumulated_stats()
    })
}

/// `torch.cuda.empty_cache()` for `device`, or for every device created so
/// far with -1: wait for the frees pending on other streams, then return
/// every cached segment that is entirely free to the device. Returns 0, or
/// -1 (with -1, after trying every device).
#[no_mangle]
pub extern "C" fn cachealloc_empty_cache(device: c_int) -> c_int {
    status("cachealloc_empty_cache", || {
        registry::each(device, |d| d.empty_cache())
    })
}

/// The cached memory of `device`: bytes in cached (free) blocks to
/// `*total_cached` and the largest of them to `*largest_block` (PyTorch's
/// `cacheInfo`, which cuDNN sizes its workspace from). Either pointer may
/// be NULL. Returns 0, or -1.
///
/// # Safety
///
/// Each pointer is NULL or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_cache_info(
    device: c_int,
    total_cached: *mut usize,
    largest_block: *mut usize,
) -> c_int {
    status("cachealloc_cache_info", || {
        let info = registry::device(device)?.cache_info()?;
        if !total_cached.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { total_cached.write(info.cached_bytes as usize) };
        }
        if !largest_block.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { largest_block.write(info.largest_block as usize) };
        }
        Ok(())
    })
}
