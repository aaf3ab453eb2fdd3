//! The checks a GPU backend's tests run on a stub driver, in the child
//! process (see [`crate::stub`]), written once for CUDA and HIP: the
//! conformance suite with every scenario and no leaks, a backend moved to
//! another thread, the caller's current device restored, a failure injected
//! at every driver call (with and without expandable segments), and the
//! symbol inventory.

use crate::backend_suite;
use crate::gpu::{GpuApi, GpuHarness, StreamOf};
use crate::harness::Logged;
use crate::stub::{self, Stub, StubCounters, StubKind};
use cachealloc_core::{Allocation, BlockSlot, Config, DeviceAllocator, DeviceBackend};
use std::path::Path;

/// The stub this child process runs on, reset to two unlimited devices.
/// In the parent (a `stub_` test asked for by name there, `-- --ignored`),
/// the test `test` runs in a child process of its own, whose result is this
/// one's, and this returns `None`.
pub fn child_stub(kind: StubKind, test: &str) -> Option<Stub> {
    if !stub::in_child() {
        match stub::run_in_child(kind, test) {
            Ok(out) => println!("{test}: ran in a child process on the stub:\n{out}"),
            Err(out) => panic!("{test} failed in the child process on the stub:\n{out}"),
        }
        return None;
    }
    let s = Stub::open(kind).unwrap_or_else(|e| panic!("the child must load the stub: {e}"));
    s.reset(2, u64::MAX);
    Some(s)
}

/// The stub of a helper process another test starts (which set the
/// environment); `None` elsewhere.
pub fn consumer_stub(kind: StubKind) -> Option<Stub> {
    if !stub::in_child() {
        return None;
    }
    let s = Stub::open(kind).unwrap_or_else(|e| panic!("the child must load the stub: {e}"));
    s.reset(2, u64::MAX);
    Some(s)
}

/// Nothing left alive in the stub, and no bad handle ever used.
pub fn assert_clean(stub: &Stub, what: &str) {
    let c = stub.counters();
    assert!(
        c.clean(),
        "{what}: the stub driver reports leaks or bad handles: {c:?}"
    );
}

/// The backend conformance suite on the stub: every scenario applies, all
/// pass, and afterwards the stub holds nothing.
pub fn conformance<G: GpuApi>(stub: &Stub, data: &Path) -> StubCounters {
    let h = GpuHarness::<G>::new(Some(Stub::open(G::STUB).expect("stub")));
    let r = backend_suite::run(&h, data).expect("the stub is a device");
    for p in &r.passed {
        println!("{} (stub): ok   {p}", G::NAME);
    }
    println!(
        "{} (stub): {} passed, {} failed, {} not applicable ({} choose where mallocs land: {:?})",
        G::NAME,
        r.passed.len(),
        r.failed.len(),
        r.skipped.len(),
        r.need_placement.len(),
        r.need_placement
    );
    assert!(r.failed.is_empty(), "{:#?}", r.failed);
    assert!(r.skipped.is_empty(), "not applicable: {:?}", r.skipped);
    drop(h);
    let c = stub.counters();
    assert!(c.clean(), "after the suite: {c:?}");
    c
}

pub(crate) type Alloc<G> = DeviceAllocator<Logged<<G as GpuApi>::B>, Vec<BlockSlot>, 64>;

/// An allocator on device `ordinal`, with the default settings.
pub(crate) fn allocator_on<G: GpuApi>(ordinal: u32) -> Alloc<G> {
    DeviceAllocator::with_events(
        Logged::new(G::open(ordinal).expect("open the device")),
        vec![BlockSlot::VACANT; 256],
        Config::DEFAULT,
    )
}

fn allocator<G: GpuApi>() -> Alloc<G> {
    allocator_on::<G>(0)
}

