//! The backend conformance suite: the same checks for any [`Harness`] (the
//! mock always; CUDA and HIP on their stub drivers, and where a device is
//! present): the device checks, then every PyTorch-parity scenario, every
//! expandable-segment scenario, every private-pool (CUDA graph) scenario
//! and every scenario that tells torch releases apart (the rejection
//! policy among them) the device can run.

use crate::harness::{Harness, Logged};
use crate::scenario;
use cachealloc_core::{
    BlockSlot, Config, DeviceAllocator, DeviceBackend, EventStatus, MallocError,
};
use std::path::Path;

/// What ran, what failed, what could not run on this device.
#[derive(Debug, Default)]
pub struct SuiteReport {
    /// Checks that passed.
    pub passed: Vec<String>,
    /// Checks that failed, with why.
    pub failed: Vec<String>,
    /// Scenarios left out (they need a simulated capacity or event timing).
    pub skipped: Vec<String>,
    /// Scenarios left out because they choose where the device's mallocs
    /// land, which only the simulated device can.
    pub need_placement: Vec<String>,
}

fn check(report: &mut SuiteReport, name: &str, r: Result<(), String>) {
    match r {
        Ok(()) => report.passed.push(name.to_string()),
        Err(e) => report.failed.push(format!("{name}: {e}")),
    }
}

type Alloc<H> = DeviceAllocator<Logged<<H as Harness>::B>, Vec<BlockSlot>, 64>;

fn allocator<H: Harness>(h: &H, capacity: Option<u64>) -> Result<Alloc<H>, String> {
    Ok(DeviceAllocator::new(
        Logged::new(h.open(capacity)?),
        vec![BlockSlot::VACANT; 1024],
        Config::DEFAULT,
    ))
}

fn round_trip<H: Harness>(h: &H) -> Result<(), String> {
    let mut b = h.open(None)?;
    let p = b.malloc(2 << 20).map_err(|e| format!("{e:?}"))?;
    if p.is_null() {
        return Err("malloc returned null".into());
    }
    b.free(p, 2 << 20).map_err(|e| e.to_string())
}

fn zero_size<H: Harness>(h: &H) -> Result<(), String> {
    let mut a = allocator(h, None)?;
    let x = a.malloc(0, h.stream(0)).map_err(|e| e.to_string())?;
    if !x.ptr.is_null() || x.handle.is_some() || !a.backend().mallocs.is_empty() {
        return Err(format!("zero bytes reached the device: {x:?}"));
    }
    a.free_ptr(x.ptr).map_err(|e| e.to_string())
}

fn huge_is_oom<H: Harness>(h: &H) -> Result<(), String> {
    let mut b = h.open(Some(1 << 40))?;
    match b.malloc(1 << 50) {
        Err(MallocError::OutOfMemory) => Ok(()),
        Err(MallocError::Other(e)) => {
            Err(format!("a 1 PiB malloc failed with {e}, not out-of-memory"))
        }
        Ok(p) => {
            let _ = b.free(p, 1 << 50);
            Err("a 1 PiB malloc succeeded".into())
        }
    }
}

fn events<H: Harness>(h: &H) -> Result<(), String> {
    let mut b = h.open(None)?;
    let e = b.event_create().map_err(|e| e.to_string())?;
    let sure = h.enqueue_work(&mut b, 1);
    b.event_record(&e, h.stream(1)).map_err(|e| e.to_string())?;
    let before = b.event_query(&e).map_err(|e| e.to_string())?;
    if sure && before != EventStatus::Pending {
        return Err("an event behind queued work was already ready".into());
    }
    h.finish(&mut b, Some(1));
    let after = b.event_query(&e).map_err(|e| e.to_string())?;
    if after != EventStatus::Ready {
        return Err("the event is not ready after its stream finished".into());
    }
    b.event_synchronize(&e).map_err(|e| e.to_string())?;
    b.event_destroy(&e).map_err(|e| e.to_string())
}

