//! The last error of each thread, and [`guard`], the wrapper every exported
//! function runs its body in: it clears the thread's last error, catches
//! any panic (so none crosses the C boundary), and turns a failure into the
//! function's failure value with the message kept for
//! `cachealloc_last_error`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a failing body returns: the message for `cachealloc_last_error`.
pub(crate) type Res<T> = Result<T, String>;

thread_local! {
    /// The last failure on this thread (`None`: the last call succeeded).
    static LAST_ERROR: RefCell<Option<LastError>> = const { RefCell::new(None) };
    /// What the guard must do besides running the call ([`HAS_ERROR`],
    /// [`PANIC_NEXT`]): one byte, read once per call (a call after a
    /// success reads nothing else).
    static STATE: Cell<u8> = const { Cell::new(0) };
    /// The device whose lock is held while this thread runs one of the
    /// library's callbacks ([`IN_CALLBACK`]).
    static LOCKED_DEVICE: Cell<c_int> = const { Cell::new(-1) };
    /// Set by the body of a failing call whose failure has a code of its
    /// own (an out-of-memory, ...; 0: `CACHEALLOC_ERROR_OTHER`); taken by
    /// its guard on the way out (only a failure sets it, so a call that
    /// succeeds pays nothing for it).
    static PENDING_CODE: Cell<c_int> = const { Cell::new(0) };
}

/// [`STATE`]: `LAST_ERROR` holds an error (the next call clears it).
const HAS_ERROR: u8 = 1;
/// [`STATE`]: set by `cachealloc_debug_force_internal_error` (feature
/// `debug-hooks`), the next guarded call on this thread panics inside its
/// guard.
const PANIC_NEXT: u8 = 2;
/// [`STATE`]: this thread runs a callback of the library while a device's
/// lock is held ([`under_lock`]): every guarded call fails at once.
const IN_CALLBACK: u8 = 4;

/// Run `callback`, a caller's function the library calls while device
/// `device`'s lock is held (a trace tracker, a segment source, a stream
/// filter). A call into the library from inside it would wait for that
/// lock for ever: it fails at once instead, with an error naming the rule
/// (the callback sees it; the outer call's own result is untouched).
pub(crate) fn under_lock<R>(device: c_int, callback: impl FnOnce() -> R) -> R {
    /// Puts the thread's marks back as they were (a callback is C code and
    /// does not unwind, but the marks must not outlive it whatever happens).
    struct Restore {
        nested: bool,
        device: c_int,
        had_error: bool,
    }
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = LOCKED_DEVICE.try_with(|d| d.set(self.device));
            if !self.nested {
                update_state(0, IN_CALLBACK);
            }
            // A refusal inside the callback was the callback's error.
            if !self.had_error && STATE.try_with(Cell::get).unwrap_or(0) & HAS_ERROR != 0 {
                clear_last_error();
            }
        }
    }
    let state = STATE.try_with(Cell::get).unwrap_or(0);
    let _restore = Restore {
        nested: state & IN_CALLBACK != 0,
        device: LOCKED_DEVICE.try_with(|d| d.replace(device)).unwrap_or(-1),
        had_error: state & HAS_ERROR != 0,
    };
    update_state(IN_CALLBACK, 0);
    callback()
}

/// The next guarded call on this thread panics inside its guard (the
/// `debug-hooks` feature's `cachealloc_debug_force_internal_error`).
#[cfg(feature = "debug-hooks")]
pub(crate) fn panic_next() -> c_int {
    STATE
        .try_with(|s| s.set(s.get() | PANIC_NEXT))
        .map_or(-1, |()| 0)
}

/// This thread's [`STATE`] with `set` bits set and `clear` bits cleared.
fn update_state(set: u8, clear: u8) {
    let _ = STATE.try_with(|s| s.set((s.get() | set) & !clear));
}

/// A failure: its message and its `cachealloc_last_error_code`.
struct LastError {
    text: CString,
    code: c_int,
}