/// A backend opened on one thread and moved to another, where no device is
/// current, still works (each call makes its device current).
pub fn moved_to_another_thread<G: GpuApi>(stub: &Stub) {
    let mut a = allocator::<G>();
    let x = a.malloc(4096, G::default_stream()).expect("malloc");
    let t = std::thread::spawn(move || {
        a.free(x.handle.expect("handle"))
            .expect("free on another thread");
        let y = a
            .malloc(3 << 20, G::default_stream())
            .expect("malloc on another thread");
        a.free(y.handle.expect("handle")).expect("free");
        assert_eq!(a.release_all().expect("release_all"), 0);
        a
    });
    let a = t.join().expect("the other thread");
    assert_eq!(a.backend().held, 0);
    drop(a);
    assert_clean(stub, "moved to another thread");
}

/// After a call on device 0, the device the caller had made current
/// (device 1) is current again.
pub fn restores_the_current_device<G: GpuApi>(stub: &Stub) {
    let d1 = G::open(1).expect("device 1");
    G::make_current(&d1).expect("make device 1 current");
    assert_eq!(stub.current_device(), 1);
    let mut d0 = G::open(0).expect("device 0");
    let p = d0.malloc(2 << 20).expect("malloc on device 0");
    assert_eq!(stub.current_device(), 1, "malloc left device 0 current");
    let e = d0.event_create().expect("event");
    d0.event_record(&e, G::default_stream()).expect("record");
    d0.event_destroy(&e).expect("destroy");
    d0.free(p, 2 << 20).expect("free");
    assert_eq!(
        stub.current_device(),
        1,
        "the device is restored after every call"
    );
    drop((d0, d1));
    assert_clean(stub, "restore");
}

/// A workload the fault-injection runs drive step by step: its live
/// allocations by slot, and the stream it made (if any).
struct Workload<G: GpuApi> {
    s1: Option<StreamOf<G>>,
    live: [Option<Allocation>; 4],
}

impl<G: GpuApi> Workload<G> {
    /// Free the allocation in slot `n`, if there is one.
    fn free(&mut self, a: &mut Alloc<G>, n: usize) -> Result<(), String> {
        match self.live[n].and_then(|x| x.handle) {
            Some(i) => a.free(i).map_err(text::<G>).map(|()| self.live[n] = None),
            None => Ok(()),
        }
    }

    /// Allocate `size` bytes on the default stream into slot `n`.
    fn malloc(&mut self, a: &mut Alloc<G>, n: usize, size: u64) -> Result<(), String> {
        self.live[n] = Some(a.malloc(size, G::default_stream()).map_err(text::<G>)?);
        Ok(())
    }

    /// Allocate `size` bytes on the second stream into slot `n`.
    fn malloc_s1(&mut self, a: &mut Alloc<G>, n: usize, size: u64) -> Result<(), String> {
        let s1 = self.s1.ok_or("no stream")?;
        self.live[n] = Some(a.malloc(size, s1).map_err(text::<G>)?);
        Ok(())
    }
}

/// One step of a workload: step number `k` on the allocator.
type Step<G> = fn(&mut Alloc<G>, &mut Workload<G>, usize) -> Result<(), String>;

fn text<G: GpuApi>(e: cachealloc_core::Error<<G::B as DeviceBackend>::Error>) -> String {
    e.to_string()
}

