//! # cachealloc-hip
//!
//! A [`DeviceBackend`](cachealloc_core::DeviceBackend) for AMD GPUs on the HIP runtime through `hip-sys`:
//! `hipMalloc` / `hipFree` (not `hipMallocAsync`, which has data-corruption
//! reports on ROCm), events created with `hipEventDisableTiming`,
//! `hipEventQuery` "not ready" as `EventStatus::Pending`, `hipMemGetInfo`,
//! the device made current for each call and the caller's device current
//! again afterwards (as PyTorch's device guards do; restoring is best effort,
//! after a call whose effect cannot be undone). On a machine without an AMD
//! GPU, `HipBackend::new` returns `HipError::NoDevice`. Expandable
//! segments run on HIP's virtual-memory API (`hipMemAddressReserve`,
//! `hipMemCreate`, `hipMemMap`, `hipMemSetAccess`, `hipMemUnmap`,
//! `hipMemRelease`, `hipMemAddressFree`), one allocation per page. IPC
//! handles, peer access and copies: `hipIpcGetMemHandle`,
//! `hipIpcOpenMemHandle`, `hipIpcCloseMemHandle`,
//! `hipDeviceEnablePeerAccess` ("already enabled" is no error),
//! `hipMemcpyAsync`, `hipMemcpyPeerAsync`. While a stream capture (a HIP
//! graph) is under way, `hipMalloc`, the page-mapping calls and
//! `hipMemGetInfo` run in relaxed capture mode
//! (`hipThreadExchangeStreamCaptureMode`), so that they cannot invalidate it.
//! For `graph_capture_record_stream_reuse:True` the backend reads the graph
//! a capture builds (`hipStreamGetCaptureInfo_v2`,
//! `hipGraphNodeGetDependencies`), as PyTorch does to hand out again, within
//! the capture, a block freed after other streams used it.
//!
//! The FFI sits behind the cargo feature `rocm` (off by default), because
//! building it needs the HIP headers and `libamdhip64`: on Debian
//! `apt-get install libamdhip64-dev` and `HIP_PATH=/usr`, then
//! `cargo build -p cachealloc-hip --features rocm`. Without the feature the
//! crate is empty, so a workspace build needs no ROCm.

#[cfg(feature = "rocm")]
mod backend;
#[cfg(feature = "rocm")]
mod capture;
#[cfg(feature = "rocm")]
mod conv;
#[cfg(feature = "rocm")]
mod graph;
#[cfg(feature = "rocm")]
mod ipc;
#[cfg(feature = "rocm")]
mod vmm;
#[cfg(feature = "rocm")]
mod vmm_ipc;

#[cfg(feature = "rocm")]
pub use backend::{device_count, HipBackend, HipEvent, HipStream};
#[cfg(feature = "rocm")]
pub use conv::HipError;
