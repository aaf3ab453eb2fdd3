//! `cachealloc_snapshot_walk`: a memory snapshot handed to the caller
//! piece by piece (each segment, then its blocks, then the history), for
//! callers that build their own structures (the C++ allocator for torch
//! fills torch's `SnapshotInfo` from it) instead of reading a file.
//!
//! The device's lock is held only while the snapshot is copied: the
//! visitor runs after, so it may call into the library.

use crate::backend::on_device;
use crate::error::status;
use crate::registry;
use crate::snapshot::names;
pub use crate::trace_entry::cachealloc_trace_entry;
use crate::trace_entry::entry;
use cachealloc_core::SharedAllocator;
use cachealloc_core::{BlockState, Pool, Snapshot};
use std::ffi::{c_int, c_void, CString};

/// One segment of a snapshot (PyTorch's `SegmentInfo`). An expandable
/// segment shows as one segment per run of mapped pages, as in PyTorch.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_segment_info {
    /// The device.
    pub device: c_int,
    /// Base address.
    pub address: u64,
    /// Segment size.
    pub total_size: usize,
    /// Bytes of allocated blocks.
    pub allocated_size: usize,
    /// Bytes of active (allocated, or freed and waiting on events) blocks.
    pub active_size: usize,
    /// Unrounded requested bytes of the active blocks.
    pub requested_size: usize,
    /// The stream the segment was allocated for.
    pub stream: *mut c_void,
    /// 1 for the large pool, 0 for the small one (PyTorch's `is_large`).
    pub is_large: c_int,
    /// 1 for part of an expandable segment.
    pub is_expandable: c_int,
    /// The private pool that owns it (PyTorch's `owner_private_pool_id`;
    /// 0, 0 for the default pools).
    pub pool_id0: u64,
    /// Second half of the pool id.
    pub pool_id1: u64,
    /// How many blocks follow (the `block` calls for this segment).
    pub num_blocks: usize,
}

/// One block of a segment (PyTorch's `BlockInfo`).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_block_info {
    /// Start address.
    pub address: u64,
    /// Block size.
    pub size: usize,
    /// Unrounded size of the last request that used it.
    pub requested_size: usize,
    /// 1 while handed out (`active_allocated`).
    pub allocated: c_int,
    /// 1 while handed out or freed and waiting on events of other streams
    /// (`active_allocated`, `active_pending_free`); 0 when cached (`inactive`).
    pub active: c_int,
}

/// What `cachealloc_snapshot_walk` calls, each with the walk's `user`
/// pointer; any of them may be NULL (not called). The structures are valid
/// during the call only.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_snapshot_visitor {
    /// Each segment, in address order by device; its `num_blocks` blocks
    /// follow.
    pub segment: Option<extern "C" fn(*const cachealloc_segment_info, *mut c_void)>,
    /// Each block of the segment last given, in address order.
    pub block: Option<extern "C" fn(*const cachealloc_block_info, *mut c_void)>,
    /// Each history entry, oldest first, by device, after every segment.
    pub trace_entry: Option<extern "C" fn(*const cachealloc_trace_entry, *mut c_void)>,
}

/// A device's snapshot, copied out of its lock.
pub(crate) struct Walk {
    segments: Vec<(cachealloc_segment_info, Vec<cachealloc_block_info>)>,
    traces: Vec<cachealloc_trace_entry>,
}

impl Walk {
    /// Copy `snap` (its history only with `traces`).
    pub(crate) fn of<St: Into<u64> + From<u64> + Copy>(
        snap: Snapshot<'_, St>,
        traces: bool,
    ) -> Walk {
        let history = traces.then_some(snap.history);
        Walk::of_parts(snap.device, snap.segments, history)
    }

