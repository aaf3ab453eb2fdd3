//! Statistics and the cache, what `torch.cuda.memory_stats()`,
//! `reset_peak_memory_stats`, `reset_accumulated_memory_stats`,
//! `empty_cache` and `cudaCacheInfo` give (PyTorch raises on all of these
//! once a pluggable allocator is installed: these are cachealloc's own).

use crate::backend::{on_device, text};
use crate::error::status;
use crate::registry;
use cachealloc_core::SharedAllocator;
use std::ffi::{c_char, c_int, c_void, CString};

/// Called once per statistic: its key (as `torch.cuda.memory_stats()` names
/// it, e.g. `"allocated_bytes.all.current"`; valid during the call only),
/// its value, and the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_stat_callback = Option<extern "C" fn(*const c_char, i64, *mut c_void)>;

/// Call `callback(key, value, user)` for every key of
/// `torch.cuda.memory_stats()` of `device`, in its (sorted) order: the
/// same keys and values PyTorch's native allocator reports, as the torch
/// of `CACHEALLOC_TORCH_VERSION` names them (2.12 on: `num_oom_rejections`;
/// 2.13 on: `reserved_bytes_by_private_pools.<id0>_<id1>.<pool>.<stat>`,
/// one set per private pool). Returns 0, or -1 (NULL callback, bad device;
/// the reason in `cachealloc_last_error()`).
#[no_mangle]
pub extern "C" fn cachealloc_memory_stats(
    device: c_int,
    callback: cachealloc_stat_callback,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_memory_stats", || {
        let callback = callback.ok_or("cachealloc_memory_stats: callback is NULL")?;
        let torch = crate::settings::settings()?.config.torch_version();
        let d = registry::device(device)?;
        let stats = on_device!(d, |a| a.stats().map_err(text))?;
        let mut pools = Vec::new();
        if torch.decisions_of() >= cachealloc_core::TorchVersion::V2_13 {
            on_device!(d, |a| a
                .reserved_bytes_by_private_pools(&mut |id, s| pools.push((id, *s)))
                .map_err(text))?;
        }
        for (key, value) in cachealloc_snapshot::memory_stats_keys(&stats, torch, &pools) {
            let key = CString::new(key).map_err(|e| e.to_string())?;
            callback(key.as_ptr(), value, user);
        }
        Ok(())
    })
}

/// Called once per private pool (torch 2.13's
/// `reserved_bytes_by_private_pools`): the pool's id, its reserved bytes
/// (`[3]`: all, small pool, large pool; valid during the call only), and
/// the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_pool_stats_callback =
    Option<extern "C" fn(u64, u64, *const cachealloc_stat, *mut c_void)>;

/// Call `callback` for every private pool of `device` with its reserved
/// bytes: the live pools, then the deleted ones torch still reports
/// (current 0). Returns 0, or -1 (NULL callback, bad device).
#[no_mangle]
pub extern "C" fn cachealloc_pool_reserved_stats(
    device: c_int,
    callback: cachealloc_pool_stats_callback,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_pool_reserved_stats", || {
        let callback = callback.ok_or("cachealloc_pool_reserved_stats: callback is NULL")?;
        let mut pools = Vec::new();
        on_device!(registry::device(device)?, |a| a
            .reserved_bytes_by_private_pools(&mut |id, s| pools.push((id, *s)))
            .map_err(text))?;
        for (id, s) in pools {
            let arr = stat_array(s);
            callback(id.0, id.1, arr.as_ptr(), user);
        }
        Ok(())
    })
}

/// The free and total memory of `device` as its driver reports them
/// (`cudaMemGetInfo`; on the simulated device, its capacity). Either
/// pointer may be NULL. Returns 0, or -1.
///
/// # Safety
///
/// Each pointer is NULL or points to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_mem_get_info(
    device: c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    status("cachealloc_mem_get_info", || {
        let m = on_device!(registry::device(device)?, |a| a.mem_info().map_err(
            |e| match e {
                cachealloc_core::Error::Backend(e) => format!("memory info: {e}"),
                e => e.to_string(),
            }
        ))?;
        let (f, t) = (m.free, m.total);
        if !free.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { free.write(f as usize) };
        }
        if !total.is_null() {
            // SAFETY: non-null, and writable by the caller's contract.
            unsafe { total.write(t as usize) };
        }
        Ok(())
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
        let info = on_device!(registry::device(device)?, |a| a.cache_info().map_err(text))?;
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

/// One statistic (PyTorch's `Stat`): its value now, its peak, and the sums
/// of its increases and decreases.
#[repr(C)]
#[derive(Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct cachealloc_stat {
    /// The value now.
    pub current: i64,
    /// The largest `current` since the start or the last peak reset.
    pub peak: i64,
    /// The sum of all increases.
    pub allocated: i64,
    /// The sum of all decreases.
    pub freed: i64,
}

