//! Shared machinery of cachealloc's integration tests: the allocator on the
//! mock device, the PyTorch-parity scenario runner, a generator of random
//! multi-stream op sequences, a writer of those as trace files, and a driver
//! of the reference model.
//!
//! The test data (scenarios, the reference model, traces) is in `data/`
//! (see its README); `CACHEALLOC_TESTDATA=DIR` points the conformance
//! runner, the backend suite, the differential test and the real-trace tests
//! at another folder of the same layout.

use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DevicePtr, DeviceStats, Error};
use cachealloc_mock::{MockDevice, MockError};
use std::path::PathBuf;

/// The README's Rust examples, compiled and run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of `docs/rust.md`, compiled and run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../docs/rust.md")]
pub struct RustDocDoctests;

pub mod backend_suite;
pub mod fuzz;
pub mod gpu;
pub mod harness;
pub mod ops;
pub mod oracle;
pub mod scenario;
pub mod stub;
pub mod stub_capture;
pub mod stub_ipc;
pub mod stub_suite;
pub mod stub_vmm_ipc;

/// The allocator under test: mock device, boxed slots, 256 pending events.
pub type MockAllocator = DeviceAllocator<MockDevice, Box<[BlockSlot]>, 256>;

/// The error type of [`MockAllocator`].
pub type MockAllocError = Error<MockError>;

/// A fresh allocator with `slots` block slots.
pub fn allocator(capacity: Option<u64>, config: Config, slots: usize) -> MockAllocator {
    DeviceAllocator::with_events(
        MockDevice::new(capacity),
        vec![BlockSlot::VACANT; slots].into_boxed_slice(),
        config,
    )
}

/// The test data bundled with the repository (`tests/data/`).
pub fn bundled_testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data")
}

/// The test data in use: `$CACHEALLOC_TESTDATA` if set, else the bundled
/// data. Layout: `conformance/` (`scenarios.json` and / or `scenarios.md`),
/// `oracle/pytorch_sim.py`, `traces/*.jsonl.gz`.
pub fn testdata_dir() -> PathBuf {
    match std::env::var_os("CACHEALLOC_TESTDATA") {
        Some(d) => PathBuf::from(d),
        None => bundled_testdata(),
    }
}

/// Whether `$CACHEALLOC_TESTDATA` replaces the bundled data.
pub fn testdata_overridden() -> bool {
    std::env::var_os("CACHEALLOC_TESTDATA").is_some()
}

/// `part` of the test data (e.g. `oracle/pytorch_sim.py`), if present.
/// Missing from the bundled data it is an error (the repository is broken);
/// missing from a folder given by `CACHEALLOC_TESTDATA` it is `None`, and the
/// test that needs it says so and skips.
pub fn testdata_part(part: &str) -> Option<PathBuf> {
    let p = testdata_dir().join(part);
    if p.exists() {
        return Some(p);
    }
    assert!(
        testdata_overridden(),
        "the bundled test data lacks {} (the repository is incomplete)",
        p.display()
    );
    println!(
        "skipped: CACHEALLOC_TESTDATA={} has no {part}",
        testdata_dir().display()
    );
    None
}

/// A folder of the third-party recordings beside the checkout
/// (`../shared/real-traces`, `../shared/real-snapshots`; never part of the
/// repository), or `$CACHEALLOC_SHARED/<part>`; `None` (the test says it
/// skips) when absent.
pub fn shared_part(part: &str) -> Option<PathBuf> {
    let base = match std::env::var_os("CACHEALLOC_SHARED") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"),
    };
    let p = base.join(part);
    if p.is_dir() {
        Some(p)
    } else {
        println!(
            "skipped: no {} (the third-party recordings are not in the repository)",
            p.display()
        );
        None
    }
}

/// A scratch folder for one test, removed by the caller.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cachealloc-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("a scratch folder");
    d
}

/// Every flat stat key and value, as the oracle prints them.
pub fn stats_map(stats: &DeviceStats) -> serde_json::Map<String, serde_json::Value> {
    stats_map_of(stats, cachealloc_core::TorchVersion::NEWEST)
}

/// [`stats_map`] with the keys of torch `version`.
pub fn stats_map_of(
    stats: &DeviceStats,
    version: cachealloc_core::TorchVersion,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    stats.for_each_of(version, |k, v| {
        m.insert(k.to_string(), v.into());
    });
    m
}

/// A backend that is the simulated device, possibly wrapped.
pub trait AsMock: cachealloc_core::DeviceBackend {
    /// The device.
    fn mock(&self) -> &MockDevice;
    /// The device, mutably.
    fn mock_mut(&mut self) -> &mut MockDevice;
}

impl AsMock for MockDevice {
    fn mock(&self) -> &MockDevice {
        self
    }
    fn mock_mut(&mut self) -> &mut MockDevice {
        self
    }
}

impl AsMock for harness::Logged<MockDevice> {
    fn mock(&self) -> &MockDevice {
        &self.inner
    }
    fn mock_mut(&mut self) -> &mut MockDevice {
        &mut self.inner
    }
}

/// Wait for all stream work, free what is live, then the allocator's own
/// teardown (`release_all`: wait for events, return every cached segment,
/// destroy idle events) and the invariants: what every test ends with before
/// it looks for leaks. `wait_all` makes the device finish all work.
pub fn release_everything<B, S, const E: usize>(
    a: &mut DeviceAllocator<B, S, E>,
    live: impl IntoIterator<Item = DevicePtr>,
    mut wait_all: impl FnMut(&mut B),
) -> Result<(), String>
where
    B: cachealloc_core::DeviceBackend,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    // All streams finish first, so frees with recorded streams find room in
    // the event queue.
    wait_all(a.backend_mut());
    for p in live {
        a.free_ptr(p).map_err(|e| format!("free of {p}: {e}"))?;
    }
    match a.release_all() {
        Ok(0) => {}
        Ok(n) => return Err(format!("{n} allocations still live after release_all")),
        Err(e) => return Err(format!("release_all: {e}")),
    }
    a.check_invariants()
        .map_err(|e| format!("after release: {e}"))
}

/// On the mock: clear planted failures, [`release_everything`], then the
/// mock must hold nothing. Returns a description of what is left, if anything.
pub fn teardown<B, S, const E: usize>(
    a: &mut DeviceAllocator<B, S, E>,
    live: impl IntoIterator<Item = DevicePtr>,
) -> Result<(), String>
where
    B: AsMock,
    S: AsRef<[BlockSlot]> + AsMut<[BlockSlot]>,
{
    a.backend_mut().mock_mut().clear_faults();
    release_everything(a, live, |b| b.mock_mut().sync(None))
        .map_err(|e| format!("teardown: {e}"))?;
    let m = a.backend().mock();
    if m.held_bytes() != 0
        || m.live_segments() != 0
        || m.live_events() != 0
        || m.live_reservations() != 0
        || m.mapped_pages() != 0
    {
        return Err(format!(
            "leak: {} bytes in {} segments and {} pages, {} reservations and {} events still held",
            m.held_bytes(),
            m.live_segments(),
            m.mapped_pages(),
            m.live_reservations(),
            m.live_events()
        ));
    }
    if a.stats().reserved_bytes.all().current != 0 || a.slots_in_use() != 0 {
        return Err(format!(
            "allocator still reserves {} bytes",
            a.stats().reserved_bytes.all().current
        ));
    }
    Ok(())
}
