//! On a machine without a CUDA driver (CI, this project's build machines) the
//! backend reports "no driver" as an error value; with a driver it opens
//! device 0 or reports that it has none.

use cachealloc_cuda::{driver_present, CudaBackend, CudaError};

#[test]
fn opening_a_device_never_panics() {
    match CudaBackend::new(0) {
        Err(CudaError::NoDriver) => {
            assert!(!driver_present());
            println!("no CUDA driver on this machine: CudaBackend::new(0) = NoDriver, as expected");
        }
        Err(CudaError::NoDevice { count, .. }) => println!("CUDA driver present, {count} devices"),
        Err(e) => println!("CUDA driver present but unusable: {e}"),
        Ok(b) => println!("CUDA device {} opened", b.ordinal()),
    }
    assert_eq!(
        CudaError::NoDriver.to_string(),
        "no CUDA driver: libcuda could not be loaded"
    );
}

#[test]
fn a_missing_ordinal_is_an_error() {
    if driver_present() {
        assert!(matches!(
            CudaBackend::new(9999),
            Err(CudaError::NoDevice { ordinal: 9999, .. } | CudaError::Driver { .. })
        ));
    } else {
        assert_eq!(CudaBackend::new(9999).unwrap_err(), CudaError::NoDriver);
    }
}
