//! Out-of-memory observers: C callbacks told of every final out-of-memory
//! on any device, existing or created later (PyTorch's
//! `attachOutOfMemoryObserver`, which reaches only the devices that exist).
//! Each device carries one [`Forward`] observer that calls them all.

use crate::error::{guard, Res};
use cachealloc_core::OutOfMemoryObserver;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// An out-of-memory observer: `(device, alloc_size, device_total,
/// device_free, user)`. `alloc_size` is the segment size that could not be
/// had (PyTorch's second argument); `device_total` is the memory limit when
/// a memory fraction is set, else the device's total memory (PyTorch's
/// typedef calls it `device_total`, its Python wrapper `device_allocated`);
/// `device_free` is the device's free memory then.
#[allow(non_camel_case_types)]
pub type cachealloc_oom_observer = Option<extern "C" fn(c_int, usize, usize, usize, *mut c_void)>;

/// An observer and its user pointer (kept as an integer: it is the
/// caller's, passed back untouched).
#[derive(Clone, Copy)]
struct Observer {
    callback: extern "C" fn(c_int, usize, usize, usize, *mut c_void),
    user: usize,
}

static OBSERVERS: Mutex<Vec<Observer>> = Mutex::new(Vec::new());

fn observers() -> std::sync::MutexGuard<'static, Vec<Observer>> {
    OBSERVERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The observer every device carries: calls the C observers.
pub(crate) struct Forward;

/// The one [`Forward`] (devices keep `&'static` observers).
pub(crate) static FORWARD: Forward = Forward;

impl OutOfMemoryObserver for Forward {
    fn out_of_memory(&self, device: u32, alloc_size: u64, device_total: u64, device_free: u64) {
        // A copy: an observer may attach another without deadlocking.
        let list = observers().clone();
        for o in list {
            (o.callback)(
                device as c_int,
                alloc_size as usize,
                device_total as usize,
                device_free as usize,
                o.user as *mut c_void,
            );
        }
    }
}

/// Attach an out-of-memory observer, called (with `user`) on every final
/// out-of-memory of any device from now on, after the allocator gave up and
/// before the failing allocation returns NULL.
///
/// The observer runs on the allocating thread once that device's lock is
/// released (PyTorch's order): it may call any function of the library,
/// on any device, the failing one included (read `cachealloc_memory_stats`,
/// record an annotation, take a snapshot, free memory). It runs inside the
/// failing call, so that call's `cachealloc_last_error()` is set after the
/// observers return. Returns 0, or -1 when `observer` is NULL.
#[no_mangle]
pub extern "C" fn cachealloc_attach_oom_observer(
    observer: cachealloc_oom_observer,
    user: *mut c_void,
) -> c_int {
    guard("cachealloc_attach_oom_observer", -1, || -> Res<c_int> {
        let callback = observer.ok_or("cachealloc_attach_oom_observer: observer is NULL")?;
        observers().push(Observer {
            callback,
            user: user as usize,
        });
        Ok(0)
    })
}

/// A trace tracker: called with every memory-history entry of every device
/// as it is recorded, whether or not the history is on (PyTorch's
/// `attachAllocatorTraceTracker`), and the caller's `user` pointer.
#[allow(non_camel_case_types)]
pub type cachealloc_trace_tracker =
    Option<extern "C" fn(*const crate::snapshot_walk::cachealloc_trace_entry, *mut c_void)>;

/// A tracker and its user pointer.
#[derive(Clone, Copy)]
struct Tracker {
    callback: extern "C" fn(*const crate::snapshot_walk::cachealloc_trace_entry, *mut c_void),
    user: usize,
}

static TRACKERS: Mutex<Vec<Tracker>> = Mutex::new(Vec::new());

fn trackers() -> std::sync::MutexGuard<'static, Vec<Tracker>> {
    TRACKERS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The trace tracker a device carries once a C tracker is attached: calls
/// them all (devices carry none before, so the allocation path pays nothing
/// while nobody tracks).
pub(crate) struct TraceForward;

/// The one [`TraceForward`].
pub(crate) static TRACE_FORWARD: TraceForward = TraceForward;

impl cachealloc_core::TraceTracker for TraceForward {
    fn trace(&self, e: &cachealloc_core::TraceEntry) {
        let entry = crate::snapshot_walk::entry(e);
        let list = trackers().clone();
        for t in list {
            (t.callback)(&entry, t.user as *mut c_void);
        }
    }
}

/// Attach a trace tracker, called (with `user`) with every memory-history
/// entry of every device, existing or created later, as it is recorded
/// (PyTorch's `attachAllocatorTraceTracker`): allocations, frees, segment
/// allocations and frees, page maps, snapshots, out-of-memories, whether or
/// not the history is on. An annotation's entry has no name here
/// (`annotation` is NULL; `context` is its id).
///
/// The tracker runs while the device's lock is held, as PyTorch's do: it
/// must not call into cachealloc, and should be quick. Until the first
/// tracker is attached, the allocator pays nothing for them. Returns 0, or
/// -1 (NULL `tracker`).
#[no_mangle]
pub extern "C" fn cachealloc_attach_trace_tracker(
    tracker: cachealloc_trace_tracker,
    user: *mut c_void,
) -> c_int {
    guard("cachealloc_attach_trace_tracker", -1, || -> Res<c_int> {
        let callback = tracker.ok_or("cachealloc_attach_trace_tracker: tracker is NULL")?;
        trackers().push(Tracker {
            callback,
            user: user as usize,
        });
        crate::registry::once_for_all_and_new(
            |d| d.attach_trace_forward(),
            |new| &mut new.trace_forward,
        )
        .map(|()| 0)
    })
}
