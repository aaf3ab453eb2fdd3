//! The allocator's settings as C sees them: `cachealloc_get_allocator_settings`,
//! the settings a snapshot carries (PyTorch's `AllocatorConfigInfo`).

use crate::error::status;
use crate::settings::settings;
use std::ffi::{c_char, c_int};

/// The allocator's settings (PyTorch's `AllocatorConfigInfo`, the
/// `allocator_settings` of a snapshot).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_allocator_settings {
    /// `garbage_collection_threshold` (0: off).
    pub garbage_collection_threshold: f64,
    /// `max_split_size` in bytes; SIZE_MAX when unlimited.
    pub max_split_size: usize,
    /// PyTorch's pinned-memory setting as set (host memory is not
    /// cachealloc's: it changes nothing).
    pub pinned_num_register_threads: usize,
    /// `expandable_segments`.
    pub expandable_segments: c_int,
    /// `release_lock_on_cudamalloc` as in force: 0 (the device's lock is
    /// held through a device malloc, whatever the settings asked for).
    pub release_lock_on_malloc: c_int,
    /// PyTorch's `pinned_use_cuda_host_register` as set (it changes nothing).
    pub pinned_use_host_register: c_int,
    /// PyTorch's `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: c_int,
    /// `roundup_power2_divisions` by interval (the first `1 << i` MiB
    /// interval at index i; 0: no rounding there).
    pub roundup_power2_divisions: [usize; 16],
    /// The settings string as given (`CACHEALLOC_CONF` or
    /// `PYTORCH_CUDA_ALLOC_CONF`): a static string.
    pub last_allocator_settings: *const c_char,
}

/// Fill `*out` with the allocator's settings (every device has the same).
/// Returns 0, or -1 (NULL `out`, bad settings in the environment).
///
/// # Safety
///
/// `out` is NULL (an error) or points to a writable
/// `cachealloc_allocator_settings`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_get_allocator_settings(
    out: *mut cachealloc_allocator_settings,
) -> c_int {
    status("cachealloc_get_allocator_settings", || {
        if out.is_null() {
            return Err("cachealloc_get_allocator_settings: out is NULL".to_string());
        }
        let s = settings()?;
        let c = s.config;
        let mut divisions = [0usize; 16];
        for (d, v) in divisions.iter_mut().zip(c.roundup_power2_divisions.iter()) {
            *d = *v as usize;
        }
        let settings = cachealloc_allocator_settings {
            garbage_collection_threshold: c.garbage_collection_threshold,
            max_split_size: usize::try_from(c.max_split_size).unwrap_or(usize::MAX),
            pinned_num_register_threads: c.host.pinned_num_register_threads as _,
            expandable_segments: c_int::from(c.expandable_segments),
            release_lock_on_malloc: 0,
            pinned_use_host_register: c_int::from(c.host.pinned_use_host_register),
            graph_capture_record_stream_reuse: c_int::from(c.graph_capture_record_stream_reuse),
            roundup_power2_divisions: divisions,
            last_allocator_settings: s.conf_c.as_ptr(),
        };
        // SAFETY: non-null, and writable by the caller's contract.
        unsafe { out.write(settings) };
        Ok(())
    })
}