    /// Copy `segments` of device `device`, and `history` when given.
    pub(crate) fn of_parts<'a, St: Into<u64> + From<u64> + Copy + 'a>(
        device: u32,
        segments: impl Iterator<Item = cachealloc_core::SegmentInfo<'a, St>>,
        history: Option<cachealloc_core::HistoryEntries<'a>>,
    ) -> Walk {
        let device = device as c_int;
        let segments = segments
            .map(|s| {
                let blocks: Vec<cachealloc_block_info> = s
                    .blocks()
                    .map(|b| cachealloc_block_info {
                        address: b.address.0,
                        size: b.size as usize,
                        requested_size: b.requested_size as usize,
                        allocated: c_int::from(b.state == BlockState::ActiveAllocated),
                        active: c_int::from(b.state != BlockState::Inactive),
                    })
                    .collect();
                let info = cachealloc_segment_info {
                    device,
                    address: s.address.0,
                    total_size: s.total_size as usize,
                    allocated_size: s.allocated_size as usize,
                    active_size: s.active_size as usize,
                    requested_size: s.requested_size as usize,
                    stream: Into::<u64>::into(s.stream) as usize as *mut c_void,
                    is_large: c_int::from(s.pool == Pool::Large),
                    is_expandable: c_int::from(s.is_expandable),
                    pool_id0: s.pool_id.0,
                    pool_id1: s.pool_id.1,
                    num_blocks: blocks.len(),
                };
                (info, blocks)
            })
            .collect();
        let traces = history.map(|h| h.map(entry).collect()).unwrap_or_default();
        Walk { segments, traces }
    }
}

/// The index of `TraceAction::UserDefined` in `cachealloc_trace_entry`.
const USER_DEFINED: c_int = 9;

/// `cachealloc_snapshot_walk`'s flag: give the history too.
pub const CACHEALLOC_WALK_TRACES: c_int = 1;
/// `cachealloc_snapshot_walk`'s flag: record no `snapshot` entry (a look at
/// the segments for the caller's own bookkeeping, not a snapshot the user
/// asked for); the history is not given.
pub const CACHEALLOC_WALK_QUIET: c_int = 2;

/// Walk a memory snapshot of `device`, or of every device created so far
/// when `device` is -1: `visitor->segment` for each segment followed by
/// `visitor->block` for each of its blocks, then (with
/// `CACHEALLOC_WALK_TRACES` in `flags` and the history on,
/// `cachealloc_record_history`) `visitor->trace_entry` for each history
/// entry, oldest first. The same content as `cachealloc_snapshot`'s file,
/// as structures. Taking it records a `snapshot` entry in the history, as
/// PyTorch's does, unless `flags` has `CACHEALLOC_WALK_QUIET`.
///
/// The snapshot is copied under the device's lock and the visitor called
/// after it is released: it may call any function of the library. Returns
/// 0, or -1 (NULL visitor, bad device).
///
/// # Safety
///
/// `visitor` is NULL (an error) or points to a readable
/// `cachealloc_snapshot_visitor`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_snapshot_walk(
    device: c_int,
    flags: c_int,
    visitor: *const cachealloc_snapshot_visitor,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_snapshot_walk", || {
        if visitor.is_null() {
            return Err("cachealloc_snapshot_walk: visitor is NULL".to_string());
        }
        // SAFETY: non-null, and readable by the caller's contract.
        let v = unsafe { visitor.read() };
        let mut walks = Vec::new();
        for (i, d) in registry::selected(device)? {
            let quiet = flags & CACHEALLOC_WALK_QUIET != 0;
            let traces = !quiet && flags & CACHEALLOC_WALK_TRACES != 0;
            let mut walk = None;
            if quiet {
                on_device!(d, |a| a
                    .segments(&mut |device, segments| {
                        walk = Some(Walk::of_parts(device, segments, None))
                    })
                    .map_err(|e| format!("device {i}: {e}")))?;
            } else {
                on_device!(d, |a| a
                    .snapshot(&mut |snap| walk = Some(Walk::of(snap, traces)))
                    .map_err(|e| format!("device {i}: {e}")))?;
            }
            walks.extend(walk);
        }
        for w in &walks {
            for (seg, blocks) in &w.segments {
                if let Some(f) = v.segment {
                    f(seg, user);
                }
                if let Some(f) = v.block {
                    for b in blocks {
                        f(b, user);
                    }
                }
            }
        }
        let Some(f) = v.trace_entry else {
            return Ok(());
        };
        // A copy: no lock is held while the visitor runs.
        let names = names().all();
        for w in &walks {
            for e in &w.traces {
                let mut e = *e;
                let name = (e.action == USER_DEFINED)
                    .then(|| CString::new(crate::snapshot::name(&names, e.context)))
                    .transpose()
                    .map_err(|e| e.to_string())?;
                if let Some(n) = &name {
                    e.annotation = n.as_ptr();
                }
                f(&e, user);
            }
        }
        Ok(())
    })
}
