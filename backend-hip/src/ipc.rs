//! Sharing memory with other processes, peer access and device-to-device
//! copies on the HIP runtime: `hipIpcGetMemHandle`, `hipIpcOpenMemHandle`
//! (with `hipIpcMemLazyEnablePeerAccess`: 0 in ROCm 5, 1 in ROCm 6, both
//! tried),
//! `hipIpcCloseMemHandle`, `hipDeviceEnablePeerAccess`, `hipMemcpyAsync`
//! (device to device) and `hipMemcpyPeerAsync`. Each call runs with this
//! backend's device current, as the others do.

use crate::backend::{HipBackend, HipStream};
use crate::conv::{error, is_success, HipError};
use crate::hip;
use cachealloc_core::{DevicePtr, IpcMemHandle, PeerAccess, VmError};

type Vm<T> = Result<T, VmError<HipError>>;

/// `hipIpcMemLazyEnablePeerAccess` in ROCm 6's `hip_runtime_api.h`.
const ROCM6_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// A runtime result as an optional call's result, naming the call.
fn opt(e: hip::hipError_t, call: &'static str) -> Vm<()> {
    if is_success(e) {
        Ok(())
    } else {
        Err(VmError::Other(error(e, call)))
    }
}

/// A device address as the runtime's pointer type.
fn raw(p: DevicePtr) -> *mut core::ffi::c_void {
    p.0 as usize as *mut core::ffi::c_void
}

impl HipBackend {
    pub(crate) fn ipc_handle(&mut self, base: DevicePtr) -> Vm<IpcMemHandle> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the handle is plain bytes, all zeroes a valid value.
        let mut h: hip::hipIpcMemHandle_t = unsafe { core::mem::zeroed() };
        // SAFETY: `h` is a valid out-pointer; `base` is the start of a
        // hipMalloc allocation of this device (the runtime checks it).
        let r = unsafe { hip::hipIpcGetMemHandle(&mut h, raw(base)) };
        opt(r, "hipIpcGetMemHandle")?;
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *c as u8;
        }
        Ok(IpcMemHandle(out))
    }

    pub(crate) fn ipc_open(&mut self, handle: &IpcMemHandle) -> Vm<DevicePtr> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the handle is plain bytes, all zeroes a valid value.
        let mut h: hip::hipIpcMemHandle_t = unsafe { core::mem::zeroed() };
        for (c, b) in h.reserved.iter_mut().zip(handle.0.iter()) {
            *c = *b as _;
        }
        let mut ptr: *mut core::ffi::c_void = core::ptr::null_mut();
        // The runtime accepts only its own header's
        // `hipIpcMemLazyEnablePeerAccess`: 0 in ROCm 5 (and these
        // bindings), 1 in ROCm 6 (hipamd's `hipIpcOpenMemHandle` returns
        // hipErrorInvalidValue for any other flags). Try the one, then the
        // other.
        let mut r = hip::hipError_t::hipErrorInvalidValue;
        for flags in [
            hip::hipIpcMemLazyEnablePeerAccess,
            ROCM6_LAZY_ENABLE_PEER_ACCESS,
        ] {
            // SAFETY: `ptr` is a valid out-pointer; the handle is passed by
            // value and the runtime validates it.
            r = unsafe { hip::hipIpcOpenMemHandle(&mut ptr, h, flags) };
            if r != hip::hipError_t::hipErrorInvalidValue {
                break;
            }
        }
        opt(r, "hipIpcOpenMemHandle")?;
        Ok(DevicePtr(ptr as usize as u64))
    }

    pub(crate) fn ipc_close(&mut self, base: DevicePtr) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: `base` is what `ipc_open` returned, closed once (the
        // allocator's table); a wrong address is the runtime's error.
        let r = unsafe { hip::hipIpcCloseMemHandle(raw(base)) };
        opt(r, "hipIpcCloseMemHandle")
    }

    pub(crate) fn peer_access(&mut self, peer: u32) -> Vm<PeerAccess> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: plain call on the current device; flags must be 0.
        let e = unsafe { hip::hipDeviceEnablePeerAccess(peer as i32, 0) };
        if e == hip::hipError_t::hipErrorPeerAccessAlreadyEnabled {
            // PyTorch clears the sticky error and goes on.
            // SAFETY: plain call; it only resets this thread's last error.
            let _ = unsafe { hip::hipGetLastError() };
            return Ok(PeerAccess::AlreadyEnabled);
        }
        opt(e, "hipDeviceEnablePeerAccess").map(|()| PeerAccess::Enabled)
    }

    pub(crate) fn copy(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: HipStream,
    ) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: device addresses; the runtime checks the ranges; the
        // stream is this device's, kept alive by the caller.
        opt(
            unsafe {
                hip::hipMemcpyAsync(
                    raw(dst),
                    raw(src),
                    bytes as usize,
                    hip::hipMemcpyKind::hipMemcpyDeviceToDevice,
                    stream.as_raw(),
                )
            },
            "hipMemcpyAsync",
        )
    }

    pub(crate) fn copy_peer(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: HipStream,
    ) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: device addresses of the named devices; the runtime checks
        // them; the stream is kept alive by the caller.
        opt(
            unsafe {
                hip::hipMemcpyPeerAsync(
                    raw(dst),
                    dst_device as i32,
                    raw(src),
                    src_device as i32,
                    bytes as usize,
                    stream.as_raw(),
                )
            },
            "hipMemcpyPeerAsync",
        )
    }
}