/// The steps of [`every_call_can_fail`]: allocations on two streams, frees
/// with a pending event (one waited for by `empty_cache`, one completed by a
/// stream sync and noticed by a malloc), a memory fraction, teardown.
fn step<G: GpuApi>(a: &mut Alloc<G>, w: &mut Workload<G>, k: usize) -> Result<(), String> {
    let s1 = w.s1.ok_or("no stream")?;
    let record =
        |a: &mut Alloc<G>, w: &Workload<G>, n: usize| match w.live[n].and_then(|x| x.handle) {
            Some(i) => a.record_stream(i, s1).map_err(text::<G>),
            None => Ok(()),
        };
    match k {
        0 => w.malloc(a, 0, 4096)?,
        1 => w.live[1] = Some(a.malloc(3 << 20, s1).map_err(text::<G>)?),
        2 => record(a, w, 0)?,
        3 => w.free(a, 0)?,                       // an event on s1, pending
        4 => w.malloc(a, 2, 4096)?,               // queries it
        5 => a.empty_cache().map_err(text::<G>)?, // waits for it
        6 => w.free(a, 1)?,
        7 => record(a, w, 2)?,
        8 => w.free(a, 2)?,
        9 => G::synchronize(&a.backend().inner, Some(s1))?,
        10 => w.malloc(a, 3, 4096)?, // finds it done
        11 => a.set_memory_fraction(0.5).map_err(text::<G>)?,
        12 => w.free(a, 3)?,
        _ => {
            a.release_all().map_err(text::<G>)?;
        }
    }
    Ok(())
}

/// The steps of [`every_virtual_memory_call_can_fail`], with expandable
/// segments on: a small and a large expandable segment (reservations and
/// page maps), growth of the large one, frees, `empty_cache` (stream
/// syncs, unmaps, reservations given back), a map again.
fn vm_step<G: GpuApi>(a: &mut Alloc<G>, w: &mut Workload<G>, k: usize) -> Result<(), String> {
    match k {
        0 => w.malloc(a, 0, 4096)?,
        1 => w.malloc(a, 1, 30 << 20)?,
        2 => w.malloc(a, 2, 15 << 20)?, // grows the segment
        3 => w.free(a, 1)?,
        4 => a.empty_cache().map_err(text::<G>)?, // unmaps the page of [0, 20M)
        5 => w.free(a, 0)?,
        6 => w.free(a, 2)?,
        7 => a.empty_cache().map_err(text::<G>)?, // unmaps all, releases both
        _ => w.malloc(a, 1, 1 << 20)?,
    }
    Ok(())
}

/// The steps of [`every_compact_call_can_fail`] (`policy:compact`): a free
/// block unmapped to make room for a larger request (reclaim: a stream
/// sync, unmaps), a block freed on the default stream taken by the second
/// (an event recorded there and waited for on the device), `empty_cache`,
/// a map again.
fn compact_step<G: GpuApi>(a: &mut Alloc<G>, w: &mut Workload<G>, k: usize) -> Result<(), String> {
    const MIB: u64 = 1 << 20;
    match k {
        0 => w.malloc(a, 0, 40 * MIB)?,
        1 => w.malloc(a, 1, 4 * MIB)?,
        2 => w.free(a, 0)?,
        3 => w.malloc(a, 2, 60 * MIB)?, // reclaims the 40 MiB first
        4 => w.free(a, 1)?,
        5 => w.malloc_s1(a, 0, 8 * MIB)?,
        6 => w.free(a, 2)?,
        7 => w.malloc_s1(a, 1, 50 * MIB)?, // takes the 60 MiB block of stream 0
        8 => a.empty_cache().map_err(text::<G>)?,
        _ => w.malloc_s1(a, 2, MIB)?,
    }
    Ok(())
}

/// A failure injected at every driver call of a workload: the operation
/// that made the failing call returns an error value (never a panic), the
/// allocator stays consistent, and after clearing the fault and tearing
/// down, nothing leaks. Returns the number of calls covered.
pub fn every_call_can_fail<G: GpuApi>(stub: &Stub, fault_code: i32) -> u64 {
    let calls = inject_everywhere::<G>(stub, fault_code, "", true, 14, step::<G>, |_| Ok(()));
    println!(
        "{}: a failure at each of {calls} driver calls gave an error value",
        G::NAME
    );
    calls
}

