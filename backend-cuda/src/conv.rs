//! The one place where driver results become this crate's errors.

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::cudaError_enum;
use std::fmt;

/// A CUDA backend error.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    NoDriver,
    /// The driver has no device with this ordinal.
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices present.
        count: u32,
    },
    /// A driver call failed.
    Driver {
        /// The driver function.
        call: &'static str,
        /// The `CUresult` code.
        code: u32,
        /// Its name (`CUDA_ERROR_...`).
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

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::NoDriver => write!(f, "no CUDA driver: libcuda could not be loaded"),
            CudaError::NoDevice { ordinal, count } => {
                write!(f, "no CUDA device {ordinal} ({count} device(s) present)")
            }
            CudaError::Driver { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
            CudaError::System { call, message, .. } => write!(f, "{call} failed: {message}"),
        }
    }
}

impl std::error::Error for CudaError {}

/// Whether a driver error is "not ready" (an event still pending).
pub(crate) fn is_not_ready(e: &DriverError) -> bool {
    e.0 == cudaError_enum::CUDA_ERROR_NOT_READY
}

/// Whether a driver error is "no device" (what `cuInit` says when a driver
/// has no GPU to drive).
pub(crate) fn is_no_device(e: &DriverError) -> bool {
    e.0 == cudaError_enum::CUDA_ERROR_NO_DEVICE
}

/// Whether a driver error is out of memory.
pub(crate) fn is_out_of_memory(e: &DriverError) -> bool {
    e.0 == cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
}

/// Map a driver result, naming the call.
pub(crate) fn check<T>(r: Result<T, DriverError>, call: &'static str) -> Result<T, CudaError> {
    r.map_err(|e| driver_error(e, call))
}

/// A driver error, with the code's name.
pub(crate) fn driver_error(e: DriverError, call: &'static str) -> CudaError {
    let name = e
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    CudaError::Driver {
        call,
        code: e.0 as u32,
        name,
    }
}
