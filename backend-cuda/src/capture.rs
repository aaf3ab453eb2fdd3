//! Stream capture (CUDA graphs): while the allocator says a capture is
//! under way on the device, the calls it still makes (a segment's
//! `cuMemAlloc`, the virtual-memory calls that map pages, `cuMemGetInfo`)
//! run with the calling thread in relaxed capture mode, as PyTorch's
//! `cudaMallocMaybeCapturing` runs `cudaMalloc`: in the driver's default
//! (global) mode a potentially unsafe call made while any stream captures
//! fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates the
//! capture. The memory stays valid for the graph's replays: the allocator
//! keeps a capture's private pool until the graph is released.

use crate::conv::check;
use crate::{CudaBackend, CudaError};
use cudarc::driver::sys::{self, CUstreamCaptureMode};

/// The calling thread in relaxed capture mode until dropped; then the mode
/// it had before (`cuThreadExchangeStreamCaptureMode`, push-pop).
pub(crate) struct Relaxed {
    previous: CUstreamCaptureMode,
}

impl Relaxed {
    fn enter() -> Result<Relaxed, CudaError> {
        let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a valid, writable CUstreamCaptureMode; the call
        // swaps the calling thread's mode with it.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result();
        check(r, "cuThreadExchangeStreamCaptureMode")?;
        Ok(Relaxed { previous: mode })
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in `enter`; this restores the mode swapped out there.
        // Best effort: a drop cannot report, and the call it follows took
        // effect already.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

impl CudaBackend {
    /// Relaxed capture mode on this thread for the call that follows, while
    /// a capture is under way on the device (`None` otherwise).
    pub(crate) fn relaxed_if_capturing(&self) -> Result<Option<Relaxed>, CudaError> {
        if self.capturing {
            Relaxed::enter().map(Some)
        } else {
            Ok(None)
        }
    }
}
