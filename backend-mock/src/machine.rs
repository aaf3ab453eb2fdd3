//! A simulated machine that several mock devices (and so several
//! allocators, standing for processes) share: IPC handles exported by one
//! device open on another. One address space for the whole machine: an
//! opened handle maps at the exporter's address (give the devices disjoint
//! bases with [`MockDevice::with_base`](crate::MockDevice::with_base)).
//!
//! Like the drivers, it refuses an open by the device that exported the
//! handle (a process cannot open its own handle), a second open by one
//! device without a close in between ("already mapped"), a stale handle
//! (the exporter freed the segment) and anything that is not its handle.

use cachealloc_core::{DevicePtr, IpcMemHandle};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::MockError;

/// The marker at the start of every mock handle.
const MAGIC: &[u8; 16] = b"cachealloc-mock\0";

/// One exported segment.
#[derive(Debug)]
struct Export {
    /// The exporting member.
    member: u32,
    base: u64,
    /// Whether the exporter still holds the segment.
    live: bool,
}

/// One open of an export by a member, not yet closed.
#[derive(Debug)]
struct Open {
    member: u32,
    export: usize,
}

#[derive(Debug, Default)]
struct State {
    exports: Vec<Export>,
    opens: Vec<Open>,
    members: u32,
}

/// A machine the devices that join it share (clone it to join).
#[derive(Clone, Debug, Default)]
pub struct MockMachine(Arc<Mutex<State>>);

impl MockMachine {
    /// A machine with nothing exported.
    pub fn new() -> Self {
        MockMachine::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data: keep using it.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new member (a device that joins): its number.
    pub(crate) fn join(&self) -> u32 {
        let mut st = self.state();
        st.members += 1;
        st.members
    }

    /// The handle of segment `base` of `member` (the same one each time).
    pub(crate) fn export(&self, member: u32, base: u64) -> IpcMemHandle {
        let mut st = self.state();
        let k = match st
            .exports
            .iter()
            .position(|e| e.live && e.member == member && e.base == base)
        {
            Some(k) => k,
            None => {
                st.exports.push(Export {
                    member,
                    base,
                    live: true,
                });
                st.exports.len() - 1
            }
        };
        let mut h = [0u8; 64];
        h[..16].copy_from_slice(MAGIC);
        h[16..24].copy_from_slice(&(k as u64).to_le_bytes());
        h[24..32].copy_from_slice(&base.to_le_bytes());
        h[32..36].copy_from_slice(&member.to_le_bytes());
        IpcMemHandle(h)
    }

    /// Open a handle for `member`: the exporter's address of the segment.
    pub(crate) fn open(&self, member: u32, h: &IpcMemHandle) -> Result<DevicePtr, MockError> {
        let bad = |what| Err(MockError::InvalidIpcHandle { what });
        if &h.0[..16] != MAGIC {
            return bad("not a handle of a mock device");
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&h.0[16..24]);
        let k = u64::from_le_bytes(word) as usize;
        word.copy_from_slice(&h.0[24..32]);
        let base = u64::from_le_bytes(word);
        let mut st = self.state();
        match st.exports.get(k) {
            Some(e) if e.base == base && e.member == member => {
                bad("the exporting device cannot open its own handle")
            }
            Some(e) if e.base == base && !e.live => {
                bad("the exporter freed the segment (stale handle)")
            }
            Some(e) if e.base == base => {
                if st.opens.iter().any(|o| o.member == member && o.export == k) {
                    return bad("already mapped here (open it once, close it once)");
                }
                st.opens.push(Open { member, export: k });
                Ok(DevicePtr(base))
            }
            _ => bad("no such export on this machine"),
        }
    }

    /// Close `member`'s open of the segment mapped at `base`.
    pub(crate) fn close(&self, member: u32, base: DevicePtr) -> Result<(), MockError> {
        let mut st = self.state();
        let State { exports, opens, .. } = &mut *st;
        match opens
            .iter()
            .position(|o| o.member == member && exports[o.export].base == base.0)
        {
            Some(i) => {
                opens.swap_remove(i);
                Ok(())
            }
            None => Err(MockError::InvalidIpcHandle {
                what: "close of memory that is not open",
            }),
        }
    }

    /// The exporter freed its segment at `base`: its handle goes stale.
    pub(crate) fn freed(&self, member: u32, base: u64) {
        for e in self.state().exports.iter_mut() {
            if e.member == member && e.base == base {
                e.live = false;
            }
        }
    }

    /// Opens not yet closed, over the whole machine (for leak checks).
    pub fn open_handles(&self) -> u32 {
        self.state().opens.len() as u32
    }
}
