//! Stream capture (HIP graphs): while the allocator says a capture is under
//! way on the device, the calls it still makes (a segment's `hipMalloc`,
//! the virtual-memory calls that map pages, `hipMemGetInfo`) run with the
//! calling thread in relaxed capture mode: the HIP runtime refuses
//! `hipMalloc` with `hipErrorStreamCaptureUnsupported` and invalidates the
//! capture in the default (global) mode, as CUDA does (see
//! docs/capture-notes.md). PyTorch's `cudaMallocMaybeCapturing`, hipified.

use crate::backend::HipBackend;
use crate::conv::{check, HipError};
use crate::hip;

/// The calling thread in relaxed capture mode until dropped; then the mode
/// it had before (`hipThreadExchangeStreamCaptureMode`, push-pop).
pub(crate) struct Relaxed {
    previous: hip::hipStreamCaptureMode,
}

impl Relaxed {
    fn enter() -> Result<Relaxed, HipError> {
        let mut mode = hip::hipStreamCaptureMode::hipStreamCaptureModeRelaxed;
        // SAFETY: `mode` is a valid, writable hipStreamCaptureMode; the call
        // swaps the calling thread's mode with it.
        let e = unsafe { hip::hipThreadExchangeStreamCaptureMode(&mut mode) };
        check(e, "hipThreadExchangeStreamCaptureMode")?;
        Ok(Relaxed { previous: mode })
    }
}

impl Drop for Relaxed {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as in `enter`; this restores the mode swapped out there.
        // Best effort: a drop cannot report, and the call it follows took
        // effect already.
        let _ = unsafe { hip::hipThreadExchangeStreamCaptureMode(&mut mode) };
    }
}

impl HipBackend {
    /// Relaxed capture mode on this thread for the call that follows, while
    /// a capture is under way on the device (`None` otherwise).
    pub(crate) fn relaxed_if_capturing(&self) -> Result<Option<Relaxed>, HipError> {
        if self.capturing {
            Relaxed::enter().map(Some)
        } else {
            Ok(None)
        }
    }
}
