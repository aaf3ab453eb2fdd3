//! Hooks for tests of the failure paths (feature `debug-hooks`, off by
//! default: not in the default `libcachealloc.so`, and declared in
//! `cachealloc.h` only under `CACHEALLOC_DEBUG_HOOKS`). A caller that
//! could arm them could fail a device for good, so a production library
//! has none, and its alloc and free pay nothing for them.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

/// Some thread armed the hook (cleared never: the test process ends).
static ANY: AtomicBool = AtomicBool::new(false);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Whether some thread armed the hook (one relaxed load).
#[inline]
pub(crate) fn armed() -> bool {
    ANY.load(Ordering::Relaxed)
}

/// Called inside a device's lock: panics once if this thread armed it.
#[cold]
pub(crate) fn inside_lock() {
    if ARMED.try_with(Cell::take).unwrap_or(false) {
        panic!("forced inside the device's lock by cachealloc_debug_fail_inside_lock");
    }
}

/// For tests of the error path: the next call into cachealloc on this
/// thread panics inside its guard, and so fails as an internal error would
/// (NULL or -1, with "internal error in FUNCTION: ..." in
/// `cachealloc_last_error()`). Returns 0. Only with the `debug-hooks`
/// feature.
#[no_mangle]
pub extern "C" fn cachealloc_debug_force_internal_error() -> c_int {
    crate::error::panic_next()
}

/// For tests of the failure path inside a device's lock: the next
/// allocation or free on this thread panics while it holds the device's
/// lock, after the allocator has started on it, as an internal error there
/// would. The call fails ("internal error in ..."), and the device is
/// failed for good: every later call on it fails with "device N failed"
/// (its metadata may be half-updated), while other devices work on.
/// Returns 0. Only with the `debug-hooks` feature.
#[no_mangle]
pub extern "C" fn cachealloc_debug_fail_inside_lock() -> c_int {
    ANY.store(true, Ordering::Relaxed);
    ARMED.try_with(|a| a.set(true)).map_or(-1, |()| 0)
}