fn event_reuse<H: Harness>(h: &H) -> Result<(), String> {
    let mut a = allocator(h, None)?;
    for _ in 0..3 {
        let x = a.malloc(4096, h.stream(1)).map_err(|e| e.to_string())?;
        a.record_stream(x.handle.ok_or("no handle")?, h.stream(2))
            .map_err(|e| e.to_string())?;
        a.free(x.handle.ok_or("no handle")?)
            .map_err(|e| e.to_string())?;
        h.finish(&mut a.backend_mut().inner, None);
        a.empty_cache().map_err(|e| e.to_string())?;
    }
    if a.backend().event_creates != 1 {
        return Err(format!(
            "{} events created for 3 sequential pending frees",
            a.backend().event_creates
        ));
    }
    a.release_idle_events().map_err(|e| e.to_string())?;
    if a.backend().event_destroys != 1 || a.backend().held != 0 {
        return Err("events or memory left behind".into());
    }
    Ok(())
}

/// A check of the device itself.
pub type DeviceCheck<H> = (&'static str, fn(&H) -> Result<(), String>);

/// The checks of the device itself the suite makes before the scenarios.
pub fn device_checks<H: Harness>() -> Vec<DeviceCheck<H>> {
    vec![
        ("malloc/free round trip", round_trip::<H>),
        ("zero-byte request never reaches the device", zero_size::<H>),
        ("huge malloc is out-of-memory", huge_is_oom::<H>),
        (
            "event pending, then ready after the stream's work",
            events::<H>,
        ),
        ("events are reused from the pool", event_reuse::<H>),
    ]
}

/// Run the suite on `h`; `Err` says why it cannot run on this machine.
pub fn run<H: Harness>(h: &H, data: &Path) -> Result<SuiteReport, String> {
    // Probe first: no device, no suite (the caller prints why).
    drop(h.open(None)?);
    let mut r = SuiteReport::default();
    for (name, f) in device_checks::<H>() {
        check(&mut r, name, f(h));
    }
    let mut all = scenario::load_all(data)?;
    // Expandable segments (virtual memory), private pools (CUDA graph
    // captures, begun and ended on the device as `torch.cuda.graph` does,
    // so a device that models the capture rules checks that no call
    // invalidates them) and torch's releases, where the data has them.
    for suite in ["expandable", "pools", "versions"] {
        match scenario::load_suite(data, suite) {
            Ok(more) => all.extend(more),
            Err(e) if crate::testdata_overridden() => println!("{}: {e}", h.name()),
            Err(e) => return Err(e),
        }
    }
    for v in all {
        let sc = scenario::parse(&v)?;
        if !scenario::runnable(h, &sc) {
            if scenario::needs_placement(&sc) && !h.places_mallocs() {
                r.need_placement.push(sc.name);
            } else {
                r.skipped.push(sc.name);
            }
            continue;
        }
        let fails = scenario::run(h, &sc);
        let name = format!("scenario {}", sc.name);
        check(
            &mut r,
            &name,
            if fails.is_empty() {
                Ok(())
            } else {
                Err(fails.join("; "))
            },
        );
    }
    Ok(r)
}

/// Run and report for a test: prints every line; panics on a failure, and
/// when there is no device (a test that needs a GPU is `#[ignore]`d, and
/// runs only where one was asked for).
pub fn run_and_report<H: Harness>(h: &H, data: &Path) {
    match run(h, data) {
        Err(why) => panic!(
            "{}: no device to run the backend conformance suite on: {why}",
            h.name()
        ),
        Ok(r) => {
            for p in &r.passed {
                println!("{}: ok   {p}", h.name());
            }
            for f in &r.failed {
                println!("{}: FAIL {f}", h.name());
            }
            println!(
                "{}: {} passed, {} failed, {} scenarios not applicable ({})",
                h.name(),
                r.passed.len(),
                r.failed.len(),
                r.skipped.len(),
                r.skipped.join(", ")
            );
            assert!(r.failed.is_empty(), "{}: {:#?}", h.name(), r.failed);
        }
    }
}
