//! The observer and the trace tracker every device carries, and the lists
//! of C callbacks they call (attached by `observers.rs`, read without a
//! lock). Below the devices: `backend.rs` attaches the observer as it opens
//! a device, `registry.rs` the tracker once one is attached.

use crate::callbacks::Callbacks;
use crate::oom_cause;
use crate::trace_entry::{cachealloc_trace_entry, entry};
use cachealloc_core::OutOfMemoryObserver;
use std::ffi::{c_int, c_void};

/// An out-of-memory or rejection observer's C function.
pub(crate) type OomFn = extern "C" fn(c_int, usize, usize, usize, *mut c_void);

pub(crate) static OBSERVERS: Callbacks<OomFn> = Callbacks::new();

/// The observer every device carries: calls the C observers.
pub(crate) struct Forward;

/// The one [`Forward`] (devices keep `&'static` observers).
pub(crate) static FORWARD: Forward = Forward;

impl OutOfMemoryObserver for Forward {
    fn out_of_memory_explained(
        &self,
        report: &cachealloc_core::OomReport,
        cause: &cachealloc_core::OomCause,
    ) {
        // The failing call finds its own verdict by its error's number
        // (`oom_cause.rs`): nothing of the thread's is set here.
        oom_cause::tell(report.device, cause);
    }

    fn oom_rejected(&self, device: u32, alloc_size: u64, total_allocated: u64, device_total: u64) {
        tell(
            &REJECTION_OBSERVERS,
            device,
            [alloc_size, total_allocated, device_total],
        );
    }

    fn out_of_memory(&self, device: u32, alloc_size: u64, device_total: u64, device_free: u64) {
        tell(&OBSERVERS, device, [alloc_size, device_total, device_free]);
    }
}

/// Call every observer of `list` with the device and its three numbers.
fn tell(list: &Callbacks<OomFn>, device: u32, [a, b, c]: [u64; 3]) {
    list.each(|f, user| f(device as c_int, a as usize, b as usize, c as usize, user));
}

/// The rejection observers.
pub(crate) static REJECTION_OBSERVERS: Callbacks<OomFn> = Callbacks::new();

/// A trace tracker's C function.
pub(crate) type TrackerFn = extern "C" fn(*const cachealloc_trace_entry, *mut c_void);

pub(crate) static TRACKERS: Callbacks<TrackerFn> = Callbacks::new();

/// The trace tracker a device carries once a C tracker is attached: calls
/// them all (devices carry none before, so the allocation path pays nothing
/// while nobody tracks).
pub(crate) struct TraceForward;

/// The one [`TraceForward`].
pub(crate) static TRACE_FORWARD: TraceForward = TraceForward;

impl cachealloc_core::TraceTracker for TraceForward {
    fn trace(&self, e: &cachealloc_core::TraceEntry) {
        let entry = entry(e);
        // Under the device's lock, at every entry: the list is read with no
        // lock of its own.
        crate::error::under_lock(entry.device, || TRACKERS.each(|f, user| f(&entry, user)));
    }
}
