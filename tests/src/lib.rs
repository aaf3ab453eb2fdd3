//! Shared machinery of cachealloc's integration tests: the allocator on the
//! mock device, the PyTorch-parity scenario runner, a generator of random
//! multi-stream op sequences, a writer of those as trace files, and a driver
//! of the reference model.
//!
//! The test data (scenarios, the reference model, traces) is in `data/`
//! (see its README); `CACHEALLOC_TESTDATA=DIR` points the conformance
//! runner, the backend suite, the differential test and the real-trace tests
//! at another folder of the same layout.

use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DeviceStats, Error};
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

// What every test ends with (release everything, then no leak): the
// mock crate's, so that the loom models share it without this crate.
pub use cachealloc_mock::teardown::{release_everything, teardown, AsMock};

impl AsMock for harness::Logged<MockDevice> {
    fn mock(&self) -> &MockDevice {
        &self.inner
    }
    fn mock_mut(&mut self) -> &mut MockDevice {
        &mut self.inner
    }
}
