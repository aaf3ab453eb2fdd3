//! Out-of-memory observers and trace trackers: C callbacks told of every
//! final out-of-memory (or every history entry) on any device, existing or
//! created later (PyTorch's `attachOutOfMemoryObserver`, which reaches only
//! the devices that exist). Each device carries one forwarder that calls
//! them all (`forward.rs`).

use crate::error::{guard, Res};
use crate::forward::{OBSERVERS, REJECTION_OBSERVERS, TRACKERS};
use std::ffi::{c_int, c_void};

/// An out-of-memory observer: `(device, alloc_size, device_total,
/// device_free, user)`. `alloc_size` is the segment size that could not be
/// had (PyTorch's second argument); `device_total` is the memory limit when
/// a memory fraction is set, else the device's total memory (PyTorch's
/// typedef calls it `device_total`, its Python wrapper `device_allocated`);
/// `device_free` is the device's free memory then.
#[allow(non_camel_case_types)]
pub type cachealloc_oom_observer = Option<extern "C" fn(c_int, usize, usize, usize, *mut c_void)>;

/// Attach an out-of-memory observer, called (with `user`) on every final
/// out-of-memory of any device from now on, after the allocator gave up and
/// before the failing allocation returns NULL.
///
/// The observer runs on the allocating thread once that device's lock is
/// released (PyTorch's order): it may call any function of the library,
/// on any device, the failing one included (read `cachealloc_memory_stats`,
/// record an annotation, take a snapshot, free memory). It runs inside the
/// failing call, so that call's `cachealloc_last_error()` is set after the
/// observers return. Returns 0, or -1 when `observer` is NULL or 64 are
/// attached already.
#[no_mangle]
pub extern "C" fn cachealloc_attach_oom_observer(
    observer: cachealloc_oom_observer,
    user: *mut c_void,
) -> c_int {
    guard("cachealloc_attach_oom_observer", -1, || -> Res<c_int> {
        let callback = observer.ok_or("cachealloc_attach_oom_observer: observer is NULL")?;
        OBSERVERS
            .push(callback, user, "out-of-memory observer")
            .map_err(|e| format!("cachealloc_attach_oom_observer: {e}"))?;
        Ok(0)
    })
}

/// A trace tracker: called with every memory-history entry of every device
/// as it is recorded, whether or not the history is on (PyTorch's
/// `attachAllocatorTraceTracker`), and the caller's `user` pointer.
/// Called when the rejection policy (`throw_on_cudamalloc_oom` with
/// `per_process_memory_fraction`) refuses a request before any device call
/// (torch 2.12's `OomRejectionObserver`): the device, the segment it would
/// have made, the bytes reserved then, the device's total memory, and the
/// caller's `user` pointer. Called after the device's lock is released, on
/// the allocating thread.
#[allow(non_camel_case_types)]
pub type cachealloc_oom_rejection_observer =
    Option<extern "C" fn(c_int, usize, usize, usize, *mut c_void)>;

/// Attach a rejection observer (torch's `attachOomRejectionObserver`; at
/// most 64). Returns 0, or -1 (NULL observer, too many).
#[no_mangle]
pub extern "C" fn cachealloc_attach_oom_rejection_observer(
    observer: cachealloc_oom_rejection_observer,
    user: *mut c_void,
) -> c_int {
    guard(
        "cachealloc_attach_oom_rejection_observer",
        -1,
        || -> Res<c_int> {
            let callback =
                observer.ok_or("cachealloc_attach_oom_rejection_observer: observer is NULL")?;
            REJECTION_OBSERVERS
                .push(callback, user, "OOM rejection observer")
                .map_err(|e| format!("cachealloc_attach_oom_rejection_observer: {e}"))?;
            Ok(0)
        },
    )
}

#[allow(non_camel_case_types)]
pub type cachealloc_trace_tracker =
    Option<extern "C" fn(*const crate::trace_entry::cachealloc_trace_entry, *mut c_void)>;

/// Attach a trace tracker, called (with `user`) with every memory-history
/// entry of every device, existing or created later, as it is recorded
/// (PyTorch's `attachAllocatorTraceTracker`): allocations, frees, segment
/// allocations and frees, page maps, snapshots, out-of-memories, whether or
/// not the history is on. An annotation's entry has no name here
/// (`annotation` is NULL; `context` is its id).
///
/// The tracker runs while the device's lock is held, as PyTorch's do, and
/// should be quick: a call into cachealloc from it fails ("called from a
/// callback while device N is locked") instead of waiting for the lock. Until the first
/// tracker is attached, the allocator pays nothing for them. Returns 0, or
/// -1 (NULL `tracker`, or 64 attached already).
#[no_mangle]
pub extern "C" fn cachealloc_attach_trace_tracker(
    tracker: cachealloc_trace_tracker,
    user: *mut c_void,
) -> c_int {
    guard("cachealloc_attach_trace_tracker", -1, || -> Res<c_int> {
        let callback = tracker.ok_or("cachealloc_attach_trace_tracker: tracker is NULL")?;
        TRACKERS
            .push(callback, user, "trace tracker")
            .map_err(|e| format!("cachealloc_attach_trace_tracker: {e}"))?;
        crate::registry::once_for_all_and_new(crate::registry::attach_trace_forward, |new| {
            &mut new.trace_forward
        })
        .map(|()| 0)
    })
}
