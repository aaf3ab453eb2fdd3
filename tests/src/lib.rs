//! Shared machinery of cachealloc's integration tests: the allocator on the
//! mock device, the PyTorch-parity scenario runner, a generator of random
//! multi-stream op sequences, a writer of those as trace files, and a driver
//! of the reference model (`../shared/oracle/pytorch_sim.py`).

use cachealloc_core::{BlockSlot, Config, DeviceAllocator, DevicePtr, DeviceStats, Error};
use cachealloc_mock::{MockDevice, MockError};
use std::path::PathBuf;

pub mod backend_suite;
pub mod fuzz;
pub mod harness;
pub mod ops;
pub mod oracle;
pub mod scenario;

/// The allocator under test: mock device, boxed slots, 256 pending events.
pub type MockAllocator = DeviceAllocator<MockDevice, Box<[BlockSlot]>, 256>;

/// The error type of [`MockAllocator`].
pub type MockAllocError = Error<MockError>;

/// A fresh allocator with `slots` block slots.
pub fn allocator(capacity: Option<u64>, config: Config, slots: usize) -> MockAllocator {
    DeviceAllocator::new(
        MockDevice::new(capacity),
        vec![BlockSlot::VACANT; slots].into_boxed_slice(),
        config,
    )
}

/// `../shared` beside the checkout (override with `CACHEALLOC_SHARED`).
pub fn shared_dir() -> PathBuf {
    if let Ok(p) = std::env::var("CACHEALLOC_SHARED") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("..")
        .join("shared")
}

/// Every flat stat key and value, as the oracle prints them.
pub fn stats_map(stats: &DeviceStats) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    stats.for_each(|k, v| {
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

/// Wait for all stream work, free what is live, wait again, empty the cache,
/// drop the idle events and check the invariants: what every test ends with
/// before it looks for leaks. `wait_all` makes the device finish all work.
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
    wait_all(a.backend_mut());
    a.empty_cache().map_err(|e| format!("empty_cache: {e}"))?;
    a.release_idle_events()
        .map_err(|e| format!("idle events: {e}"))?;
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
    if m.held_bytes() != 0 || m.live_segments() != 0 || m.live_events() != 0 {
        return Err(format!(
            "leak: {} bytes in {} segments and {} events still held",
            m.held_bytes(),
            m.live_segments(),
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
