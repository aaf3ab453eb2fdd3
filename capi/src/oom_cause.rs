//! Why an allocation ran out of memory, for C callers: the verdict of this
//! thread's last out-of-memory (`cachealloc_last_oom_cause`), kept by the
//! devices' observer as the failure happens and used for its message, and
//! the observers of `cachealloc_attach_oom_cause_observer`. Below the
//! devices (`backend.rs` and the observer forwarder use it).

use crate::callbacks::Callbacks;
use crate::error::{guard, status, write_out as write};
use cachealloc_core::{OomCause, OomReport};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};

/// Why an allocation ran out of memory, with the bytes behind the verdict
/// ("the request's pools": the default pools, or the private pool its
/// stream was routed to).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct cachealloc_oom_cause {
    /// The verdict: 0 capacity, 1 memory_fraction, 2 fragmentation, 3
    /// pending_frees, 4 other_streams, 5 private_pools, 6 mixed, 7
    /// other_memory, 8 other_size, 9 rejected, 10 pool_allocator.
    pub class_: c_int,
    /// The verdict's name (a static string).
    pub class_name: *const c_char,
    /// The block size the request needed.
    pub needed: u64,
    /// Bytes handed out, in every pool.
    pub live_bytes: u64,
    /// The memory limit, else the device's total.
    pub limit: u64,
    /// The segment the allocator asked the device for.
    pub segment: u64,
    /// Bytes the device could still have given under the limit.
    pub headroom: u64,
    /// Bytes cached in the request's pool (its block size) on its stream.
    pub free_bytes: u64,
    /// The largest of those blocks.
    pub largest_free_block: u64,
    /// Bytes of the request's pools waiting on events (or parked by a capture).
    pub pending_free_bytes: u64,
    /// Bytes cached or pending in the request's pool (its block size) in other streams' blocks.
    pub other_streams_bytes: u64,
    /// Bytes cached or pending in other pools than the request's.
    pub private_pools_bytes: u64,
    /// Bytes cached or pending in the request's pools, on any stream, in blocks of the other size.
    pub other_size_bytes: u64,
    /// Reserved address space of expandable segments with no page mapped.
    pub unmapped_bytes: u64,
}

impl From<&OomCause> for cachealloc_oom_cause {
    fn from(c: &OomCause) -> Self {
        cachealloc_oom_cause {
            class_: c.class.index() as c_int,
            class_name: c.class.as_cstr().as_ptr(),
            needed: c.needed,
            live_bytes: c.live_bytes,
            limit: c.limit,
            segment: c.segment,
            headroom: c.headroom,
            free_bytes: c.free_bytes,
            largest_free_block: c.largest_free_block,
            pending_free_bytes: c.pending_free_bytes,
            other_streams_bytes: c.other_streams_bytes,
            private_pools_bytes: c.private_pools_bytes,
            other_size_bytes: c.other_size_bytes,
            unmapped_bytes: c.unmapped_bytes,
        }
    }
}

thread_local! {
    /// The cause of this thread's last out-of-memory: set only as a failing
    /// call returns, from the device's verdict of that call's number.
    static LAST_CAUSE: Cell<Option<OomCause>> = const { Cell::new(None) };
}

/// This thread's last out-of-memory had no verdict (a request refused
/// before the allocator).
pub(crate) fn forget() {
    let _ = LAST_CAUSE.try_with(|c| c.set(None));
}

/// The failing call's out-of-memory `r`, with its verdict `cause` (the
/// device's, found by the error's number; `None` once the device no
/// longer keeps it): kept as this thread's last, and the message,
/// PyTorch's then the verdict with its bytes.
pub(crate) fn explained(r: &OomReport, cause: Option<OomCause>) -> String {
    let _ = LAST_CAUSE.try_with(|c| c.set(cause));
    match cause {
        Some(c) => r.explained(&c).to_string(),
        None => r.to_string(),
    }
}

/// Why this thread's last out-of-memory happened (kept until the next
/// one), into `*out`. Returns 0, 1 when this thread has had none or its
/// last had no verdict (a request of 1 EiB or more, refused before the
/// allocator), or -1 for a NULL `out`.
///
/// # Safety
/// `out` is NULL or points to a writable `cachealloc_oom_cause`.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_last_oom_cause(out: *mut cachealloc_oom_cause) -> c_int {
    guard("cachealloc_last_oom_cause", -1, || {
        match LAST_CAUSE.try_with(Cell::get).ok().flatten() {
            // SAFETY: `out` is NULL or writable, by this function's contract.
            Some(c) => unsafe { write(out, (&c).into(), "cachealloc_last_oom_cause") }.map(|()| 0),
            None => Ok(1),
        }
    })
}

#[allow(non_camel_case_types)]
pub type cachealloc_oom_cause_observer =
    Option<extern "C" fn(c_int, *const cachealloc_oom_cause, *mut c_void)>;

type CauseFn = extern "C" fn(c_int, *const cachealloc_oom_cause, *mut c_void);

static CAUSE_OBSERVERS: Callbacks<CauseFn> = Callbacks::new();

/// Tell the cause observers of an out-of-memory on `device` (outside the
/// device's lock; an observer may attach another).
pub(crate) fn tell(device: u32, cause: &OomCause) {
    if CAUSE_OBSERVERS.is_empty() {
        return;
    }
    let c: cachealloc_oom_cause = cause.into();
    CAUSE_OBSERVERS.each(|f, user| f(device as c_int, &c, user));
}

/// Call `observer(device, cause, user)` at every out-of-memory from now on,
/// before the `cachealloc_attach_oom_observer` observers, once the device's
/// lock is released (so it may call back into the library). `cause` lives
/// for the call. Returns 0, or -1 for a NULL observer (or 64 attached
/// already).
#[no_mangle]
pub extern "C" fn cachealloc_attach_oom_cause_observer(
    observer: cachealloc_oom_cause_observer,
    user: *mut c_void,
) -> c_int {
    status("cachealloc_attach_oom_cause_observer", || {
        let f = observer.ok_or("cachealloc_attach_oom_cause_observer: observer is NULL")?;
        CAUSE_OBSERVERS
            .push(f, user, "out-of-memory cause observer")
            .map_err(|e| format!("cachealloc_attach_oom_cause_observer: {e}"))
    })
}
