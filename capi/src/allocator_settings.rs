//! The allocator's settings as C sees them: `cachealloc_get_allocator_settings`,
//! the settings a snapshot carries (PyTorch's `AllocatorConfigInfo`), and
//! `cachealloc_set_allocator_settings`, a later settings string.

use crate::backend::{on_device, text};
use crate::error::status;
use crate::registry;
use crate::settings::{follow, settings, warn};
use cachealloc_core::SharedAllocator;
use std::ffi::{c_char, c_int, CStr};

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
    /// The settings string in force: the latest given to
    /// `cachealloc_set_allocator_settings`, else the environment's
    /// (`CACHEALLOC_CONF` or `PYTORCH_CUDA_ALLOC_CONF`); valid for the
    /// process's life.
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

/// torch's `_set_allocator_settings` (`torch.cuda.memory._set_allocator_settings`):
/// apply a later settings string, in `PYTORCH_CUDA_ALLOC_CONF` syntax, to
/// every device created so far and to those created from now on, with the
/// rules of the selected torch release: the string is read as that
/// release's parser reads it, and each key it leaves out is kept or reset
/// to its default as torch does (docs/torch-versions.md's key table; the
/// torch release stays). `cachealloc_get_allocator_settings` then reports
/// it. A string that does not parse changes nothing. Returns 0, or -1
/// (NULL, not UTF-8, a bad key or value; a failed device, after the others
/// took the settings).
///
/// # Safety
///
/// `settings` is NULL (an error) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_set_allocator_settings(settings: *const c_char) -> c_int {
    status("cachealloc_set_allocator_settings", || {
        if settings.is_null() {
            return Err("cachealloc_set_allocator_settings: settings is NULL".to_string());
        }
        // SAFETY: the caller passes a NUL-terminated string (see # Safety).
        let given = unsafe { CStr::from_ptr(settings) }
            .to_str()
            .map_err(|e| format!("cachealloc_set_allocator_settings: not UTF-8: {e}"))?;
        let now = self::settings()?.config;
        let torch = now.torch_version();
        let later = now
            .parse_later(given, &mut |odd| {
                warn("cachealloc_set_allocator_settings", odd)
            })
            .map_err(|e| {
                format!("cachealloc_set_allocator_settings({given:?}): {e} (read as torch {torch})")
            })?;
        let mut followed = Ok(());
        registry::for_all_and_new(
            |d| on_device!(d, |a| a.set_config(later).map_err(text)),
            |_| followed = follow(given, later),
        )?;
        followed
    })
}
