//! The runtime's two graph queries for `graph_capture_record_stream_reuse:True`
//! (`hipStreamGetCaptureInfo_v2`, `hipGraphNodeGetDependencies`: CUDA's,
//! hipified), for the bookkeeping `cachealloc-capture-graph` shares with the
//! CUDA backend and the simulated device. Neither call is potentially
//! unsafe during a capture.
use crate::backend::{HipBackend, HipStream};
use crate::conv::{check, error, HipError};
use crate::hip;
use cachealloc_capture_graph::{Capture, GraphDriver, Node};

/// The capture `stream` is part of (`None`: it is not capturing); an
/// invalidated capture is an error. The caller has the context bound.
fn capture_info(stream: HipStream) -> Result<Option<Capture>, HipError> {
    const CALL: &str = "hipStreamGetCaptureInfo_v2";
    // A plain number: a status this crate does not name is still read.
    let mut status = hip::hipStreamCaptureStatus::hipStreamCaptureStatusNone;
    let mut id: std::ffi::c_ulonglong = 0;
    let mut graph: hip::hipGraph_t = std::ptr::null_mut();
    let mut deps: *const hip::hipGraphNode_t = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer is valid and writable for the call;
    // hipStreamCaptureStatus is a transparent C int. The stream is the
    // caller's, alive.
    let e = unsafe {
        hip::hipStreamGetCaptureInfo_v2(
            stream.as_raw(),
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut n,
        )
    };
    check(e, CALL)?;
    if status == hip::hipStreamCaptureStatus::hipStreamCaptureStatusNone {
        return Ok(None);
    }
    if status != hip::hipStreamCaptureStatus::hipStreamCaptureStatusActive {
        // Invalidated (or a status this crate does not know).
        return Err(error(
            hip::hipError_t::hipErrorStreamCaptureInvalidated,
            CALL,
        ));
    }
    let terminals = if n == 0 || deps.is_null() {
        Vec::new()
    } else {
        // SAFETY: the runtime's array of `n` node handles, valid until the
        // next call on the stream; it is copied before any other call.
        unsafe { std::slice::from_raw_parts(deps, n) }
            .iter()
            .map(|&d| d as Node)
            .collect()
    };
    Ok(Some(Capture { id, terminals }))
}

/// The nodes `node` depends on.
fn dependencies(node: Node) -> Result<Vec<Node>, HipError> {
    const CALL: &str = "hipGraphNodeGetDependencies";
    let mut n: usize = 0;
    // SAFETY: a node of a capture under way (its graph lives); a null
    // array asks for the number only, into the valid `n`.
    let e = unsafe {
        hip::hipGraphNodeGetDependencies(node as hip::hipGraphNode_t, std::ptr::null_mut(), &mut n)
    };
    check(e, CALL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut deps: Vec<hip::hipGraphNode_t> = vec![std::ptr::null_mut(); n];
    // SAFETY: `deps` has room for `n` handles, the number passed in `n`;
    // the runtime writes at most that many and says how many in `n`.
    let e = unsafe {
        hip::hipGraphNodeGetDependencies(node as hip::hipGraphNode_t, deps.as_mut_ptr(), &mut n)
    };
    check(e, CALL)?;
    deps.truncate(n);
    Ok(deps.into_iter().map(|d| d as Node).collect())
}

/// The runtime's graph queries (the caller has the context bound).
struct Driver;

impl GraphDriver for Driver {
    type Stream = HipStream;
    type Error = HipError;
    fn capture(&mut self, stream: HipStream) -> Result<Option<Capture>, HipError> {
        capture_info(stream)
    }
    fn dependencies(&mut self, node: Node) -> Result<Vec<Node>, HipError> {
        dependencies(node)
    }
}

impl HipBackend {
    /// [`DeviceBackend::capture_free_marker`](cachealloc_core::DeviceBackend::capture_free_marker).
    pub(crate) fn graph_free_marker(
        &mut self,
        streams: &mut dyn Iterator<Item = HipStream>,
    ) -> Result<Option<u32>, HipError> {
        let _bound = self.bind()?;
        self.graph.free_marker(&mut Driver, streams)
    }

    /// [`DeviceBackend::capture_walk`](cachealloc_core::DeviceBackend::capture_walk).
    pub(crate) fn graph_walk(&mut self, stream: HipStream) -> Result<bool, HipError> {
        let _bound = self.bind()?;
        self.graph.walk(&mut Driver, stream)
    }
}