/// [`every_call_can_fail`] with expandable segments: a failure at every
/// driver call (reservations, page creations, maps, access, unmaps,
/// releases, stream syncs) gives an error value, leaves the allocator
/// consistent, and after teardown the stub holds no reservation, physical
/// allocation or mapping. Returns the number of calls covered.
pub fn every_virtual_memory_call_can_fail<G: GpuApi>(stub: &Stub, fault_code: i32) -> u64 {
    let calls = inject_everywhere::<G>(
        stub,
        fault_code,
        "expandable_segments:True",
        false,
        9,
        vm_step::<G>,
        |a| match a.stats().num_device_free {
            2.. => Ok(()),
            n => Err(format!("{n} unmaps")),
        },
    );
    println!(
        "{}: with expandable segments, a failure at each of {calls} driver calls gave an error value",
        G::NAME
    );
    calls
}

/// [`every_call_can_fail`] under the compact policy: reclaim, cross-stream
/// hand-over (`stream_wait_event`) and unmaps fail at every call too.
pub fn every_compact_call_can_fail<G: GpuApi>(stub: &Stub, fault_code: i32) -> u64 {
    let calls = inject_everywhere::<G>(
        stub,
        fault_code,
        "policy:compact",
        true,
        10,
        compact_step::<G>,
        |a| {
            let s = a.stats();
            // The 40 MiB block unmapped before the 60 MiB one maps; the
            // 60 MiB block handed from stream 0 to stream 1.
            if a.stream_handovers() == 1 && s.num_device_free >= 1 && s.num_device_alloc >= 4 {
                Ok(())
            } else {
                Err(format!("{} hand-overs, {s:?}", a.stream_handovers()))
            }
        },
    );
    println!(
        "{}: under policy:compact, a failure at each of {calls} driver calls gave an error value",
        G::NAME
    );
    calls
}

/// Run `steps` steps of a workload (`conf`; a second stream when
/// `stream`) once without a fault (after which `did` checks it exercised
/// what it is for), then once with a failure planted at each driver call it
/// made; each run must end clean. The number of calls.
fn inject_everywhere<G: GpuApi>(
    stub: &Stub,
    fault_code: i32,
    conf: &str,
    stream: bool,
    steps: usize,
    step: Step<G>,
    did: fn(&Alloc<G>) -> Result<(), String>,
) -> u64 {
    let run = |fail_at: Option<u64>| -> Result<u64, String> {
        let mut a: Alloc<G> = DeviceAllocator::with_events(
            Logged::new(G::open(0)?),
            vec![BlockSlot::VACANT; 256],
            Config::parse(conf).map_err(|e| e.to_string())?,
        );
        G::make_current(&a.backend().inner)?; // no switching, so every call counts
        let s1 = if stream {
            Some(G::create_stream(&a.backend().inner)?)
        } else {
            None
        };
        let mut w = Workload::<G> {
            s1,
            live: [None; 4],
        };
        let start = stub.counters().calls;
        if let Some(i) = fail_at {
            stub.fail(None, i, fault_code);
        }
        for k in 0..steps {
            let before = stub.counters().injected;
            let r = step(&mut a, &mut w, k);
            if stub.counters().injected > before && r.is_ok() {
                return Err(format!("step {k}: the call failed, the step succeeded"));
            }
            a.check_invariants()
                .map_err(|v| format!("step {k} (fault at {fail_at:?}): {v}"))?;
        }
        let calls = stub.counters().calls - start;
        stub.clear_faults();
        if fail_at.is_none() {
            did(&a).map_err(|e| format!("the workload did not do what it is for: {e}"))?;
        }
        let live: Vec<_> = w.live.iter().flatten().map(|x| x.ptr).collect();
        crate::release_everything(&mut a, live, |b| {
            G::synchronize(&b.inner, None).expect("synchronize")
        })?;
        let b = a.backend();
        if b.held != 0 || b.event_creates != b.event_destroys || b.reservations != 0 {
            return Err(format!(
                "fault at {fail_at:?}: {} bytes, {} events and {} reservations left",
                b.held,
                b.event_creates - b.event_destroys,
                b.reservations
            ));
        }
        if let Some(s1) = s1 {
            G::destroy_stream(&a.backend().inner, s1)?;
        }
        drop(a);
        let c = stub.counters();
        if !c.clean() {
            return Err(format!("fault at {fail_at:?}: the stub reports {c:?}"));
        }
        Ok(calls)
    };
    let calls = run(None).expect("the workload without faults");
    assert!(calls > 10, "only {calls} driver calls");
    for i in 0..calls {
        run(Some(i)).unwrap_or_else(|e| panic!("{e}"));
    }
    calls
}