/// `cachealloc_last_error_code()`: the last call succeeded.
pub const CACHEALLOC_OK: c_int = 0;
/// `cachealloc_last_error_code()`: the last call failed because the device
/// (or the memory fraction) had no room: PyTorch's "CUDA out of memory",
/// which torch raises as `torch.OutOfMemoryError`.
pub const CACHEALLOC_ERROR_OUT_OF_MEMORY: c_int = 1;
/// `cachealloc_last_error_code()`: the last call failed for any other
/// reason (a bad argument or pointer, a driver error, metadata exhausted).
pub const CACHEALLOC_ERROR_OTHER: c_int = 2;
/// `cachealloc_last_error_code()`: a buffer the caller gave is too small;
/// the function's out-parameter holds the size needed, and nothing else
/// changed (`cachealloc_share_ipc_pages`: `out->pages` descriptors).
pub const CACHEALLOC_ERROR_BUFFER_TOO_SMALL: c_int = 3;
/// `cachealloc_last_error_code()`: the block lives in an expandable
/// segment, which is shared as its pages (`cachealloc_share_ipc_pages`),
/// not as a handle (`cachealloc_share_ipc_handle`).
pub const CACHEALLOC_ERROR_EXPANDABLE_SEGMENT: c_int = 4;

/// The failing call in progress on this thread is an out-of-memory: its
/// code is `CACHEALLOC_ERROR_OUT_OF_MEMORY`. Called only as the error is
/// returned (the guard takes the mark with the failure).
pub(crate) fn mark_out_of_memory() {
    mark_code(CACHEALLOC_ERROR_OUT_OF_MEMORY);
}

/// The failing call in progress on this thread fails with `code` (one of
/// the `CACHEALLOC_ERROR_*`). Called only as the error is returned.
pub(crate) fn mark_code(code: c_int) {
    let _ = PENDING_CODE.try_with(|p| p.set(code));
}

/// Keep `msg` as this thread's last error (interior NULs become spaces),
/// with the code the failing body marked (`CACHEALLOC_ERROR_OTHER` if none).
#[cold]
#[inline(never)]
pub(crate) fn set_last_error(msg: &str) {
    let code = PENDING_CODE.try_with(Cell::take).unwrap_or(0);
    let error = LastError {
        text: CString::new(msg.replace('\0', " ")).unwrap_or_default(),
        code: if code == 0 {
            CACHEALLOC_ERROR_OTHER
        } else {
            code
        },
    };
    // A thread being torn down has no last error any more: nothing to keep.
    if LAST_ERROR
        .try_with(|e| *e.borrow_mut() = Some(error))
        .is_ok()
    {
        update_state(HAS_ERROR, 0);
    }
}

/// Forget this thread's last error.
#[cold]
fn clear_last_error() {
    let cleared = LAST_ERROR.try_with(|e| match e.try_borrow_mut() {
        Ok(mut e) => {
            *e = None;
            true
        }
        Err(_) => false,
    });
    if cleared != Ok(false) {
        update_state(0, HAS_ERROR);
    }
}

/// This thread's last error as text ("no message" when there is none).
pub(crate) fn last_error_text() -> String {
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|e| e.text.to_string_lossy().into_owned()))
        })
        .ok()
        .flatten()
        .unwrap_or_else(|| "no message".to_string())
}

/// This thread's last error, or null: valid until the next call into the
/// library on this thread (which clears or replaces it).
fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|e| e.text.as_ptr()))
                .unwrap_or(std::ptr::null())
        })
        .unwrap_or(std::ptr::null())
}

/// Run `body` as exported function `name`: its value on success; on an
/// error, or a panic, `failed`, with the message kept as the thread's last
/// error (a panic's as "internal error in NAME: ...").
#[inline]
pub(crate) fn guard<T>(name: &'static str, failed: T, body: impl FnOnce() -> Res<T>) -> T {
    // One byte read, one test, on a call after a success.
    let state = STATE.try_with(Cell::get).unwrap_or(0);
    let mut panic_next = false;
    if state != 0 {
        match entering(name, state) {
            Entering::Run => {}
            Entering::PanicNext => panic_next = true,
            Entering::Refused => return failed,
        }
    }
    let run = AssertUnwindSafe(|| {
        if panic_next {
            panic!("forced by cachealloc_debug_force_internal_error");
        }
        body()
    });
    match catch_unwind(run) {
        Ok(Ok(value)) => value,
        Ok(Err(msg)) => {
            set_last_error(&msg);
            failed
        }
        Err(payload) => {
            panicked(name, payload);
            failed
        }
    }
}

/// What [`guard`] does with a call on a thread with marks in [`STATE`].
enum Entering {
    Run,
    /// Run it, panicking inside the guard (`debug-hooks`).
    PanicNext,
    /// Fail it: it came from a callback under a device's lock.
    Refused,
}

