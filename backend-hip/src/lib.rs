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
//! The runtime is loaded when the backend is first opened, not linked:
//! `libamdhip64.so.7` (then `.so.6`, `.so.5`, `.so`; a copy already in the
//! process first, such as the one a ROCm build of torch carries;
//! `CACHEALLOC_HIP_LIBRARY=/path` names one), each entry point resolved at
//! the symbol version the real library gives it. Building needs no ROCm;
//! a machine without the runtime gets [`HipError::NoRuntime`], one whose
//! runtime lacks an entry point the backend needs gets
//! [`HipError::MissingSymbol`] naming it. The feature `rocm` only adds a
//! check, made when the crate compiles, of this crate's declarations of
//! HIP's types and constants against `hip-sys`'s bindings (which need the
//! HIP headers and link `libamdhip64`).

mod backend;
mod capture;
mod conv;
mod graph;
pub mod hip;
mod ipc;
mod vmm;
mod vmm_ipc;

pub use backend::{check_runtime, device_count, open_runtime, HipBackend, HipEvent, HipStream};
pub use conv::HipError;