/// A device's statistics, PyTorch's `DeviceStats` field for field (what
/// `torch.cuda.memory_stats()` flattens into its keys). Each array is
/// indexed by PyTorch's `StatType`: 0 all pools (`"all"`), 1 the small pool
/// (`"small_pool"`), 2 the large pool (`"large_pool"`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct cachealloc_device_stats {
    /// Allocations handed out and not yet freed (`allocation`).
    pub allocation: [cachealloc_stat; 3],
    /// Device segments held (`segment`).
    pub segment: [cachealloc_stat; 3],
    /// Blocks allocated or waiting on events (`active`).
    pub active: [cachealloc_stat; 3],
    /// Free blocks inside segments of more than one block (`inactive_split`).
    pub inactive_split: [cachealloc_stat; 3],
    /// Bytes of allocated blocks (`allocated_bytes`).
    pub allocated_bytes: [cachealloc_stat; 3],
    /// Bytes of device segments (`reserved_bytes`).
    pub reserved_bytes: [cachealloc_stat; 3],
    /// Bytes of active blocks (`active_bytes`).
    pub active_bytes: [cachealloc_stat; 3],
    /// Bytes of inactive split blocks (`inactive_split_bytes`).
    pub inactive_split_bytes: [cachealloc_stat; 3],
    /// Unrounded request bytes of active blocks (`requested_bytes`).
    pub requested_bytes: [cachealloc_stat; 3],
    /// Segment creations retried after releasing every cached segment.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub num_ooms: i64,
    /// Allocations of at least `max_split_size` bytes.
    pub oversize_allocations: cachealloc_stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: cachealloc_stat,
    /// Times every pending event was waited for.
    pub num_sync_all_streams: i64,
    /// Successful device mallocs.
    pub num_device_alloc: i64,
    /// Device frees.
    pub num_device_free: i64,
    /// `max_split_size` at creation, -1 when unlimited.
    pub max_split_size: i64,
    /// Requests the rejection policy refused (`throw_on_cudamalloc_oom`).
    pub num_oom_rejections: i64,
}

fn stat(s: cachealloc_core::Stat) -> cachealloc_stat {
    cachealloc_stat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn stat_array(a: cachealloc_core::StatArray) -> [cachealloc_stat; 3] {
    a.0.map(stat)
}

impl From<cachealloc_core::DeviceStats> for cachealloc_device_stats {
    fn from(s: cachealloc_core::DeviceStats) -> Self {
        cachealloc_device_stats {
            allocation: stat_array(s.allocation),
            segment: stat_array(s.segment),
            active: stat_array(s.active),
            inactive_split: stat_array(s.inactive_split),
            allocated_bytes: stat_array(s.allocated_bytes),
            reserved_bytes: stat_array(s.reserved_bytes),
            active_bytes: stat_array(s.active_bytes),
            inactive_split_bytes: stat_array(s.inactive_split_bytes),
            requested_bytes: stat_array(s.requested_bytes),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            oversize_allocations: stat(s.oversize_allocations),
            oversize_segments: stat(s.oversize_segments),
            num_sync_all_streams: s.num_sync_all_streams,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            max_split_size: s.max_split_size,
            num_oom_rejections: s.num_oom_rejections,
        }
    }
}

/// Fill `*out` with the statistics of `device` (PyTorch's `getDeviceStats`:
/// the values `cachealloc_memory_stats` reports by key, as one struct).
/// Returns 0, or -1 (NULL `out`, bad device).
///
/// # Safety
///
/// `out` is NULL (an error) or points to a writable `cachealloc_device_stats`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_get_device_stats(
    device: c_int,
    out: *mut cachealloc_device_stats,
) -> c_int {
    status("cachealloc_get_device_stats", || {
        if out.is_null() {
            return Err("cachealloc_get_device_stats: out is NULL".to_string());
        }
        let stats = on_device!(registry::device(device)?, |a| a.stats().map_err(text))?;
        // SAFETY: non-null, and writable by the caller's contract.
        unsafe { out.write(stats.into()) };
        Ok(())
    })
}
