//! A simulated machine that several mock devices (and so several
//! allocators, standing for processes) share: IPC handles exported by one
//! device open on another. One address space for the whole machine: an
//! opened handle maps at the exporter's address (give the devices disjoint
//! bases with [`MockDevice::with_base`](crate::MockDevice::with_base)).

use cachealloc_core::{DevicePtr, IpcMemHandle};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::MockError;

/// The marker at the start of every mock handle.
const MAGIC: &[u8; 16] = b"cachealloc-mock\0";

/// One exported segment.
#[derive(Debug)]
struct Export {
    device: u32,
    base: u64,
    /// Whether the exporter still holds the segment.
    live: bool,
    /// Opens not yet closed, on any device.
    opened: u32,
}

/// A machine the devices that join it share (clone it to join).
#[derive(Clone, Debug, Default)]
pub struct MockMachine(Arc<Mutex<Vec<Export>>>);

impl MockMachine {
    /// A machine with nothing exported.
    pub fn new() -> Self {
        MockMachine::default()
    }

    fn exports(&self) -> MutexGuard<'_, Vec<Export>> {
        // A panic while holding the lock leaves plain data: keep using it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of segment `base` of `device` (the same one each time).
    pub(crate) fn export(&self, device: u32, base: u64) -> IpcMemHandle {
        let mut ex = self.exports();
        let k = match ex
            .iter()
            .position(|e| e.live && e.device == device && e.base == base)
        {
            Some(k) => k,
            None => {
                ex.push(Export {
                    device,
                    base,
                    live: true,
                    opened: 0,
                });
                ex.len() - 1
            }
        };
        let mut h = [0u8; 64];
        h[..16].copy_from_slice(MAGIC);
        h[16..24].copy_from_slice(&(k as u64).to_le_bytes());
        h[24..32].copy_from_slice(&base.to_le_bytes());
        h[32..36].copy_from_slice(&device.to_le_bytes());
        IpcMemHandle(h)
    }

    /// Open a handle: the exporter's address of the segment.
    pub(crate) fn open(&self, h: &IpcMemHandle) -> Result<DevicePtr, MockError> {
        let bad = |what| Err(MockError::InvalidIpcHandle { what });
        if &h.0[..16] != MAGIC {
            return bad("not a handle of a mock device");
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&h.0[16..24]);
        let k = u64::from_le_bytes(word) as usize;
        word.copy_from_slice(&h.0[24..32]);
        let base = u64::from_le_bytes(word);
        let mut ex = self.exports();
        match ex.get_mut(k) {
            Some(e) if e.base == base && e.live => {
                e.opened += 1;
                Ok(DevicePtr(base))
            }
            Some(e) if e.base == base => bad("the exporter freed the segment (stale handle)"),
            _ => bad("no such export on this machine"),
        }
    }

    /// Close one open of the segment at `base`.
    pub(crate) fn close(&self, base: DevicePtr) -> Result<(), MockError> {
        let mut ex = self.exports();
        match ex.iter_mut().find(|e| e.base == base.0 && e.opened > 0) {
            Some(e) => {
                e.opened -= 1;
                Ok(())
            }
            None => Err(MockError::InvalidIpcHandle {
                what: "close of memory that is not open",
            }),
        }
    }

    /// The exporter freed its segment at `base`: its handle goes stale.
    pub(crate) fn freed(&self, device: u32, base: u64) {
        for e in self.exports().iter_mut() {
            if e.device == device && e.base == base {
                e.live = false;
            }
        }
    }

    /// Opens not yet closed, over the whole machine (for leak checks).
    pub fn open_handles(&self) -> u32 {
        self.exports().iter().map(|e| e.opened).sum()
    }
}
