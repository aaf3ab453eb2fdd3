//! A memory-history entry as C sees it (`cachealloc_trace_entry`): what a
//! trace tracker is called with and what a snapshot walk visits. Below the
//! devices (the trackers' forwarder makes them).

use cachealloc_core::{TraceAction, TraceEntry};
use std::ffi::{c_char, c_int, c_void};

/// One entry of the memory history (PyTorch's `TraceEntry`).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_trace_entry {
    /// PyTorch's `TraceEntry::Action`: 0 alloc, 1 free_requested,
    /// 2 free_completed, 3 segment_alloc, 4 segment_free, 5 segment_map,
    /// 6 segment_unmap, 7 snapshot, 8 oom; and 9 for a caller's annotation
    /// (`cachealloc_record_annotation`).
    pub action: c_int,
    /// The device.
    pub device: c_int,
    /// The block or segment address (for `oom`: the device's free bytes).
    pub addr: u64,
    /// Bytes: the request for alloc and frees, the segment or the mapped
    /// range for segment actions, the rounded request for `oom`.
    pub size: usize,
    /// The stream.
    pub stream: *mut c_void,
    /// When, in microseconds of the backend's clock (on CUDA and HIP: since
    /// the Unix epoch).
    pub time_us: u64,
    /// The trace context in force (for an annotation: its id).
    pub context: u64,
    /// An annotation's name (valid during the call only); NULL for the
    /// other actions.
    pub annotation: *const c_char,
    /// The pool of the block or segment (PyTorch's `TraceEntry::mempool_`,
    /// a snapshot's `pool_id`): `(0, 0)` for the default pools; for `oom`
    /// the request's pool; `(0, 0)` for a snapshot or an annotation.
    pub pool_id0: u64,
    /// The second half of the pool's id.
    pub pool_id1: u64,
}

/// `e` as a C structure (no annotation name).
pub(crate) fn entry(e: &TraceEntry) -> cachealloc_trace_entry {
    cachealloc_trace_entry {
        action: TraceAction::ALL
            .iter()
            .position(|a| *a == e.action)
            .unwrap_or(0) as c_int,
        device: e.device as c_int,
        addr: e.addr,
        size: e.size as usize,
        stream: e.stream as usize as *mut c_void,
        time_us: e.time_us,
        context: e.context,
        annotation: std::ptr::null(),
        pool_id0: e.pool.0,
        pool_id1: e.pool.1,
    }
}