/// Every driver function the backend's sources name (`prefix`: "cu",
/// "hip"), and `extra` (what the tests call directly), exists in the stub.
pub fn symbol_inventory(stub: &Stub, sources: &Path, prefix: &str, extra: &[&str]) {
    let mut names = stub::called_functions(sources, prefix);
    names.extend(extra.iter().map(|s| s.to_string()));
    assert!(names.len() >= 10, "found only {names:?}");
    let missing: Vec<_> = names.iter().filter(|n| !stub.has_symbol(n)).collect();
    assert!(missing.is_empty(), "the stub lacks {missing:?}");
    println!("stub exports all {} functions: {names:?}", names.len());
}

/// Out of memory, through the FFI: the device's own out-of-memory code (a
/// full device, then one injected by name into `malloc_call`) reaches the
/// allocator as out-of-memory, so the ladder runs (an injected one is
/// retried and succeeds), and the final error names the platform as
/// PyTorch does ("HIP out of memory ... PYTORCH_HIP_ALLOC_CONF").
pub fn out_of_memory<G: GpuApi>(stub: &Stub, malloc_call: &str, oom_code: i32) {
    stub.set_capacity(8 << 20);
    let mut a = allocator::<G>();
    let e = a.malloc(16 << 20, G::default_stream()).unwrap_err();
    let platform = <G::B as DeviceBackend>::PLATFORM;
    let msg = e.to_string();
    assert!(e.is_out_of_memory(), "{msg}");
    assert!(
        msg.starts_with(&format!(
            "{platform} out of memory. Tried to allocate 16.00 MiB"
        )) && msg.contains(&format!("PYTORCH_{platform}_ALLOC_CONF")),
        "{msg}"
    );
    stub.set_capacity(u64::MAX);
    stub.fail(Some(malloc_call), 0, oom_code);
    let retries = a.stats().num_alloc_retries;
    let x = a
        .malloc(4096, G::default_stream())
        .expect("retried after the injected OOM");
    assert_eq!(a.stats().num_alloc_retries, retries + 1);
    assert_eq!(stub.counters().injected, 1);
    a.free(x.handle.expect("handle")).expect("free");
    assert_eq!(a.release_all().expect("release_all"), 0);
    drop(a);
    assert_clean(stub, "out of memory");
}

