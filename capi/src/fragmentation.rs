//! Fragmentation accounting for C callers: where a device's reserved
//! memory is, pool by pool (`cachealloc_get_fragmentation`,
//! `cachealloc_get_pool_memory`). Why an allocation ran out is
//! `oom_cause.rs`.

use crate::backend::{on_device, text};
use crate::error::{status, write_out as write};
use crate::registry;
use cachealloc_core::{Fragmentation, MempoolId, Pool, PoolMemory, SharedAllocator};
use std::ffi::{c_int, c_void};

/// One pool's memory, or several pools' together.
#[repr(C)]
#[derive(Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct cachealloc_pool_memory {
    /// Bytes of mapped segments (PyTorch's reserved bytes).
    pub reserved_bytes: u64,
    /// Bytes of the blocks handed out.
    pub allocated_bytes: u64,
    /// Bytes their callers asked for (allocated minus requested: rounding waste).
    pub requested_bytes: u64,
    /// Bytes of cached (free, reusable) blocks.
    pub free_bytes: u64,
    /// The largest cached block.
    pub largest_free_block: u64,
    /// Cached blocks.
    pub free_blocks: u64,
    /// Bytes of freed blocks waiting on events of other streams (or parked by a capture).
    pub pending_free_bytes: u64,
    /// Expandable segments: reserved address space with no page mapped.
    pub unmapped_bytes: u64,
    /// 1 - largest free block / free bytes (0 with nothing free).
    pub external_fragmentation: f64,
}

impl From<&PoolMemory> for cachealloc_pool_memory {
    fn from(m: &PoolMemory) -> Self {
        cachealloc_pool_memory {
            reserved_bytes: m.reserved_bytes,
            allocated_bytes: m.allocated_bytes,
            requested_bytes: m.requested_bytes,
            free_bytes: m.free_bytes,
            largest_free_block: m.largest_free_block,
            free_blocks: m.free_blocks,
            pending_free_bytes: m.pending_free_bytes,
            unmapped_bytes: m.unmapped_bytes,
            external_fragmentation: m.external_fragmentation(),
        }
    }
}

/// A device's memory by pool, and what is cached for requests on one
/// stream and for the others.
#[repr(C)]
#[derive(Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct cachealloc_fragmentation {
    /// Every pool together.
    pub device: cachealloc_pool_memory,
    /// The default small pool.
    pub small_pool: cachealloc_pool_memory,
    /// The default large pool.
    pub large_pool: cachealloc_pool_memory,
    /// Every private pool (CUDA graphs, MemPool) together.
    pub private_pools: cachealloc_pool_memory,
    /// The stream the next two figures are about.
    pub stream: u64,
    /// Bytes cached in the default pools in blocks of `stream`.
    pub stream_free_bytes: u64,
    /// Bytes cached in the default pools in blocks of other streams.
    pub other_streams_free_bytes: u64,
}

impl From<&Fragmentation> for cachealloc_fragmentation {
    fn from(f: &Fragmentation) -> Self {
        cachealloc_fragmentation {
            device: (&f.device).into(),
            small_pool: (&f.small_pool).into(),
            large_pool: (&f.large_pool).into(),
            private_pools: (&f.private_pools).into(),
            stream: f.stream,
            stream_free_bytes: f.stream_free_bytes,
            other_streams_free_bytes: f.other_streams_free_bytes,
        }
    }
}

/// Device `device`'s memory by pool, with what is cached for requests on
/// `stream` (a `cudaStream_t`; NULL is the default stream) and for other
/// streams, into `*out`. Counted now, in one pass over the blocks. Returns
/// 0, or -1 (the reason in `cachealloc_last_error()`).
///
/// # Safety
/// `out` is NULL or points to a writable `cachealloc_fragmentation`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_get_fragmentation(
    device: c_int,
    stream: *mut c_void,
    out: *mut cachealloc_fragmentation,
) -> c_int {
    status("cachealloc_get_fragmentation", || {
        let stream = stream as usize as u64;
        let f = on_device!(registry::device(device)?, |a| a
            .fragmentation(stream.into())
            .map_err(text))?;
        // SAFETY: `out` is NULL or writable, by this function's contract.
        unsafe { write(out, (&f).into(), "cachealloc_get_fragmentation") }
    })
}

/// One pool's memory: the small (`large` 0) or large pool of the default
/// pools (`id0` = `id1` = 0) or of private pool (`id0`, `id1`), into
/// `*out`. Returns 0, or -1 (an unknown pool, a NULL `out`).
///
/// # Safety
/// `out` is NULL or points to a writable `cachealloc_pool_memory`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_get_pool_memory(
    device: c_int,
    id0: u64,
    id1: u64,
    large: c_int,
    out: *mut cachealloc_pool_memory,
) -> c_int {
    status("cachealloc_get_pool_memory", || {
        let pool = if large != 0 { Pool::Large } else { Pool::Small };
        let m = on_device!(registry::device(device)?, |a| a
            .pool_memory(MempoolId(id0, id1), pool)
            .map_err(text))?;
        // SAFETY: `out` is NULL or writable, by this function's contract.
        unsafe { write(out, (&m).into(), "cachealloc_get_pool_memory") }
    })
}
