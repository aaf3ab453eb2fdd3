//! `cachealloc_create_pool_with_source`: a private pool whose segments come
//! from the caller's pair of C functions instead of the device (PyTorch's
//! `torch.cuda.MemPool(allocator=...)`: NCCL's `ncclMemAlloc` for symmetric
//! memory, a pluggable allocator's `alloc` / `free`).
//!
//! The core keeps a source as two plain functions and a context word: the
//! context is a boxed copy of the caller's struct, dropped (after the
//! caller's `release`) when the core deletes the pool.

use crate::backend::{on_device, text};
use crate::error::{status, under_lock, Res};
use crate::registry;
use cachealloc_core::{DevicePtr, MempoolId, PoolOptions, SegmentSource, SharedAllocator};
use std::ffi::{c_int, c_void};

/// A pool's segment source, as C functions. `alloc` and `free` are called
/// on the allocating (or emptying) thread while the device's lock is held:
/// a call into cachealloc from them fails ("called from a callback while
/// device N is locked") instead of waiting for the lock. They must not
/// unwind (a C++ caller catches its exceptions; a failed `alloc` returns
/// NULL).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_segment_source {
    /// `alloc(size, device, stream, user)`: a new segment of `size` bytes
    /// (a multiple of 512) on `device` for a
    /// request on `stream` (a `cudaStream_t`), 512-byte aligned; NULL when
    /// there is none (taken as an out-of-memory: cachealloc frees cached
    /// segments of the pool it may free and asks again, then fails the
    /// allocation).
    pub alloc: Option<extern "C" fn(usize, c_int, *mut c_void, *mut c_void) -> *mut c_void>,
    /// `free(ptr, size, device, stream, user)`: give back the segment at
    /// `ptr` of `size` bytes, made for `stream`.
    pub free: Option<extern "C" fn(*mut c_void, usize, c_int, *mut c_void, *mut c_void)>,
    /// Optional, `release(user)`: called once, when the pool is deleted (its last segment
    /// given back after its last user released it): `user` may go.
    pub release: Option<extern "C" fn(*mut c_void)>,
    /// Passed back to each call.
    pub user: *mut c_void,
}

/// What the core's context word points at.
struct Boxed {
    source: cachealloc_segment_source,
    device: c_int,
}

fn boxed(ctx: usize) -> &'static Boxed {
    // SAFETY: `ctx` is a `Box<Boxed>` leaked by
    // `cachealloc_create_pool_with_source`; the core calls `alloc` / `free`
    // only while the pool exists, and `release` (which frees it) last.
    unsafe { &*(ctx as *const Boxed) }
}

fn alloc(ctx: usize, size: u64, stream: u64) -> Option<DevicePtr> {
    let b = boxed(ctx);
    let f = b.source.alloc?;
    let size = usize::try_from(size).ok()?;
    let p = under_lock(b.device, || {
        f(
            size,
            b.device,
            stream as usize as *mut c_void,
            b.source.user,
        )
    });
    (!p.is_null()).then_some(DevicePtr(p as u64))
}

fn free(ctx: usize, ptr: DevicePtr, size: u64, stream: u64) {
    let b = boxed(ctx);
    if let Some(f) = b.source.free {
        under_lock(b.device, || {
            f(
                ptr.0 as usize as *mut c_void,
                size as usize,
                b.device,
                stream as usize as *mut c_void,
                b.source.user,
            )
        });
    }
}

fn release(ctx: usize) {
    // SAFETY: the core calls `release` once, after the pool's last call;
    // the box was leaked by `cachealloc_create_pool_with_source`.
    let b = unsafe { Box::from_raw(ctx as *mut Boxed) };
    if let Some(r) = b.source.release {
        under_lock(b.device, || r(b.source.user));
    }
}

/// `torch.cuda.MemPool(allocator=...)` (PyTorch's `createOrIncrefPool` with
/// an allocator): create private pool `(id0, id1)` of `device` with one
/// user, whose segments come from `source` (copied) instead of the device.
/// `use_on_oom` and `no_split` are those of `cachealloc_create_pool`. The
/// pool follows PyTorch's rules for such pools: its segments are never
/// expandable (whatever `expandable_segments` says), everything else is as
/// for any private pool: rounding, segment sizes, block order, the memory
/// fraction, `cachealloc_release_pool` and `cachealloc_empty_cache` (which
/// hands its free segments back to `source->free` once it has no user).
///
/// Returns 0, or -1: `source` or one of its two functions NULL, the id
/// `(0, 0)`, a pool that exists already (PyTorch asserts the same), too
/// many pools. On failure nothing is kept and `release` is not called.
///
/// # Safety
///
/// `source` is NULL (an error) or points to a readable
/// `cachealloc_segment_source` (copied here); its functions are callable
/// with its `user` until `release` (or for the process's life without one).
#[no_mangle]
pub unsafe extern "C" fn cachealloc_create_pool_with_source(
    device: c_int,
    id0: u64,
    id1: u64,
    use_on_oom: c_int,
    no_split: c_int,
    source: *const cachealloc_segment_source,
) -> c_int {
    status("cachealloc_create_pool_with_source", || -> Res<()> {
        if source.is_null() {
            return Err("source is NULL".into());
        }
        // SAFETY: checked non-null; the caller passes a valid struct (it
        // is copied here, not kept).
        let source = unsafe { *source };
        if source.alloc.is_none() || source.free.is_none() {
            return Err("source->alloc and source->free must not be NULL".into());
        }
        let mut options = PoolOptions::NONE;
        options.use_on_oom = use_on_oom != 0;
        options.no_split = no_split != 0;
        let dev = registry::device(device)?;
        let ctx = Box::into_raw(Box::new(Boxed { source, device })) as usize;
        let core = SegmentSource::new(alloc, free, ctx).with_release(release);
        let made = on_device!(dev, |a| a
            .create_pool_with_source(MempoolId(id0, id1), options, core)
            .map_err(text));
        if made.is_err() {
            // SAFETY: the core kept nothing of it; nothing else saw it.
            drop(unsafe { Box::from_raw(ctx as *mut Boxed) });
        }
        made
    })
}