/// [`guard`]'s way in for a thread with marks: the last error cleared, and
/// a call from a callback under a device's lock refused.
#[cold]
#[inline(never)]
fn entering(name: &str, state: u8) -> Entering {
    if state & HAS_ERROR != 0 {
        clear_last_error();
    }
    if state & IN_CALLBACK != 0 {
        let device = LOCKED_DEVICE.try_with(Cell::get).unwrap_or(-1);
        set_last_error(&format!(
            "{name} called from a callback while device {device} is locked: trace trackers, \
             segment sources and stream filters run under the device's lock and must not call \
             into cachealloc (the call would wait for that lock for ever)"
        ));
        return Entering::Refused;
    }
    // Without the `debug-hooks` feature nothing sets the bit: the test is
    // compiled out.
    if cfg!(feature = "debug-hooks") && state & PANIC_NEXT != 0 {
        update_state(0, PANIC_NEXT);
        return Entering::PanicNext;
    }
    Entering::Run
}

/// Keep a panic caught in `name` as the thread's last error (out of the
/// exported functions' way: they inline the guard).
#[cold]
#[inline(never)]
fn panicked(name: &str, payload: Box<dyn std::any::Any + Send>) {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string());
    set_last_error(&format!("internal error in {name}: {what}"));
}

/// The message of the last failed call on this thread, or NULL when the
/// last call succeeded: every call clears it first, except this one and
/// `cachealloc_version`. The string stays valid until the next call into
/// cachealloc on this thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn cachealloc_last_error() -> *const c_char {
    last_error_ptr()
}

/// The kind of the last failed call on this thread:
/// `CACHEALLOC_ERROR_OUT_OF_MEMORY` (an allocation found no room: the
/// message is PyTorch's "CUDA out of memory. ..."),
/// `CACHEALLOC_ERROR_BUFFER_TOO_SMALL` and
/// `CACHEALLOC_ERROR_EXPANDABLE_SEGMENT` (the IPC calls say when),
/// `CACHEALLOC_ERROR_OTHER`, or `CACHEALLOC_OK` (0) when the last call
/// succeeded. Branch on these, never on the message's text. Cleared and set as
/// `cachealloc_last_error()` is; this call changes neither.
#[no_mangle]
pub extern "C" fn cachealloc_last_error_code() -> c_int {
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|e| e.code))
                .unwrap_or(CACHEALLOC_OK)
        })
        .unwrap_or(CACHEALLOC_OK)
}

/// [`guard`] for a function that returns a status: 0, or -1 on failure.
#[inline]
pub(crate) fn status(name: &'static str, body: impl FnOnce() -> Res<()>) -> c_int {
    guard(name, -1, || body().map(|()| 0))
}

/// Write `value` to `out` (refused when NULL).
///
/// # Safety
/// `out` is NULL or points to memory writable for a `T`.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T, name: &str) -> Res<()> {
    if out.is_null() {
        return Err(format!("{name}: out is NULL"));
    }
    // SAFETY: non-null, and writable for a `T` by this function's contract.
    unsafe { out.write(value) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> Option<String> {
        let p = last_error_ptr();
        // SAFETY: a non-null pointer from `last_error_ptr` points at this
        // thread's live CString, which nothing replaces before this read.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    #[test]
    fn errors_are_kept_until_the_next_call_and_panics_are_caught() {
        assert_eq!(guard("f", 0, || Ok(1)), 1);
        assert_eq!(last(), None);
        assert_eq!(guard("f", 0, || Err("bad\0thing".to_string())), 0);
        assert_eq!(last().as_deref(), Some("bad thing"));
        assert_eq!(status("f", || Ok(())), 0);
        assert_eq!(last(), None);
        #[cfg(feature = "debug-hooks")]
        {
            assert_eq!(panic_next(), 0);
            assert_eq!(status("g", || Ok(())), -1);
            let msg = last().unwrap_or_default();
            assert!(msg.starts_with("internal error in g: forced"), "{msg}");
            assert_eq!(status("g", || Ok(())), 0, "armed once only");
        }
        assert_eq!(status("h", || panic!("boom")), -1);
        let msg = last().unwrap_or_default();
        assert!(msg.starts_with("internal error in h: boom"), "{msg}");
    }
}
