//! The stub drivers (`stubs/*.c`, built by `build.rs`): a `libcuda.so.1`
//! and a `libamdhip64.so.5` that keep a GPU's state on the host, so the
//! CUDA and HIP backends run through their real FFI on machines without a
//! GPU.
//!
//! A process picks its driver library once, at start (`LD_LIBRARY_PATH`), so
//! a test that wants the stub re-runs its own test binary in a child process
//! with the stub's folder first on the path ([`run_in_child`]); the parent
//! keeps testing the machine's real situation (no driver, no device). Tests
//! meant for the child are `#[ignore]`d (the parent lists them as ignored,
//! not as passed) and get their stub from `stub_suite::child_stub`, which
//! runs the test in a child process of its own when it is asked for in the
//! parent (`-- --ignored stub_...`).
//! [`Stub`] reaches the stub's control functions (capacity, fault
//! injection, leak counters) through the library the process loaded.

use std::path::PathBuf;
use std::process::Command;

/// Which driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StubKind {
    /// `libcuda.so.1`, the CUDA driver.
    Cuda,
    /// `libamdhip64.so.5`, the HIP runtime.
    Hip,
}

impl StubKind {
    /// The folder holding this stub, if it was built (Linux only).
    pub fn dir(self) -> Option<PathBuf> {
        let base = env!("CACHEALLOC_STUB_DIR");
        if base.is_empty() {
            return None;
        }
        Some(PathBuf::from(base).join(match self {
            StubKind::Cuda => "cuda",
            StubKind::Hip => "hip",
        }))
    }

    /// The library's soname.
    pub fn soname(self) -> &'static str {
        match self {
            StubKind::Cuda => "libcuda.so.1",
            StubKind::Hip => "libamdhip64.so.5",
        }
    }
}

/// What the stub still holds, and how it was used (the C side's
/// `stub_counters`, field for field).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StubCounters {
    /// Allocations not freed.
    pub live_allocations: u64,
    /// Their bytes.
    pub live_bytes: u64,
    /// Events not destroyed.
    pub live_events: u64,
    /// Streams not destroyed.
    pub live_streams: u64,
    /// Primary-context references not released.
    pub retained_contexts: u64,
    /// Calls with an unknown, destroyed or freed handle.
    pub bad_handles: u64,
    /// Calls in all.
    pub calls: u64,
    /// Injected failures that fired.
    pub injected: u64,
    /// Address-space reservations not freed.
    pub live_reservations: u64,
    /// Physical allocations not both released and unmapped (their bytes
    /// are in `live_bytes`).
    pub live_physical: u64,
    /// Mappings not unmapped.
    pub live_mappings: u64,
    /// Other processes' IPC handles opened here and not closed.
    pub live_imports: u64,
    /// Stream captures begun and not ended.
    pub live_captures: u64,
    /// Calls refused because a stream was capturing (each invalidated the
    /// captures that refused it).
    pub capture_violations: u64,
    /// Graphs and instantiated graphs not destroyed.
    pub live_graphs: u64,
}

impl StubCounters {
    /// Whether nothing is left alive, no bad handle was used and no call
    /// broke a capture's rules.
    pub fn clean(&self) -> bool {
        self.live_allocations == 0
            && self.live_events == 0
            && self.live_streams == 0
            && self.retained_contexts == 0
            && self.bad_handles == 0
            && self.live_reservations == 0
            && self.live_physical == 0
            && self.live_mappings == 0
            && self.live_imports == 0
            && self.live_captures == 0
            && self.capture_violations == 0
            && self.live_graphs == 0
    }
}

/// The environment variable that marks the child process.
const CHILD: &str = "CACHEALLOC_STUB_CHILD";

