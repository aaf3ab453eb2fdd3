//! The CUDA backend, three ways:
//!
//! - as this machine is: without a driver, `CudaBackend::new` reports "no
//!   driver" as an error value; with one, it opens device 0 or says why not;
//! - on the project's stub driver (`libcuda.so.1` from `cachealloc-tests`),
//!   in a child process that has the stub first on `LD_LIBRARY_PATH` (the
//!   `stub_*` tests, ignored in this process and run by
//!   `ffi_checks_run_on_the_stub_in_a_child_process`): the conformance
//!   suite with every scenario and no leaks, no device, another thread, the
//!   caller's context restored, a failure at every driver call, the capture
//!   rules and a graph capture as torch.cuda.graph makes it, the free
//!   markers and walks of a capture's graph, the symbol inventory;
//! - on a real GPU (`real_device_conformance`, ignored unless asked for
//!   with `-- --ignored real_device`): the conformance suite, leaving out
//!   the scenarios that need a simulated capacity or event timing.

use cachealloc_core::{DeviceBackend, DevicePtr};
use cachealloc_cuda::{driver_present, CudaBackend, CudaError, CudaStream};
use cachealloc_tests::gpu::{GpuApi, GpuHarness, StreamOf};
use cachealloc_tests::stub::{in_child, StubKind};
use cachealloc_tests::stub_suite::{self, child_stub};
use cachealloc_tests::{backend_suite, testdata_dir};
use cudarc::driver::{result, sys};

/// The CUDA backend, for the shared GPU tests.
struct Cuda;

