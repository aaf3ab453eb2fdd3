//! The process-wide devices: one allocator per device index (up to
//! [`MAX_DEVICES`]), created at its first use from the settings, and never
//! dropped (the process keeps its allocators, as PyTorch does). Creation is
//! serialized by one lock; a failed creation (no driver, no such device) is
//! reported and tried again at the next use. Reading a created device takes
//! no lock.

use crate::backend::{on_device, open, text, Device};
use crate::error::Res;
use crate::forward::TRACE_FORWARD;
use crate::settings::settings;
use cachealloc_core::{SegmentRegistry, SharedAllocator};
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The most devices a process can use.
pub(crate) const MAX_DEVICES: usize = 64;

static DEVICES: [OnceLock<Device>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// What creation starts a device with: whether history is recorded, and
/// how many entries it keeps (see `cachealloc_record_history` with -1).
#[derive(Clone, Copy)]
pub(crate) struct NewDevice {
    /// The history's most entries and skipped actions, when it is on.
    pub(crate) history: Option<(usize, cachealloc_core::TraceActions)>,
    /// Whether a C trace tracker is attached (devices then carry the
    /// tracker that calls them).
    pub(crate) trace_forward: bool,
}

/// Held while a device is created (and while the settings for new devices
/// change, so that no device misses them).
static CREATING: Mutex<NewDevice> = Mutex::new(NewDevice {
    history: None,
    trace_forward: false,
});

fn creating() -> MutexGuard<'static, NewDevice> {
    CREATING.lock().unwrap_or_else(|p| p.into_inner())
}

/// The index of device `device`, if it is one.
fn index(device: c_int) -> Res<usize> {
    usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or_else(|| format!("device {device}: expected 0 to {}", MAX_DEVICES - 1))
}

/// The created device `device` (no error to build: the hot path of every
/// call).
#[inline]
fn created_device(device: c_int) -> Option<&'static Device> {
    DEVICES.get(usize::try_from(device).ok()?)?.get()
}

/// Device `device`, created now if this is its first use.
#[inline]
pub(crate) fn device(device: c_int) -> Res<&'static Device> {
    match created_device(device) {
        Some(d) => Ok(d),
        None => create(device),
    }
}

/// Device `device`, created unless another thread just did.
#[cold]
#[inline(never)]
fn create(device: c_int) -> Res<&'static Device> {
    let i = index(device)?;
    let new = creating();
    if let Some(d) = DEVICES[i].get() {
        return Ok(d);
    }
    let d = open(settings()?, i as u32).map_err(|e| format!("device {device}: {e}"))?;
    if let Some((max, skip)) = new.history {
        on_device!(&d, |a| a
            .record_history(true, max, false, skip)
            .map_err(text))?;
    }
    if new.trace_forward {
        attach_trace_forward(&d)?;
    }
    Ok(DEVICES[i].get_or_init(|| d))
}

/// Attach the trace tracker that calls the C trackers to `d`.
pub(crate) fn attach_trace_forward(d: &Device) -> Res<()> {
    on_device!(d, |a| a.attach_trace_tracker(&TRACE_FORWARD).map_err(text))
}

/// Device `device` if it has been created.
#[inline]
pub(crate) fn existing(device: c_int) -> Res<&'static Device> {
    match created_device(device) {
        Some(d) => Ok(d),
        None => Err(not_created(device)),
    }
}

/// Why `existing(device)` has no device.
#[cold]
#[inline(never)]
fn not_created(device: c_int) -> String {
    match index(device) {
        Ok(_) => format!("device {device} has allocated nothing"),
        Err(e) => e,
    }
}

/// The devices created so far, with their indices.
pub(crate) fn created() -> impl Iterator<Item = (c_int, &'static Device)> {
    DEVICES
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.get().map(|d| (i as c_int, d)))
}

/// `device` (created if new), or with -1 every device created so far.
pub(crate) fn selected(device: c_int) -> Res<Vec<(c_int, &'static Device)>> {
    if device == -1 {
        Ok(created().collect())
    } else {
        Ok(vec![(device, self::device(device)?)])
    }
}

/// Run `f` on `device` (created if new), or with -1 on every device
/// created so far; all of them even when one fails, whose error is
/// returned (the first one's).
pub(crate) fn each(device: c_int, f: impl Fn(&Device) -> Res<()>) -> Res<()> {
    on_all(selected(device)?, f)
}

/// Run `f` on each of `devices`, all of them even when one fails; the first
/// one's error, naming its device.
fn on_all(
    devices: impl IntoIterator<Item = (c_int, &'static Device)>,
    f: impl Fn(&Device) -> Res<()>,
) -> Res<()> {
    let mut first = Ok(());
    for (i, d) in devices {
        if let Err(e) = f(d) {
            if first.is_ok() {
                first = Err(format!("device {i}: {e}"));
            }
        }
    }
    first
}

/// The created device whose segments contain `ptr`, from the segment
/// table: no lock is taken and nothing shared is written (a free by pointer
/// on one device never waits behind, or slows, a call on another).
pub(crate) fn owner(ptr: u64) -> Res<&'static Device> {
    crate::segments::map()
        .owner(ptr)
        .and_then(|d| DEVICES.get(d as usize))
        .and_then(|d| d.get())
        .ok_or_else(|| format!("pointer {ptr:#x} was not allocated by cachealloc"))
}

/// Run `f` on every created device and on the settings new devices start
/// with, with creation held off (so no device misses the change); the
/// first device's error, after trying them all.
pub(crate) fn for_all_and_new(
    f: impl Fn(&Device) -> Res<()>,
    new: impl FnOnce(&mut NewDevice),
) -> Res<()> {
    let mut guard = creating();
    new(&mut guard);
    on_all(created(), f)
}

/// [`for_all_and_new`] for a setting that is turned on once and stays on:
/// nothing is done when `on(new devices)` is already true.
pub(crate) fn once_for_all_and_new(
    f: impl Fn(&Device) -> Res<()>,
    on: impl Fn(&mut NewDevice) -> &mut bool,
) -> Res<()> {
    let mut guard = creating();
    if std::mem::replace(on(&mut guard), true) {
        return Ok(());
    }
    on_all(created(), f)
}
