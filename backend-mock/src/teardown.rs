//! The end of every test on the simulated device: release everything the
//! allocator holds, check its invariants, then prove the device holds
//! nothing (no bytes, segments, pages, reservations or events).
//!
//! ```
//! use cachealloc_core::{BlockSlot, Config, DeviceAllocator};
//! use cachealloc_mock::{teardown::teardown, MockDevice};
//!
//! let mut a = DeviceAllocator::new(
//!     MockDevice::with_capacity(64 << 20), vec![BlockSlot::VACANT; 64], Config::DEFAULT);
//! let x = a.malloc(4096, 0)?;
//! let y = a.malloc(1 << 20, 0)?;
//! a.free(x.handle.unwrap())?;
//! teardown(&mut a, [y.ptr]).expect("nothing left behind"); // frees y too
//! # Ok::<(), cachealloc_core::Error<cachealloc_mock::MockError>>(())
//! ```

use crate::MockDevice;
use cachealloc_core::{BlockSlot, DeviceAllocator, DevicePtr};

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
