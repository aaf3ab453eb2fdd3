//! Checkpoints of a private pool (PyTorch's `getCheckpointState` /
//! `setCheckpointPoolState`, which torch.compile's cudagraph trees use to
//! rewind a graph pool to the layout it had after a recording):
//! `cachealloc_checkpoint_pool` copies every block of the pool out,
//! `cachealloc_restore_pool` frees the pool's live allocations and carves
//! it back into the checkpoint's blocks, as PyTorch does
//! (`DeviceAllocator::restore_pool` in the core).

use crate::backend::{on_device, text};
use crate::error::{guard, status, Res};
use crate::registry;
use cachealloc_core::{Allocation, CheckpointBlock, DevicePtr, Error, MempoolId, SharedAllocator};
use std::ffi::{c_int, c_void};

/// One block of a checkpointed pool (PyTorch's `BlockState`): every block
/// of every segment of the pool, segment by segment, each segment's first
/// block marked.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_checkpoint_block {
    /// Its address.
    pub ptr: u64,
    /// Its size.
    pub size: usize,
    /// Its stream.
    pub stream: *mut c_void,
    /// 1 when it was allocated, 0 when free.
    pub allocated: c_int,
    /// 1 for the first block of its segment.
    pub segment_start: c_int,
}

/// What a restore did (the C library's side of PyTorch's
/// `CheckpointDelta`).
pub(crate) struct Restored {
    /// The allocations it freed.
    pub(crate) freed: Vec<u64>,
    /// The allocations it made: address and size.
    pub(crate) allocated: Vec<(u64, u64)>,
}

/// Every block of private pool `id` of `a`. The size and the copy are two
/// calls: a pool that grew in between (another thread allocating into it)
/// is sized again, a few times, before its error is reported.
fn checkpoint<A: SharedAllocator>(a: &A, id: MempoolId) -> Res<Vec<CheckpointBlock>> {
    let mut tries = 0;
    loop {
        let mut out = vec![CheckpointBlock::EMPTY; a.checkpoint_len(id).map_err(text)?];
        match a.checkpoint_pool(id, &mut out) {
            Ok(n) => {
                out.truncate(n);
                return Ok(out);
            }
            Err(Error::Checkpoint { what, .. }) if tries < 4 && what.contains("too short") => {
                tries += 1
            }
            Err(e) => return Err(text(e)),
        }
    }
}

/// Restore private pool `id` of `a` to `blocks`.
fn restore<A: SharedAllocator>(a: &A, id: MempoolId, blocks: &[CheckpointBlock]) -> Res<Restored> {
    // Room: every block of the pool now may be a live allocation (a pool
    // that grows before the restore takes the lock is refused, unchanged).
    let mut freed = vec![DevicePtr::NULL; a.checkpoint_len(id).map_err(text)?];
    let mut made = vec![Allocation::NULL; blocks.iter().filter(|b| b.allocated).count()];
    let n = a
        .restore_pool(id, blocks, &mut freed, &mut made)
        .map_err(text)?;
    Ok(Restored {
        freed: freed[..n.freed].iter().map(|p| p.0).collect(),
        allocated: made[..n.allocated]
            .iter()
            .map(|m| (m.ptr.0, m.size))
            .collect(),
    })
}

/// Called once per pointer a restore freed (`allocated` 0) and once per
/// allocation it made (`allocated` 1: the caller owns it and frees it with
/// `cachealloc_free`), with its size and the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_restore_callback =
    Option<extern "C" fn(*mut c_void, usize, c_int, *mut c_void)>;

/// Copy every block of private pool `(id0, id1)` of `device` to `out`, at
/// most `capacity` of them, and return how many the pool has: call it with
/// a `capacity` of 0 to learn the size, then with room for that many (the
/// pool must not change in between; a larger return asks again). Its frees
/// pending on other streams' events must have completed. Returns -1 on
/// failure (no such pool, a pool with expandable segments, pending events).
///
/// # Safety
///
/// `out` points to room for `capacity` `cachealloc_checkpoint_block`s (or
/// is anything when `capacity` is 0).
#[no_mangle]
pub unsafe extern "C" fn cachealloc_checkpoint_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    out: *mut cachealloc_checkpoint_block,
    capacity: usize,
) -> i64 {
    guard("cachealloc_checkpoint_pool", -1, || {
        let id = MempoolId(id0, id1);
        let blocks = on_device!(registry::device(device)?, |a| checkpoint(&**a, id))?;
        if blocks.len() <= capacity && !out.is_null() {
            for (k, b) in blocks.iter().enumerate() {
                let c = cachealloc_checkpoint_block {
                    ptr: b.ptr.0,
                    size: b.size as usize,
                    stream: b.stream as usize as *mut c_void,
                    allocated: c_int::from(b.allocated),
                    segment_start: c_int::from(b.segment_start),
                };
                // SAFETY: k < blocks.len() <= capacity, and `out` has room
                // for `capacity` blocks by the caller's contract.
                unsafe { out.add(k).write(c) };
            }
        }
        Ok(blocks.len() as i64)
    })
}

/// Rewind private pool `(id0, id1)` of `device` to checkpoint `blocks` (`n`
/// of them, from `cachealloc_checkpoint_pool`): every live allocation of
/// the pool is freed, then each recorded segment is carved into its
/// recorded blocks, the allocated ones handed out again. `callback` (may be
/// NULL) hears of each pointer freed, then of each allocation made, after
/// the device's lock is released. Everything is checked first: on failure
/// (the pool routed to, blocks with pending events or IPC shares, a
/// checkpoint that does not match the pool's segments) nothing changes.
/// Returns 0, or -1.
///
/// # Safety
///
/// `blocks` points to `n` readable `cachealloc_checkpoint_block`s (or is
/// anything when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn cachealloc_restore_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    blocks: *const cachealloc_checkpoint_block,
    n: usize,
    callback: cachealloc_restore_callback,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_restore_pool", || {
        let given: &[cachealloc_checkpoint_block] = if n == 0 {
            &[]
        } else if blocks.is_null() {
            return Err("cachealloc_restore_pool: blocks is NULL".to_string());
        } else {
            // SAFETY: non-null, `n` readable blocks by the caller's contract.
            unsafe { std::slice::from_raw_parts(blocks, n) }
        };
        let blocks: Vec<CheckpointBlock> = given
            .iter()
            .map(|c| {
                let mut b = CheckpointBlock::EMPTY;
                b.ptr = DevicePtr(c.ptr);
                b.size = c.size as u64;
                b.stream = c.stream as usize as u64;
                b.allocated = c.allocated != 0;
                b.segment_start = c.segment_start != 0;
                b
            })
            .collect();
        let id = MempoolId(id0, id1);
        let done = on_device!(registry::device(device)?, |a| restore(&**a, id, &blocks))?;
        if let Some(f) = callback {
            for &p in &done.freed {
                f(p as usize as *mut c_void, 0, 0, user);
            }
            for &(p, size) in &done.allocated {
                f(p as usize as *mut c_void, size as usize, 1, user);
            }
        }
        Ok(())
    })
}
