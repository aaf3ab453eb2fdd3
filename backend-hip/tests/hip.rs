//! The HIP backend, the runtime loaded at run time, three ways:
//!
//! - as this machine is: without an AMD GPU the runtime reports no device,
//!   and the backend turns that into an error value;
//! - on the project's stub runtime (`libamdhip64.so.5` from
//!   `cachealloc-tests`), in a child process that has the stub first on
//!   `LD_LIBRARY_PATH` (the `stub_*` tests, ignored in this process and
//!   run by `ffi_checks_run_on_the_stub_in_a_child_process`): the
//!   conformance suite with every scenario and no leaks, no device,
//!   another thread, the caller's device restored, a failure at every
//!   runtime call, the capture rules and a graph capture as
//!   torch.cuda.graph makes it, the free markers and walks of a capture's
//!   graph, the symbol inventory;
//! - on a real GPU (`real_device_conformance`, ignored unless asked for
//!   with `-- --ignored real_device`): the conformance suite, leaving out
//!   the scenarios that need a simulated capacity or event timing.
use cachealloc_core::{DeviceBackend, DevicePtr};
use cachealloc_hip::hip;
use cachealloc_hip::{device_count, HipBackend, HipError, HipStream};
use cachealloc_tests::gpu::{GpuApi, GpuHarness, StreamOf};
use cachealloc_tests::stub::{in_child, StubKind};
use cachealloc_tests::stub_suite::{self, child_stub};
use cachealloc_tests::{backend_suite, testdata_dir};

/// The HIP backend, for the shared GPU tests.
struct Hip;

impl GpuApi for Hip {
    type B = HipBackend;
    const NAME: &'static str = "hip";
    const STUB: StubKind = StubKind::Hip;
    fn open(ordinal: u32) -> Result<HipBackend, String> {
        HipBackend::new(ordinal).map_err(|e| e.to_string())
    }
    fn default_stream() -> HipStream {
        HipStream::DEFAULT
    }
    fn create_stream(b: &HipBackend) -> Result<HipStream, String> {
        b.create_stream().map_err(|e| e.to_string())
    }
    fn destroy_stream(b: &HipBackend, s: HipStream) -> Result<(), String> {
        b.destroy_stream(s).map_err(|e| e.to_string())
    }
    fn synchronize(b: &HipBackend, s: Option<StreamOf<Self>>) -> Result<(), String> {
        match s {
            Some(s) => b.synchronize(s),
            None => b.synchronize_all(),
        }
        .map_err(|e| e.to_string())
    }
    fn make_current(b: &HipBackend) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())
    }
    fn memset(b: &HipBackend, ptr: DevicePtr, n: u64, s: HipStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        // SAFETY: `ptr` is a live allocation of at least `n` bytes of this
        // device (the harness's scratch buffer); the stream is this device's.
        let e = unsafe {
            hip::hipMemsetAsync(ptr.0 as *mut std::ffi::c_void, 1, n as usize, s.as_raw())
        };
        ok(e, "hipMemsetAsync")
    }
    fn begin_capture(b: &HipBackend, s: HipStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        let mode = hip::hipStreamCaptureMode::hipStreamCaptureModeGlobal;
        // SAFETY: a live stream of this device that is not capturing.
        ok(
            unsafe { hip::hipStreamBeginCapture(s.as_raw(), mode) },
            "hipStreamBeginCapture",
        )
    }
    fn end_capture(b: &HipBackend, s: HipStream) -> Result<(), String> {
        b.make_current().map_err(|e| e.to_string())?;
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: the stream began a capture on this thread; `graph` and
        // `exec` are valid out-pointers, destroyed below, once.
        unsafe {
            ok(
                hip::hipStreamEndCapture(s.as_raw(), &mut graph),
                "hipStreamEndCapture",
            )?;
            let e = hip::hipGraphInstantiate(
                &mut exec,
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
            ok(e, "hipGraphInstantiate")?;
            ok(hip::hipGraphLaunch(exec, s.as_raw()), "hipGraphLaunch")?;
            ok(hip::hipGraphExecDestroy(exec), "hipGraphExecDestroy")?;
            ok(hip::hipGraphDestroy(graph), "hipGraphDestroy")
        }
    }
}