/// The stub tests of one GPU backend's test file, and the test that runs
/// them in a child process with the stub driver loaded:
///
/// ```ignore
/// cachealloc_tests::stub_tests!(Cuda, malloc: "cuMemAlloc_v2", oom: 2, unknown: 999,
///     prefix: "cu", extra: ["cuGetErrorName"]);
/// ```
///
/// `Cuda` implements [`GpuApi`]; `malloc` is its driver's allocation call,
/// `oom` and `unknown` its out-of-memory and "unknown error" codes; `prefix`
/// and `extra` feed the symbol inventory. The generated `stub_*` tests are
/// `#[ignore]`d: `ffi_checks_run_on_the_stub_in_a_child_process` runs them
/// all in one child process (asked for by name in the parent, one runs in a
/// child of its own).
#[macro_export]
macro_rules! stub_tests {
    ($api:ty, malloc: $malloc:literal, oom: $oom:expr, unknown: $unknown:expr,
     prefix: $prefix:literal, extra: [$($extra:literal),* $(,)?]) => {
        #[test]
        fn ffi_checks_run_on_the_stub_in_a_child_process() {
            if $crate::stub::in_child() {
                return;
            }
            let kind = <$api as $crate::gpu::GpuApi>::STUB;
            match $crate::stub::run_in_child(kind, "stub_") {
                Ok(out) => {
                    println!("{out}");
                    let n = $crate::stub::passed_in(&out);
                    assert!(n >= 12, "only {n} stub tests ran in the child:\n{out}");
                    println!("{n} stub tests passed in the child process on the stub driver");
                }
                Err(out) => panic!("the stub tests failed in the child:\n{out}"),
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_conformance_suite() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_conformance_suite") {
                $crate::stub_suite::conformance::<$api>(&s, &$crate::testdata_dir());
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_backend_moved_to_another_thread() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_backend_moved_to_another_thread") {
                $crate::stub_suite::moved_to_another_thread::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_restores_the_callers_device() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_restores_the_callers_device") {
                $crate::stub_suite::restores_the_current_device::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_every_call_can_fail() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_every_call_can_fail") {
                $crate::stub_suite::every_call_can_fail::<$api>(&s, $unknown);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_every_virtual_memory_call_can_fail() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_every_virtual_memory_call_can_fail") {
                $crate::stub_suite::every_virtual_memory_call_can_fail::<$api>(&s, $unknown);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_every_compact_call_can_fail() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_every_compact_call_can_fail") {
                $crate::stub_suite::every_compact_call_can_fail::<$api>(&s, $unknown);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_out_of_memory() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_out_of_memory") {
                $crate::stub_suite::out_of_memory::<$api>(&s, $malloc, $oom);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_ipc_between_two_processes() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_ipc_between_two_processes") {
                $crate::stub_ipc::ipc_between_processes::<$api>(&s, "ipc_consumer_process");
            }
        }

        /// The consumer process of `stub_ipc_between_two_processes` (run
        /// by it, in a process of its own).
        #[test]
        #[ignore = "the consumer process of stub_ipc_between_two_processes, which starts it"]
        fn ipc_consumer_process() {
            if let Some(s) = $crate::stub_suite::consumer_stub(<$api as $crate::gpu::GpuApi>::STUB) {
                $crate::stub_ipc::ipc_consumer::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_expandable_pages_between_two_processes() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_expandable_pages_between_two_processes") {
                $crate::stub_vmm_ipc::pages_between_processes::<$api>(&s, "pages_consumer_process");
            }
        }

        /// The consumer process of `stub_expandable_pages_between_two_processes`.
        #[test]
        #[ignore = "the consumer process of stub_expandable_pages_between_two_processes, which starts it"]
        fn pages_consumer_process() {
            if let Some(s) = $crate::stub_suite::consumer_stub(<$api as $crate::gpu::GpuApi>::STUB) {
                $crate::stub_vmm_ipc::pages_consumer::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_peer_access_and_copies() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_peer_access_and_copies") {
                $crate::stub_ipc::peer_access_and_copies::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_capture_rules() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_capture_rules") {
                $crate::stub_capture::capture_rules::<$api>(&s);
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_graph_capture_like_torch() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_graph_capture_like_torch") {
                $crate::stub_capture::graph_like_torch::<$api>(&s, "");
                $crate::stub_capture::graph_like_torch::<$api>(&s, "expandable_segments:True");
            }
        }

        #[test]
        #[ignore = "runs in a child process on the stub driver (ffi_checks_run_on_the_stub_in_a_child_process)"]
        fn stub_symbol_inventory() {
            if let Some(s) = $crate::stub_suite::child_stub(<$api as $crate::gpu::GpuApi>::STUB, "stub_symbol_inventory") {
                let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
                $crate::stub_suite::symbol_inventory(&s, &src, $prefix, &[$($extra),*]);
            }
        }
    };
}
