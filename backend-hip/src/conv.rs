//! The one place where HIP status codes become this crate's errors.

use hip_sys::hiprt::{hipError_t, hipGetErrorName};
use std::ffi::CStr;
use std::fmt;

/// A HIP backend error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HipError {
    /// The runtime found no device (`hipErrorNoDevice`), or not this ordinal.
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// A runtime call failed.
    Runtime {
        /// The HIP function.
        call: &'static str,
        /// The `hipError_t` code.
        code: u32,
        /// Its name (`hipError...`).
        name: String,
    },
    /// A call of the operating system, or a request the backend cannot
    /// serve (taking another process's descriptors for its pages).
    System {
        /// The call.
        call: &'static str,
        /// `errno` (0: not the system's).
        errno: i32,
        /// What went wrong.
        message: String,
    },
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HipError::NoDevice { ordinal, count } => {
                write!(f, "no HIP device {ordinal} ({count} device(s) present)")
            }
            HipError::Runtime { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
            HipError::System { call, message, .. } => write!(f, "{call} failed: {message}"),
        }
    }
}

impl std::error::Error for HipError {}

/// The name of a status code.
pub(crate) fn name(e: hipError_t) -> String {
    // SAFETY: hipGetErrorName returns a pointer to a static, NUL-terminated
    // string for every code (an "unknown" string for codes it does not know).
    let p = unsafe { hipGetErrorName(e) };
    if p.is_null() {
        return format!("{e:?}");
    }
    // SAFETY: non-null, static and NUL-terminated per the contract above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `Ok` for `hipSuccess`, else the named error.
pub(crate) fn check(e: hipError_t, call: &'static str) -> Result<(), HipError> {
    if e == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(error(e, call))
    }
}

/// The named error of a failed call.
pub(crate) fn error(e: hipError_t, call: &'static str) -> HipError {
    HipError::Runtime {
        call,
        code: e as u32,
        name: name(e),
    }
}

/// `hipSuccess`.
pub(crate) fn is_success(e: hipError_t) -> bool {
    e == hipError_t::hipSuccess
}

/// `hipErrorOutOfMemory`.
pub(crate) fn is_out_of_memory(e: hipError_t) -> bool {
    e == hipError_t::hipErrorOutOfMemory
}

/// `hipErrorNotReady`: an event still pending.
pub(crate) fn is_not_ready(e: hipError_t) -> bool {
    e == hipError_t::hipErrorNotReady
}

/// `hipErrorNoDevice`.
pub(crate) fn is_no_device(e: hipError_t) -> bool {
    e == hipError_t::hipErrorNoDevice
}