/// A HIP result as the tests report it.
fn ok(e: hip::hipError_t, call: &str) -> Result<(), String> {
    if e == hip::hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(format!("{call}: {e:?}"))
    }
}

#[test]
fn opening_a_device_without_a_gpu_is_no_device() {
    if in_child() {
        return;
    }
    let count = match device_count() {
        Ok(n) => n,
        Err(e @ HipError::NoRuntime { .. }) => {
            println!("no HIP runtime on this machine: {e}");
            assert!(matches!(
                HipBackend::new(0),
                Err(HipError::NoRuntime { .. })
            ));
            return;
        }
        Err(e) => panic!("hipGetDeviceCount: {e}"),
    };
    match HipBackend::new(0) {
        Err(HipError::NoDevice {
            ordinal: 0,
            count: 0,
        }) => {
            assert_eq!(count, 0);
            println!("no HIP device on this machine: HipBackend::new(0) = NoDevice, as expected");
        }
        Ok(_) => println!("HIP device 0 opened ({count} devices)"),
        Err(e) => panic!("unexpected: {e}"),
    }
    assert!(matches!(
        HipBackend::new(9999),
        Err(HipError::NoDevice { ordinal: 9999, .. })
    ));
}

#[test]
#[ignore = "needs an AMD GPU (run on a GPU machine with `-- --ignored real_device`)"]
fn real_device_conformance() {
    backend_suite::run_and_report(&GpuHarness::<Hip>::new(None), &testdata_dir());
}

// The shared stub tests (conformance suite, another thread, the caller's
// device restored, a failure at every call, out of memory, symbols).
cachealloc_tests::stub_tests!(
    Hip,
    malloc: "hipMalloc",
    oom: 2,       // hipErrorOutOfMemory
    unknown: 999, // hipErrorUnknown
    prefix: "hip",
    extra: ["hipGetErrorName", "hipMemsetAsync"]
);

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_a_runtime_without_devices_is_no_device() {
    let Some(s) = child_stub(StubKind::Hip, "stub_a_runtime_without_devices_is_no_device") else {
        return;
    };
    s.reset(0, u64::MAX); // hipGetDeviceCount says hipErrorNoDevice
    assert_eq!(
        HipBackend::new(0).unwrap_err(),
        HipError::NoDevice {
            ordinal: 0,
            count: 0
        }
    );
    s.reset(2, u64::MAX);
    assert_eq!(
        HipBackend::new(2).unwrap_err(),
        HipError::NoDevice {
            ordinal: 2,
            count: 2
        }
    );
    stub_suite::assert_clean(&s, "no device");
}

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_capture_graph_markers() {
    if let Some(s) = child_stub(StubKind::Hip, "stub_capture_graph_markers") {
        cachealloc_tests::stub_capture::capture_graph_markers::<Hip>(&s);
        cachealloc_tests::stub_capture::graph_reuse_like_torch::<Hip>(&s);
    }
}

#[test]
#[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
fn stub_errors_name_the_call_and_the_code() {
    let Some(s) = child_stub(StubKind::Hip, "stub_errors_name_the_call_and_the_code") else {
        return;
    };
    let mut b = HipBackend::new(0).unwrap();
    s.set_capacity(8 << 20);
    assert!(b.malloc(16 << 20).unwrap_err().is_out_of_memory());
    let st = b.create_stream().unwrap();
    b.destroy_stream(st).unwrap();
    let e = b.destroy_stream(st).unwrap_err();
    assert!(
        matches!(
            &e,
            HipError::Runtime {
                call: "hipStreamDestroy",
                ..
            }
        ) && e.to_string().contains("hipErrorInvalidHandle"),
        "a destroyed stream is a tombstone: {e}"
    );
    assert_eq!(s.counters().bad_handles, 1);
    s.reset(2, u64::MAX);
}

