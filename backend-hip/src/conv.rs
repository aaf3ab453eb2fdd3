//! The one place where HIP status codes become this crate's errors.

use crate::hip::{hipError_t, hipGetErrorName};
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
    /// No HIP runtime could be loaded (`libamdhip64`).
    NoRuntime {
        /// What was tried, and why it failed.
        message: String,
    },
    /// The HIP runtime lacks an entry point the backend needs.
    MissingSymbol {
        /// The library.
        library: String,
        /// The entry point.
        symbol: &'static str,
        /// Its symbol version.
        version: &'static str,
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
            HipError::NoRuntime { message } => f.write_str(message),
            HipError::MissingSymbol { library, symbol, version } => write!(
                f,
                "{library} lacks {symbol} (version {version}), which cachealloc needs: a HIP runtime of ROCm 5.1 or later is required"
            ),
        }
    }
}

impl std::error::Error for HipError {}

impl From<&crate::hip::LoadError> for HipError {
    fn from(e: &crate::hip::LoadError) -> HipError {
        match e {
            crate::hip::LoadError::NoLibrary { .. } => HipError::NoRuntime {
                message: e.to_string(),
            },
            crate::hip::LoadError::MissingSymbol {
                library,
                symbol,
                version,
            } => HipError::MissingSymbol {
                library: library.clone(),
                symbol,
                version,
            },
        }
    }
}

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
        code: e.0 as u32,
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