/// Whether this process is the child that runs on a stub driver.
pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// How many tests a test binary's output says passed (its `N passed`
/// summary lines added up).
pub fn passed_in(output: &str) -> usize {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("test result: "))
        .filter_map(|l| {
            l.split(" passed;")
                .next()?
                .rsplit(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum()
}

/// Re-run this test binary, only the (ignored) tests whose names contain
/// `filter`, one at a time, with the `kind` stub first on
/// `LD_LIBRARY_PATH`. Returns the child's output; `Err` with it when the
/// child failed (or why it could not run).
pub fn run_in_child(kind: StubKind, filter: &str) -> Result<String, String> {
    let dir = kind
        .dir()
        .ok_or("the stub drivers are built on Linux only")?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    // The tests meant for the child are `#[ignore]`d (in the parent they
    // would do nothing): the child runs them with `--ignored`.
    let out = Command::new(exe)
        .args([filter, "--ignored", "--test-threads=1", "--nocapture"])
        .env("LD_LIBRARY_PATH", path)
        // The stub, not a HIP runtime the user named.
        .env_remove("CACHEALLOC_HIP_LIBRARY")
        .env(CHILD, "1")
        .output()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && text.contains(" passed;") {
        Ok(text)
    } else {
        Err(text)
    }
}

/// Re-run this test binary as another process, only the test named
/// `test` (exactly), with this process's environment (so the same stub
/// driver) and `env` added. Returns its output; `Err` with it when it
/// failed.
pub fn run_another_process(test: &str, env: &[(&str, &str)]) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = Command::new(exe)
        .args([
            test,
            "--exact",
            "--include-ignored",
            "--test-threads=1",
            "--nocapture",
        ])
        .envs(env.iter().copied())
        .output()
        .map_err(|e| format!("cannot start the process: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && text.contains("1 passed;") {
        Ok(text)
    } else {
        Err(text)
    }
}

type ResetFn = unsafe extern "C" fn(i32, u64);
type CapacityFn = unsafe extern "C" fn(u64);
type FailFn = unsafe extern "C" fn(*const std::ffi::c_char, u64, i32);
type ClearFn = unsafe extern "C" fn();
type CountersFn = unsafe extern "C" fn(*mut StubCounters);
type CurrentFn = unsafe extern "C" fn() -> i32;
type PeerCapableFn = unsafe extern "C" fn(i32, i32, i32);
type IpcSourceFn = unsafe extern "C" fn(u64, *mut u64, *mut u64) -> i32;
type IpcFlagFn = unsafe extern "C" fn(u32);
type VmmSourceFn = unsafe extern "C" fn(u64, *mut u64, *mut u64, *mut i32) -> i32;
type ReservedFn = unsafe extern "C" fn() -> u64;

/// The stub's control functions, reached through the library this process
/// loaded under the stub's soname.
pub struct Stub {
    lib: libloading::Library,
}

impl Stub {
    /// Open the loaded stub; `Err` if the library is missing or is not the
    /// stub (a real driver).
    pub fn open(kind: StubKind) -> Result<Stub, String> {
        // SAFETY: the library is the stub (checked below) or a real driver;
        // loading either runs no initialisation code with preconditions.
        let lib = unsafe { libloading::Library::new(kind.soname()) }
            .map_err(|e| format!("{}: {e}", kind.soname()))?;
        let s = Stub { lib };
        s.sym::<ResetFn>("cachealloc_stub_reset")
            .map_err(|e| format!("{} is not the stub: {e}", kind.soname()))?;
        Ok(s)
    }

    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        // SAFETY: every name asked for is a function of the stub whose C
        // signature the type `T` at the call site matches (stub_core.h).
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{name}: {e}"))
    }

    /// Whether the library exports `name`.
    pub fn has_symbol(&self, name: &str) -> bool {
        self.sym::<ClearFn>(name).is_ok()
    }

    /// Forget everything: `devices` devices of `capacity` bytes (only when
    /// nothing is alive).
    pub fn reset(&self, devices: i32, capacity: u64) {
        if let Ok(f) = self.sym::<ResetFn>("cachealloc_stub_reset") {
            // SAFETY: matches `void cachealloc_stub_reset(int, uint64_t)`.
            unsafe { f(devices, capacity) }
        }
    }

    /// Every device's capacity from now.
    pub fn set_capacity(&self, capacity: u64) {
        if let Ok(f) = self.sym::<CapacityFn>("cachealloc_stub_set_capacity") {
            // SAFETY: matches `void cachealloc_stub_set_capacity(uint64_t)`.
            unsafe { f(capacity) }
        }
    }

    /// Make the `nth` call from now of `name` (of any entry point when
    /// `None`) return `code`.
    pub fn fail(&self, name: Option<&str>, nth: u64, code: i32) {
        let name = name.map(|n| std::ffi::CString::new(n).expect("no NUL in a name"));
        if let Ok(f) = self.sym::<FailFn>("cachealloc_stub_fail") {
            let p = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
            // SAFETY: matches `void cachealloc_stub_fail(const char *,
            // uint64_t, int)`; `p` is null or a live NUL-terminated string.
            unsafe { f(p, nth, code) }
        }
    }

    /// Drop the planted failures that did not fire.
    pub fn clear_faults(&self) {
        if let Ok(f) = self.sym::<ClearFn>("cachealloc_stub_clear_faults") {
            // SAFETY: matches `void cachealloc_stub_clear_faults(void)`.
            unsafe { f() }
        }
    }

    /// The counters now.
    pub fn counters(&self) -> StubCounters {
        let mut c = StubCounters::default();
        if let Ok(f) = self.sym::<CountersFn>("cachealloc_stub_counters") {
            // SAFETY: matches `void cachealloc_stub_counters(stub_counters *)`;
            // `StubCounters` is `repr(C)` with the same fields.
            unsafe { f(&mut c) }
        }
        c
    }

    /// Whether device `dev` can access device `peer` (every pair can after
    /// a reset).
    pub fn set_peer_capable(&self, dev: i32, peer: i32, can: bool) {
        if let Ok(f) = self.sym::<PeerCapableFn>("cachealloc_stub_set_peer_capable") {
            // SAFETY: matches `void cachealloc_stub_set_peer_capable(int, int, int)`.
            unsafe { f(dev, peer, i32::from(can)) }
        }
    }

    /// HIP's stub: accept only `flag` in `hipIpcOpenMemHandle` (0 like
    /// ROCm 5's runtime, the default; 1 like ROCm 6's). No-op for CUDA's.
    pub fn set_ipc_open_flag(&self, flag: u32) {
        if let Ok(f) = self.sym::<IpcFlagFn>("cachealloc_stub_set_ipc_open_flag") {
            // SAFETY: matches `void cachealloc_stub_set_ipc_open_flag(unsigned)`.
            unsafe { f(flag) }
        }
    }

    /// HIP's stub: act as the runtime of HIP `version` (`HIP_VERSION`
    /// encoding, 70200000 by default): before ROCm 7.1,
    /// `hipMemImportFromShareableHandle` takes a pointer to the file
    /// descriptor. No-op for CUDA's.
    pub fn set_hip_version(&self, version: i32) {
        type SetVersionFn = unsafe extern "C" fn(i32);
        if let Ok(f) = self.sym::<SetVersionFn>("cachealloc_stub_set_hip_version") {
            // SAFETY: matches `void cachealloc_stub_set_hip_version(int)`.
            unsafe { f(version) }
        }
    }

    /// The exporting process and its address of the memory that an opened
    /// IPC handle maps at `addr` here; `None` when `addr` is not in one.
    pub fn ipc_source(&self, addr: u64) -> Option<(u64, u64)> {
        let f = self.sym::<IpcSourceFn>("cachealloc_stub_ipc_source").ok()?;
        let (mut pid, mut src) = (0u64, 0u64);
        // SAFETY: matches `int cachealloc_stub_ipc_source(uint64_t,
        // uint64_t *, uint64_t *)`; both out-pointers are live locals.
        (unsafe { f(addr, &mut pid, &mut src) } == 0).then_some((pid, src))
    }

    /// The physical allocation mapped at `addr`: the pid of the process
    /// that created it, its number there, and whether this process
    /// imported it; `None` when nothing is mapped at `addr`.
    pub fn vmm_source(&self, addr: u64) -> Option<(u64, u64, bool)> {
        let f = self.sym::<VmmSourceFn>("cachealloc_stub_vmm_source").ok()?;
        let (mut pid, mut index, mut imported) = (0u64, 0u64, 0i32);
        // SAFETY: matches `int cachealloc_stub_vmm_source(uint64_t,
        // uint64_t *, uint64_t *, int *)`; the out-pointers are live locals.
        (unsafe { f(addr, &mut pid, &mut index, &mut imported) } == 0).then_some((
            pid,
            index,
            imported != 0,
        ))
    }

    /// Bytes of address space reserved and not freed (every device).
    pub fn reserved_bytes(&self) -> u64 {
        match self.sym::<ReservedFn>("cachealloc_stub_reserved_bytes") {
            // SAFETY: matches `uint64_t cachealloc_stub_reserved_bytes(void)`.
            Ok(f) => unsafe { f() },
            Err(_) => 0,
        }
    }

    /// The calling thread's current device in the stub (-1: none).
    pub fn current_device(&self) -> i32 {
        match self.sym::<CurrentFn>("cachealloc_stub_current_device") {
            // SAFETY: matches `int cachealloc_stub_current_device(void)`.
            Ok(f) => unsafe { f() },
            Err(_) => -1,
        }
    }
}

/// The driver function names a backend's sources pass to its error mapping
/// (`"cuMemAlloc_v2"`, `"hipMalloc"`, ...): every FFI call names its
/// function that way, so this is the list of what the backend calls.
pub fn called_functions(sources: &std::path::Path, prefix: &str) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(sources).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for part in text.split('"').skip(1).step_by(2) {
            if part.starts_with(prefix)
                && part.len() > prefix.len()
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                names.insert(part.to_string());
            }
        }
    }
    names.into_iter().collect()
}