/// A `libamdhip64` that lacks an entry point the backend needs is refused,
/// naming it (and its symbol version), and one without the optional
/// entry points loads; a name that loads nothing is `NoRuntime`.
#[test]
fn a_runtime_that_lacks_a_needed_symbol_is_refused_naming_it() {
    if in_child() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("cachealloc-hip-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let build = |name: &str, source: &str| -> String {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, source).unwrap();
        let so = dir.join(format!("{name}.so"));
        let status =
            std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-shared", "-fPIC", "-o"])
                .arg(&so)
                .arg(&c)
                .status()
                .expect("run the C compiler");
        assert!(status.success(), "cc {}", c.display());
        so.to_string_lossy().into_owned()
    };
    // Every required entry point but hipEventQuery.
    let required = [
        "hipGetDeviceCount",
        "hipGetDevice",
        "hipSetDevice",
        "hipDeviceSynchronize",
        "hipDeviceTotalMem",
        "hipGetErrorName",
        "hipGetLastError",
        "hipMalloc",
        "hipFree",
        "hipMemGetInfo",
        "hipStreamCreateWithFlags",
        "hipStreamDestroy",
        "hipStreamSynchronize",
        "hipStreamWaitEvent",
        "hipEventCreateWithFlags",
        "hipEventDestroy",
        "hipEventRecord",
        "hipEventSynchronize",
        "hipMemcpyAsync",
    ];
    let defs: String = required
        .iter()
        .map(|f| format!("int {f}(void) {{ return 0; }}\n"))
        .collect();
    let partial = build("partial", &defs);
    match cachealloc_hip::check_runtime(&partial) {
        Err(
            e @ HipError::MissingSymbol {
                symbol: "hipEventQuery",
                version: "hip_4.2",
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("lacks hipEventQuery") && msg.contains(&partial),
                "{msg}"
            );
            println!("refused: {msg}");
        }
        other => panic!("expected hipEventQuery missing: {other:?}"),
    }
    let full = build(
        "full",
        &format!("{defs}int hipEventQuery(void) {{ return 0; }}\n"),
    );
    assert_eq!(
        cachealloc_hip::check_runtime(&full).unwrap(),
        full,
        "the optional entry points may be missing"
    );
    let none = dir
        .join("no-such-libamdhip64.so")
        .to_string_lossy()
        .into_owned();
    match cachealloc_hip::check_runtime(&none) {
        Err(e @ HipError::NoRuntime { .. }) => {
            assert!(e.to_string().contains("no HIP runtime"), "{e}")
        }
        other => panic!("expected NoRuntime: {other:?}"),
    }
    // A versioned runtime whose hipEventQuery has another version only:
    // missing, never taken under its plain name.
    let script = dir.join("versions.map");
    std::fs::write(
        &script,
        format!(
            "hip_4.2 {{ global: {}; local: *; }};\nhip_9.9 {{ global: hipEventQuery; }} hip_4.2;\n",
            required.join("; ")
        ),
    )
    .unwrap();
    let versioned = |name: &str| -> String {
        let c = dir.join(format!("{name}.c"));
        std::fs::write(
            &c,
            format!("{defs}int hipEventQuery(void) {{ return 0; }}\n"),
        )
        .unwrap();
        let so = dir.join(format!("{name}.so"));
        let status =
            std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
                .args(["-shared", "-fPIC", "-o"])
                .arg(&so)
                .arg(format!("-Wl,--version-script={}", script.display()))
                .arg(&c)
                .status()
                .expect("run the C compiler");
        assert!(status.success(), "cc {}", c.display());
        so.to_string_lossy().into_owned()
    };
    let other_version = versioned("other-version");
    match cachealloc_hip::check_runtime(&other_version) {
        Err(HipError::MissingSymbol {
            symbol: "hipEventQuery",
            version: "hip_4.2",
            ..
        }) => {}
        other => panic!("expected hipEventQuery@hip_4.2 missing: {other:?}"),
    }
    // A runtime already loaded into the global scope under a name that is
    // no soname the loader tries is found by its entry point.
    assert_eq!(hip::loaded_runtime(), None, "nothing global yet");
    let c = std::ffi::CString::new(other_version.as_str()).unwrap();
    // SAFETY: a NUL-terminated path of a library with no initialisers.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    assert!(!handle.is_null(), "dlopen {other_version}");
    assert_eq!(
        hip::loaded_runtime().as_deref(),
        Some(other_version.as_str())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
