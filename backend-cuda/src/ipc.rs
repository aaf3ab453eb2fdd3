//! Sharing memory with other processes, peer access and device-to-device
//! copies on the driver API: `cuIpcGetMemHandle`, `cuIpcOpenMemHandle_v2`
//! (with lazy peer access, as PyTorch opens them), `cuIpcCloseMemHandle`,
//! `cuCtxEnablePeerAccess`, `cuMemcpyAsync` and `cuMemcpyPeerAsync`.
//!
//! The driver speaks of other devices by their contexts: the backend
//! retains a peer device's primary context the first time it needs it
//! (enabling access to it, or a peer copy) and releases it when dropped,
//! so access enabled here lasts as long as the backend.

use crate::conv::{check, driver_error};
use crate::{CudaBackend, CudaError, CudaStream};
use cachealloc_core::{DevicePtr, IpcMemHandle, PeerAccess, VmError};
use cudarc::driver::result;
use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, cudaError_enum};

type Vm<T> = Result<T, VmError<CudaError>>;

/// A driver result as an optional call's result, naming the call.
fn opt(r: sys::CUresult, call: &'static str) -> Vm<()> {
    r.result()
        .map_err(|e: DriverError| VmError::Other(driver_error(e, call)))
}

/// A retained primary context of another device.
#[derive(Debug)]
pub(crate) struct PeerContext {
    ordinal: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl CudaBackend {
    /// The primary context of device `ordinal`: this device's own, or a
    /// peer's, retained at its first use.
    fn context_of(&mut self, ordinal: u32) -> Result<sys::CUcontext, CudaError> {
        if ordinal == self.ordinal {
            return Ok(self.ctx);
        }
        if let Some(p) = self.peers.iter().find(|p| p.ordinal == ordinal) {
            return Ok(p.ctx);
        }
        let device = check(result::device::get(ordinal as i32), "cuDeviceGet")?;
        // SAFETY: `device` is a valid device handle from cuDeviceGet; the
        // reference is released in `release_peers` (Drop).
        let ctx = check(
            unsafe { result::primary_ctx::retain(device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        self.peers.push(PeerContext {
            ordinal,
            device,
            ctx,
        });
        Ok(ctx)
    }

    /// Release the peers' primary contexts (Drop).
    pub(crate) fn release_peers(&mut self) {
        for p in self.peers.drain(..) {
            // SAFETY: releases the reference `context_of` took on this
            // device's primary context, once.
            let r = unsafe { result::primary_ctx::release(p.device) };
            let _ = check(r, "cuDevicePrimaryCtxRelease_v2"); // nothing to report it to
        }
    }

    pub(crate) fn ipc_handle(&mut self, base: DevicePtr) -> Vm<IpcMemHandle> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the handle is plain bytes, all zeroes a valid value.
        let mut h: sys::CUipcMemHandle = unsafe { core::mem::zeroed() };
        // SAFETY: `h` is a valid out-pointer; `base` is the start of an
        // allocation of this context (the driver checks it).
        let r = unsafe { sys::cuIpcGetMemHandle(&mut h, base.0) };
        opt(r, "cuIpcGetMemHandle")?;
        let mut out = [0u8; 64];
        for (o, c) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *c as u8;
        }
        Ok(IpcMemHandle(out))
    }

    pub(crate) fn ipc_open(&mut self, handle: &IpcMemHandle) -> Vm<DevicePtr> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: the handle is plain bytes, all zeroes a valid value.
        let mut h: sys::CUipcMemHandle = unsafe { core::mem::zeroed() };
        for (c, b) in h.reserved.iter_mut().zip(handle.0.iter()) {
            *c = *b as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `ptr` is a valid out-pointer; the handle is passed by
        // value and the driver validates it.
        let r = unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy) };
        opt(r, "cuIpcOpenMemHandle_v2")?;
        Ok(DevicePtr(ptr))
    }

    pub(crate) fn ipc_close(&mut self, base: DevicePtr) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: `base` is what `ipc_open` returned, closed once (the
        // allocator's table); a wrong address is the driver's error.
        let r = unsafe { sys::cuIpcCloseMemHandle(base.0) };
        opt(r, "cuIpcCloseMemHandle")
    }

    pub(crate) fn peer_access(&mut self, peer: u32) -> Vm<PeerAccess> {
        let peer_ctx = self.context_of(peer).map_err(VmError::Other)?;
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: `peer_ctx` is a retained primary context (held until
        // Drop); flags must be 0.
        match unsafe { sys::cuCtxEnablePeerAccess(peer_ctx, 0) }.result() {
            Ok(()) => Ok(PeerAccess::Enabled),
            Err(e) if e.0 == cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                Ok(PeerAccess::AlreadyEnabled)
            }
            Err(e) => Err(VmError::Other(driver_error(e, "cuCtxEnablePeerAccess"))),
        }
    }

    pub(crate) fn copy(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: CudaStream,
    ) -> Vm<()> {
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: device addresses (unified addressing); the driver checks
        // the ranges; the stream is this context's, kept alive by the caller.
        let r = unsafe { sys::cuMemcpyAsync(dst.0, src.0, bytes as usize, stream.as_raw()) };
        opt(r, "cuMemcpyAsync")
    }

    pub(crate) fn copy_peer(
        &mut self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: u64,
        stream: CudaStream,
    ) -> Vm<()> {
        let dst_ctx = self.context_of(dst_device).map_err(VmError::Other)?;
        let src_ctx = self.context_of(src_device).map_err(VmError::Other)?;
        let _bound = self.bind().map_err(VmError::Other)?;
        // SAFETY: both contexts are retained primary contexts; the driver
        // checks the ranges; the stream is kept alive by the caller.
        opt(
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst.0,
                    dst_ctx,
                    src.0,
                    src_ctx,
                    bytes as usize,
                    stream.as_raw(),
                )
            },
            "cuMemcpyPeerAsync",
        )
    }
}
