//! The driver's two graph queries for `graph_capture_record_stream_reuse:True`
//! (`cuStreamGetCaptureInfo_v2`, `cuGraphNodeGetDependencies`), for the
//! bookkeeping `cachealloc-capture-graph` shares with the HIP backend and
//! the simulated device. Neither call is potentially unsafe during a
//! capture.
use crate::conv::{check, driver_error};
use crate::{CudaBackend, CudaError, CudaStream};
use cachealloc_capture_graph::{Capture, GraphDriver, Node};
use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, cudaError_enum, CUstreamCaptureStatus};

/// The capture `stream` is part of (`None`: it is not capturing); an
/// invalidated capture is an error. The caller has the context bound.
fn capture_info(stream: CudaStream) -> Result<Option<Capture>, CudaError> {
    const CALL: &str = "cuStreamGetCaptureInfo_v2";
    // Read as a plain number: a status this crate does not know must not be
    // taken for a Rust enum value.
    let mut status: u32 = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32;
    let mut id: sys::cuuint64_t = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer is valid and writable for the call;
    // CUstreamCaptureStatus is a `repr(u32)` enum, so the driver writes a
    // u32 through the cast pointer. The stream is the caller's, alive.
    let r = unsafe {
        sys::cuStreamGetCaptureInfo_v2(
            stream.as_raw(),
            (&mut status as *mut u32).cast::<CUstreamCaptureStatus>(),
            &mut id,
            &mut graph,
            &mut deps,
            &mut n,
        )
    }
    .result();
    check(r, CALL)?;
    if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE as u32 {
        return Ok(None);
    }
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 {
        // Invalidated (or a status this crate does not know).
        let e = DriverError(cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        return Err(driver_error(e, CALL));
    }
    let terminals = if n == 0 || deps.is_null() {
        Vec::new()
    } else {
        // SAFETY: the driver's array of `n` node handles, valid until the
        // next call on the stream; it is copied before any other call.
        unsafe { std::slice::from_raw_parts(deps, n) }
            .iter()
            .map(|&d| d as Node)
            .collect()
    };
    Ok(Some(Capture { id, terminals }))
}

/// The nodes `node` depends on.
fn dependencies(node: Node) -> Result<Vec<Node>, CudaError> {
    const CALL: &str = "cuGraphNodeGetDependencies";
    let mut n: usize = 0;
    // SAFETY: a node of a capture under way (its graph lives); a null
    // array asks for the number only, into the valid `n`.
    let r = unsafe {
        sys::cuGraphNodeGetDependencies(node as sys::CUgraphNode, std::ptr::null_mut(), &mut n)
    }
    .result();
    check(r, CALL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut deps: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `deps` has room for `n` handles, the number passed in `n`;
    // the driver writes at most that many and says how many in `n`.
    let r = unsafe {
        sys::cuGraphNodeGetDependencies(node as sys::CUgraphNode, deps.as_mut_ptr(), &mut n)
    }
    .result();
    check(r, CALL)?;
    deps.truncate(n);
    Ok(deps.into_iter().map(|d| d as Node).collect())
}

/// The driver's graph queries (the caller has the context bound).
struct Driver;

impl GraphDriver for Driver {
    type Stream = CudaStream;
    type Error = CudaError;
    fn capture(&mut self, stream: CudaStream) -> Result<Option<Capture>, CudaError> {
        capture_info(stream)
    }
    fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, CudaError> {
        dependencies(node)
    }
}

impl CudaBackend {
    /// [`DeviceBackend::capture_free_marker`](cachealloc_core::DeviceBackend::capture_free_marker).
    pub(crate) fn graph_free_marker(
        &mut self,
        streams: &mut dyn Iterator<Item = CudaStream>,
    ) -> Result<Option<u32>, CudaError> {
        let _bound = self.bind()?;
        self.graph.free_marker(&mut Driver, streams)
    }

    /// [`DeviceBackend::capture_walk`](cachealloc_core::DeviceBackend::capture_walk).
    pub(crate) fn graph_walk(&mut self, stream: CudaStream) -> Result<bool, CudaError> {
        let _bound = self.bind()?;
        self.graph.walk(&mut Driver, stream)
    }
}
