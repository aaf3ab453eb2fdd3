//! `cachealloc_snapshot`: PyTorch's memory snapshot (the dict
//! `torch.cuda.memory._snapshot()` returns, which pytorch.org/memory_viz
//! reads) of one device or of all, written by the snapshot crate's writer
//! (`cachealloc_snapshot::write_snapshot`: a pickle, or JSON for a path ending
//! in `.json`) and its dict builder (`cachealloc_snapshot::add_device`). What
//! differs from a replay's snapshot (`Replay::snapshot_dict`) is only where
//! names come from: annotations carry the names given to
//! `cachealloc_record_annotation`, and there is no trace file for frames to
//! point at, so frames are empty.

use crate::backend::on_device;
use crate::error::status;
use crate::registry;
use crate::settings::settings;
use cachealloc_core::SharedAllocator;
use cachealloc_core::{AllocatorSettings, Snapshot};
use cachealloc_snapshot::{settings_dict, write_snapshot, Frame, SnapshotDict, SnapshotNames};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::sync::{LazyLock, Mutex};

/// Annotation names by id (ids start at 1; a name keeps its id).
#[derive(Default)]
pub(crate) struct Names {
    names: Vec<String>,
    ids: HashMap<String, u64>,
}

impl Names {
    /// The id of `name`, given one if new.
    pub(crate) fn id(&mut self, name: &str) -> u64 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        self.names.push(name.to_string());
        let id = self.names.len() as u64;
        self.ids.insert(name.to_string(), id);
        id
    }

    /// Every name, by id - 1.
    pub(crate) fn all(&self) -> Vec<String> {
        self.names.clone()
    }
}

/// The name of annotation `id` in `names` (a copy of [`Names`]).
pub(crate) fn name(names: &[String], id: u64) -> String {
    id.checked_sub(1)
        .and_then(|i| names.get(i as usize))
        .cloned()
        .unwrap_or_else(|| format!("annotation {id}"))
}

/// The process's annotation names.
static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(Mutex::default);

/// The annotation names, locked.
pub(crate) fn names() -> std::sync::MutexGuard<'static, Names> {
    NAMES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The names of a snapshot taken through the C ABI: annotations by the
/// names given to `cachealloc_record_annotation`, and no frames (there is
/// no trace file to point at).
struct AnnotationNames<'a>(&'a [String]);

impl SnapshotNames for AnnotationNames<'_> {
    fn frames(&self, _action: &str, _context: u64) -> Vec<Frame> {
        Vec::new()
    }

    fn annotation(&self, id: u64) -> String {
        name(self.0, id)
    }
}

/// Add one device's segments, history and annotations to `dict` (the
/// first device added gives the settings).
pub(crate) fn add_device<St: Into<u64> + From<u64> + Copy>(
    dict: &mut SnapshotDict,
    snap: Snapshot<'_, St>,
    names: &[String],
) {
    if dict.segments.is_empty() && dict.device_traces.is_empty() {
        let conf = settings().map(|s| s.conf_text.as_str()).unwrap_or("");
        dict.allocator_settings = settings_dict(snap.settings, conf);
    }
    cachealloc_snapshot::add_device(dict, snap, &AnnotationNames(names));
}

/// Write a memory snapshot (PyTorch's format) of `device`, or of every
/// device created so far when `device` is -1, to `path`: JSON when `path`
/// ends in `.json`, else a pickle (protocol 3) for pytorch.org/memory_viz
/// or `torch.cuda.memory._snapshot()` readers. The history is in it when
/// `cachealloc_record_history` turned it on. Returns 0, or -1.
///
/// # Safety
///
/// `path` is NULL (an error) or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachealloc_snapshot(device: c_int, path: *const c_char) -> c_int {
    status("cachealloc_snapshot", || {
        if path.is_null() {
            return Err("cachealloc_snapshot: path is NULL".to_string());
        }
        // SAFETY: the caller passes a NUL-terminated string (see # Safety).
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| "cachealloc_snapshot: the path is not UTF-8".to_string())?;
        let devices = registry::selected(device)?;
        let mut dict = SnapshotDict::new(
            AllocatorSettings::DEFAULT,
            settings().map(|s| s.conf_text.as_str()).unwrap_or(""),
        );
        // A copy: no device is locked while the names are.
        let names = names().all();
        for (i, d) in devices {
            on_device!(d, |a| a
                .snapshot(&mut |snap| add_device(&mut dict, snap, &names))
                .map_err(|e| format!("device {i}: {e}")))?;
        }
        write_snapshot(path, &dict)
    })
}
