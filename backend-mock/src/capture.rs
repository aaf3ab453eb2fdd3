//! Stream capture (CUDA graphs) as the drivers enforce it
//! (docs/capture-notes.md): while a stream captures in global or
//! thread-local mode, a "potentially unsafe" call (a device malloc or free,
//! an event query or synchronization, a stream synchronization, the
//! virtual-memory calls) fails and invalidates the capture, unless the
//! thread makes it in relaxed mode; a capturing stream may not wait for an
//! event recorded outside its capture. The simulated device is one thread:
//! the allocator's [`set_capture_underway`](cachealloc_core::DeviceBackend::set_capture_underway)
//! stands for the relaxed mode a GPU backend switches to around the calls
//! the allocator still makes during a capture (malloc, page maps, memory
//! info); the others it must not make at all, event records included
//! (stricter than the drivers, which take a record on a stream outside the
//! capture: the allocator records none then).

use crate::calls::CallKind;

/// How a capture interacts with potentially unsafe calls
/// (`cudaStreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    /// Any thread's unsafe call invalidates it (the default, and
    /// `torch.cuda.graph`'s).
    Global,
    /// The capturing thread's unsafe calls invalidate it.
    ThreadLocal,
    /// Unsafe calls are allowed.
    Relaxed,
}

/// What the drivers make of a call during a capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Allowed.
    Safe,
    /// Potentially unsafe: allowed in relaxed mode.
    Relaxable,
    /// Potentially unsafe, and never made in relaxed mode by a backend
    /// (the allocator must not make it during a capture).
    Unsafe,
}

fn class(kind: CallKind) -> Class {
    match kind {
        CallKind::Malloc
        | CallKind::Reserve
        | CallKind::Map
        | CallKind::MemInfo
        | CallKind::TotalMemory
        | CallKind::Granularity => Class::Relaxable,
        CallKind::Free
        | CallKind::Unreserve
        | CallKind::Unmap
        | CallKind::EventQuery
        | CallKind::EventSynchronize
        | CallKind::StreamSynchronize => Class::Unsafe,
        // Stricter than the drivers (which take these on streams outside
        // the capture): the allocator creates, records and destroys no
        // event while a capture is under way (PyTorch's deferral), and the
        // simulated device holds it to that.
        CallKind::EventCreate | CallKind::EventRecord | CallKind::EventDestroy => Class::Unsafe,
        CallKind::StreamWaitEvent => Class::Safe,
    }
}

/// One stream's capture.
#[derive(Clone, Copy, Debug)]
struct Capture {
    stream: u64,
    mode: CaptureMode,
    /// The call that invalidated it.
    invalidated_by: Option<CallKind>,
}

/// The captures under way, and whether the allocator said one is (its
/// relaxable calls are then made in relaxed mode).
#[derive(Debug, Default)]
pub(crate) struct Captures {
    active: Vec<Capture>,
    relaxed: bool,
    /// Calls refused because of a capture.
    pub(crate) violations: u64,
}

impl Captures {
    pub(crate) fn begin(&mut self, stream: u64, mode: CaptureMode) -> bool {
        if self.is_capturing(stream) {
            return false;
        }
        self.active.push(Capture {
            stream,
            mode,
            invalidated_by: None,
        });
        true
    }

    /// End the capture of `stream`: `None` if it was not capturing, else
    /// the call that invalidated it, if one did.
    pub(crate) fn end(&mut self, stream: u64) -> Option<Option<CallKind>> {
        let k = self.active.iter().position(|c| c.stream == stream)?;
        Some(self.active.remove(k).invalidated_by)
    }

    pub(crate) fn is_capturing(&self, stream: u64) -> bool {
        self.active.iter().any(|c| c.stream == stream)
    }

    pub(crate) fn set_relaxed(&mut self, relaxed: bool) {
        self.relaxed = relaxed;
    }

    /// Whether `kind` may be made now; if not, every capture it conflicts
    /// with is invalidated.
    pub(crate) fn allows(&mut self, kind: CallKind) -> bool {
        let refused = match class(kind) {
            Class::Safe => false,
            Class::Relaxable => !self.relaxed,
            Class::Unsafe => true,
        };
        self.refuse_if(refused, kind)
    }

    /// Whether `stream` may wait for an event recorded on `on`: not if
    /// `stream` captures and `on` does not (the dependency would cross the
    /// capture's boundary).
    pub(crate) fn allows_wait(&mut self, stream: u64, on: u64) -> bool {
        let refused = self.is_capturing(stream) && !self.is_capturing(on);
        self.refuse_if(refused, CallKind::StreamWaitEvent)
    }

    fn refuse_if(&mut self, refused: bool, kind: CallKind) -> bool {
        let mut hit = false;
        if refused {
            for c in self
                .active
                .iter_mut()
                .filter(|c| c.mode != CaptureMode::Relaxed)
            {
                hit = true;
                c.invalidated_by.get_or_insert(kind);
            }
        }
        if hit {
            self.violations += 1;
        }
        !hit
    }
}
