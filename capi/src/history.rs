//! The memory history (PyTorch's `_record_memory_history`) and caller
//! annotations: entries recorded at the points PyTorch records them, kept
//! in each device's ring buffer (`CACHEALLOC_HISTORY_CAPACITY` entries at
//! most), and written out by `cachealloc_snapshot`.

use crate::backend::{on_device, text};
use crate::error::status;
use crate::registry;
use crate::snapshot::names;
use cachealloc_core::{SharedAllocator, TraceAction, TraceActions};
use std::ffi::{c_char, c_int, CStr};

/// Start (`enabled` nonzero) or stop recording the memory history of
/// `device`; with -1, of every device created so far and of the devices
/// created from now on. At most `max_entries` are kept (0: as many as the
/// history's storage holds, `CACHEALLOC_HISTORY_CAPACITY`); when full, the
/// oldest entry goes. Stopping empties the history, as in PyTorch: take the
/// snapshot first. Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachealloc_record_history(
    device: c_int,
    enabled: c_int,
    max_entries: usize,
) -> c_int {
    status("cachealloc_record_history", || {
        record(device, enabled != 0, max_entries, false, TraceActions::NONE)
    })
}

/// `cachealloc_record_history` with PyTorch's other two parameters of
/// `recordHistory`: `clear` nonzero empties the history even when it stays
/// on, and the history leaves out the actions whose bits are set in
/// `skip_actions` (bit i: action i of `cachealloc_trace_entry`, e.g.
/// `1 << 7` for `snapshot`; PyTorch's `skip_actions`). Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachealloc_record_history_ex(
    device: c_int,
    enabled: c_int,
    max_entries: usize,
    clear: c_int,
    skip_actions: u32,
) -> c_int {
    status("cachealloc_record_history_ex", || {
        let skip = TraceAction::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| skip_actions & (1 << i) != 0)
            .fold(TraceActions::NONE, |s, (_, a)| s.with(*a));
        record(device, enabled != 0, max_entries, clear != 0, skip)
    })
}

/// The body of both: -1 is every device, and the new ones.
fn record(
    device: c_int,
    enabled: bool,
    max_entries: usize,
    clear: bool,
    skip: TraceActions,
) -> crate::error::Res<()> {
    let max = if max_entries == 0 {
        usize::MAX
    } else {
        max_entries
    };
    if device == -1 {
        registry::for_all_and_new(
            |d| {
                on_device!(d, |a| a
                    .record_history(enabled, max, clear, skip)
                    .map_err(text))
            },
            |new| new.history = enabled.then_some((max, skip)),
        )
    } else {
        on_device!(registry::device(device)?, |a| {
            a.record_history(enabled, max, clear, skip).map_err(text)
        })
    }
}

/// Record an annotation named `name` in the history of `device` (with -1,
/// of every device created so far): a snapshot lists it under
/// `external_annotations`, at its time. Recorded only while the history is.
/// Returns 0, or -1.
///
/// # Safety
///
/// `name` is NULL (an error) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_record_annotation(device: c_int, name: *const c_char) -> c_int {
    status("cachealloc_record_annotation", || {
        if name.is_null() {
            return Err("cachealloc_record_annotation: name is NULL".to_string());
        }
        // SAFETY: the caller passes a NUL-terminated string (see # Safety).
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let devices = registry::selected(device)?;
        let id = names().id(&name);
        let mut first = Ok(());
        for (i, d) in devices {
            if let Err(e) = on_device!(d, |a| a.record_annotation(id).map_err(text)) {
                if first.is_ok() {
                    first = Err(format!("device {i}: {e}"));
                }
            }
        }
        first
    })
}