impl GpuApi for Cuda {
    type B = CudaBackend;
    const NAME: &'static str = "cuda";
    const STUB: StubKind = StubKind::Cuda;
    fn open(ordinal: u32) -> Result<CudaBackend, String> {
        CudaBackend::new(ordinal).map_err(|e| e.to_string())
    }
    fn default_stream() -> CudaStream {
        CudaStream::DEFAULT
    }
    fn create_stream(b: &CudaBackend) -> Result<CudaStream, String> {
        b.create_stream().map_err(|e| e.to_string())
    }
    fn destroy_stream(b: &CudaBackend, s: CudaStream) -> Result<(), String> {
        b.destroy_stream(s).map_err(|e| e.to_string())
    }
    fn synchronize(b: &CudaBackend, s: Option<StreamOf<Self>>) -> Result<(), String> {
        match s {
            Some(s) => b.synchronize(s),
            None => b.synchronize_all(),
        }
        .map_err(|e| e.to_string())
    }
    fn make_current(b: &CudaBackend) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())
    }
    fn memset(b: &CudaBackend, ptr: DevicePtr, n: u64, s: CudaStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        // SAFETY: `ptr` is a live allocation of at least `n` bytes of this
        // device (the harness's scratch buffer); the stream is this context's.
        unsafe { result::memset_d8_async(ptr.0, 1, n as usize, s.as_raw()) }
            .map_err(|e| e.to_string())
    }
    fn begin_capture(b: &CudaBackend, s: CudaStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a live stream of this context that is not capturing.
        unsafe { result::stream::begin_capture(s.as_raw(), mode) }
            .map_err(|e| format!("cuStreamBeginCapture_v2: {e}"))
    }
    fn end_capture(b: &CudaBackend, s: CudaStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        // SAFETY: the stream began a capture on this thread.
        let graph = unsafe { result::stream::end_capture(s.as_raw()) }
            .map_err(|e| format!("cuStreamEndCapture: {e}"))?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` is the live graph just captured; `exec` a valid
        // out-pointer; both are destroyed below, once.
        unsafe {
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
                .result()
                .map_err(|e| format!("cuGraphInstantiateWithFlags: {e}"))?;
            sys::cuGraphLaunch(exec, s.as_raw())
                .result()
                .map_err(|e| format!("cuGraphLaunch: {e}"))?;
            sys::cuGraphExecDestroy(exec)
                .result()
                .map_err(|e| format!("cuGraphExecDestroy: {e}"))?;
            sys::cuGraphDestroy(graph)
                .result()
                .map_err(|e| format!("cuGraphDestroy: {e}"))
        }
    }
}

#[test]
fn opening_a_device_never_panics() {
    if in_child() {
        return;
    }
    match CudaBackend::new(0) {
        Err(CudaError::NoDriver) => {
            assert!(!driver_present());
            println!("no CUDA driver on this machine: CudaBackend::new(0) = NoDriver, as expected");
        }
        Err(CudaError::NoDevice { count, .. }) => println!("CUDA driver present, {count} devices"),
        Err(e) => println!("CUDA driver present but unusable: {e}"),
        Ok(b) => println!("CUDA device {} opened", b.ordinal()),
    }
    assert_eq!(
        CudaError::NoDriver.to_string(),
        "no CUDA driver: libcuda could not be loaded"
    );
}

#[test]
fn a_missing_ordinal_is_an_error() {
    if in_child() {
        return;
    }
    if driver_present() {
        assert!(matches!(
            CudaBackend::new(9999),
            Err(CudaError::NoDevice { ordinal: 9999, .. } | CudaError::Driver { .. })
        ));
    } else {
        assert_eq!(CudaBackend::new(9999).unwrap_err(), CudaError::NoDriver);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU (run on a GPU machine with `-- --ignored real_device`; scripts/gpu-check.sh does)"]
fn real_device_conformance() {
    backend_suite::run_and_report(&GpuHarness::<Cuda>::new(None), &testdata_dir());
}

// The shared stub tests (conformance suite, another thread, the caller's
// context restored, a failure at every call, out of memory, symbols).
cachealloc_tests::stub_tests!(
    Cuda,
    malloc: "cuMemAlloc_v2",
    oom: 2,       // CUDA_ERROR_OUT_OF_MEMORY
    unknown: 999, // CUDA_ERROR_UNKNOWN
    prefix: "cu",
    // Besides what the backend names: cudarc's error formatting, the
    // harness's memset.
    extra: ["cuGetErrorName", "cuGetErrorString", "cuMemsetD8Async"]
);

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_a_driver_without_devices_is_no_device() {
    let Some(s) = child_stub(StubKind::Cuda, "stub_a_driver_without_devices_is_no_device") else {
        return;
    };
    assert!(driver_present());
    s.reset(0, u64::MAX); // cuInit says CUDA_ERROR_NO_DEVICE
    assert_eq!(
        CudaBackend::new(0).unwrap_err(),
        CudaError::NoDevice {
            ordinal: 0,
            count: 0
        }
    );
    s.reset(2, u64::MAX);
    assert_eq!(
        CudaBackend::new(2).unwrap_err(),
        CudaError::NoDevice {
            ordinal: 2,
            count: 2
        }
    );
    stub_suite::assert_clean(&s, "no device");
}

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_capture_graph_markers() {
    if let Some(s) = child_stub(StubKind::Cuda, "stub_capture_graph_markers") {
        cachealloc_tests::stub_capture::capture_graph_markers::<Cuda>(&s);
        cachealloc_tests::stub_capture::graph_reuse_like_torch::<Cuda>(&s);
    }
}

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_errors_name_the_call_and_the_code() {
    let Some(s) = child_stub(StubKind::Cuda, "stub_errors_name_the_call_and_the_code") else {
        return;
    };
    let mut b = CudaBackend::new(0).unwrap();
    s.set_capacity(8 << 20);
    assert!(b.malloc(16 << 20).unwrap_err().is_out_of_memory());
    let st = b.create_stream().unwrap();
    b.destroy_stream(st).unwrap();
    assert_eq!(
        b.destroy_stream(st).unwrap_err(),
        CudaError::Driver {
            call: "cuStreamDestroy_v2",
            code: 400,
            name: "CUDA_ERROR_INVALID_HANDLE".to_string()
        },
        "a destroyed stream is a tombstone"
    );
    assert_eq!(s.counters().bad_handles, 1);
    s.reset(2, u64::MAX);
}
