//! Without an AMD GPU the runtime reports no device, and the backend turns
//! that into an error value.
//!
//! The backend conformance suite of `cachealloc-tests` on a real HIP device
//! (device 0). Without a device it prints one line saying why it skipped.
#![cfg(feature = "rocm")]

use cachealloc_hip::{device_count, HipBackend, HipError, HipStream};
use cachealloc_tests::harness::Harness;
use cachealloc_tests::{backend_suite, testdata_dir};
use hip_sys::hiprt as hip;
use std::cell::RefCell;

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

const SCRATCH: usize = 256 << 20;

#[derive(Default)]
struct HipHarness {
    streams: RefCell<Vec<HipStream>>,
    scratch: RefCell<Option<usize>>,
}

impl Harness for HipHarness {
    type B = HipBackend;
    fn name(&self) -> &'static str {
        "hip"
    }
    fn open(&self, _capacity: Option<u64>) -> Result<HipBackend, String> {
        let b = HipBackend::new(0).map_err(|e| e.to_string())?;
        if self.streams.borrow().is_empty() {
            for _ in 0..3 {
                let mut s: hip::hipStream_t = std::ptr::null_mut();
                // SAFETY: `s` is a valid out-pointer; the stream lives for the test.
                let e = unsafe { hip::hipStreamCreateWithFlags(&mut s, hip::hipStreamNonBlocking) };
                if e != hip::hipError_t::hipSuccess {
                    return Err(format!("hipStreamCreateWithFlags: {e:?}"));
                }
                self.streams.borrow_mut().push(HipStream::from_raw(s));
            }
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: `p` is a valid out-pointer; the buffer is only a memset target.
            let e = unsafe { hip::hipMalloc(&mut p, SCRATCH) };
            if e != hip::hipError_t::hipSuccess {
                return Err(format!("hipMalloc: {e:?}"));
            }
            *self.scratch.borrow_mut() = Some(p as usize);
        }
        Ok(b)
    }
    fn stream(&self, k: u64) -> HipStream {
        if k == 0 {
            HipStream::DEFAULT
        } else {
            self.streams.borrow()[(k as usize - 1) % 3]
        }
    }
    fn enqueue_work(&self, _b: &mut HipBackend, k: u64) -> bool {
        if let Some(p) = *self.scratch.borrow() {
            // SAFETY: `p` is a live SCRATCH-byte allocation; the stream is ours.
            let _ = unsafe {
                hip::hipMemsetAsync(
                    p as *mut std::ffi::c_void,
                    1,
                    SCRATCH,
                    self.stream(k).as_raw(),
                )
            };
        }
        false
    }
    fn finish(&self, b: &mut HipBackend, k: Option<u64>) {
        match k {
            Some(k) => b.synchronize(self.stream(k)).expect("hipStreamSynchronize"),
            None => {
                // SAFETY: plain call.
                let e = unsafe { hip::hipDeviceSynchronize() };
                assert_eq!(e, hip::hipError_t::hipSuccess, "hipDeviceSynchronize");
            }
        }
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn simulated(&self) -> bool {
        false
    }
}

#[test]
fn hip_backend_conformance() {
    backend_suite::run_and_report(&HipHarness::default(), &testdata_dir());
}
