//! [`ReplayDevice`]: what a replay needs of a kind of device beyond the
//! `DeviceBackend` trait: how to open device `k`, which of its streams a
//! trace stream id stands for, and a host wait. The simulated device
//! implements it here; the CLI implements it for CUDA and HIP.

use cachealloc_core::DeviceBackend;
use cachealloc_mock::{MockDevice, RealAddressUse};

/// A kind of device a trace can be replayed on.
pub trait ReplayDevice {
    /// Its backend.
    type Backend: DeviceBackend;
    /// Whether the device is simulated (a capacity is then the device's
    /// size; on a real device it becomes a memory limit).
    const SIMULATED: bool;
    /// Open device `index` (`capacity`: its size, where simulated).
    fn open(index: u64, capacity: Option<u64>) -> Result<Self::Backend, String>;
    /// The stream for trace stream `id` (called once per id and device).
    fn stream_for(
        backend: &mut Self::Backend,
        id: u64,
    ) -> Result<<Self::Backend as DeviceBackend>::Stream, String>;
    /// The host waits for `stream` (everything when `None`).
    fn sync(
        backend: &mut Self::Backend,
        stream: Option<<Self::Backend as DeviceBackend>::Stream>,
    ) -> Result<(), String>;
    /// Give back a stream `stream_for` made (at the end of a replay on a
    /// real device). The simulated device's streams need nothing.
    fn destroy_stream(
        _backend: &mut Self::Backend,
        _stream: <Self::Backend as DeviceBackend>::Stream,
    ) -> Result<(), String> {
        Ok(())
    }
    /// Give the device's mallocs the addresses of a recorded run, (address,
    /// size) in malloc order (the trace header's `malloc_addresses`). Only
    /// a simulated device can.
    fn use_real_addresses(
        _backend: &mut Self::Backend,
        _mallocs: &[(u64, u64)],
    ) -> Result<(), String> {
        Err(
            "only the simulated device (--backend mock) can hand out recorded addresses"
                .to_string(),
        )
    }
    /// How the recorded addresses were used (`None`: not a simulated device).
    fn real_address_use(_backend: &Self::Backend) -> Option<RealAddressUse> {
        None
    }
}

impl ReplayDevice for MockDevice {
    type Backend = MockDevice;
    const SIMULATED: bool = true;
    fn open(index: u64, capacity: Option<u64>) -> Result<MockDevice, String> {
        Ok(MockDevice::new(capacity).with_ordinal(index as u32))
    }
    fn stream_for(_backend: &mut MockDevice, id: u64) -> Result<u64, String> {
        Ok(id)
    }
    fn sync(backend: &mut MockDevice, stream: Option<u64>) -> Result<(), String> {
        backend.sync(stream);
        Ok(())
    }
    fn use_real_addresses(backend: &mut MockDevice, mallocs: &[(u64, u64)]) -> Result<(), String> {
        backend.use_real_addresses(mallocs);
        Ok(())
    }
    fn real_address_use(backend: &MockDevice) -> Option<RealAddressUse> {
        Some(backend.real_address_use())
    }
}
