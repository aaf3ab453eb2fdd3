//! Without an AMD GPU the runtime reports no device, and the backend turns
//! that into an error value.
#![cfg(feature = "rocm")]

use cachealloc_hip::{device_count, HipBackend, HipError};

#[test]
fn opening_a_device_without_a_gpu_is_no_device() {
    let count = device_count().expect("hipGetDeviceCount");
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
