//! On a machine without a CUDA driver (CI, this project's build machines) the
//! backend reports "no driver" as an error value; with a driver it opens
//! device 0 or reports that it has none.
//!
//! The backend conformance suite of `cachealloc-tests` on a real CUDA device
//! (device 0). Without a driver or a device it prints one line saying why it
//! skipped. Scenarios that depend on a simulated capacity or on event timing
//! are left out (a real device runs this test's work at its own pace).

use cachealloc_cuda::{driver_present, CudaBackend, CudaError, CudaStream};
use cachealloc_tests::harness::Harness;
use cachealloc_tests::{backend_suite, testdata_dir};
use cudarc::driver::result;
use std::cell::RefCell;

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

const SCRATCH: usize = 256 << 20;

#[derive(Default)]
struct CudaHarness {
    /// Keeps the primary context (and so the streams) alive between opens.
    keeper: RefCell<Option<CudaBackend>>,
    streams: RefCell<Vec<CudaStream>>,
    scratch: RefCell<Option<u64>>,
}

impl Harness for CudaHarness {
    type B = CudaBackend;
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn open(&self, _capacity: Option<u64>) -> Result<CudaBackend, String> {
        let b = CudaBackend::new(0).map_err(|e| e.to_string())?;
        if self.keeper.borrow().is_none() {
            *self.keeper.borrow_mut() = Some(CudaBackend::new(0).map_err(|e| e.to_string())?);
            for _ in 0..3 {
                let s = result::stream::create(result::stream::StreamKind::NonBlocking)
                    .map_err(|e| e.to_string())?;
                self.streams.borrow_mut().push(CudaStream::from_raw(s));
            }
            // SAFETY: a plain device allocation in the current context, used
            // only as the target of memsets and never freed while in use.
            let p = unsafe { result::malloc_sync(SCRATCH) }.map_err(|e| e.to_string())?;
            *self.scratch.borrow_mut() = Some(p);
        }
        Ok(b)
    }
    fn stream(&self, k: u64) -> CudaStream {
        if k == 0 {
            CudaStream::DEFAULT
        } else {
            self.streams.borrow()[(k as usize - 1) % 3]
        }
    }
    fn enqueue_work(&self, _b: &mut CudaBackend, k: u64) -> bool {
        if let Some(p) = *self.scratch.borrow() {
            // SAFETY: `p` is a live SCRATCH-byte allocation; the stream is
            // the default stream or one created above in this context.
            let _ = unsafe { result::memset_d8_async(p, 1, SCRATCH, self.stream(k).as_raw()) };
        }
        false // a memset may finish before the event is queried
    }
    fn finish(&self, b: &mut CudaBackend, k: Option<u64>) {
        let r = match k {
            Some(k) => b.synchronize(self.stream(k)).map_err(|e| e.to_string()),
            None => result::ctx::synchronize().map_err(|e| e.to_string()),
        };
        r.expect("synchronize");
    }
    fn deterministic(&self) -> bool {
        false
    }
    fn simulated(&self) -> bool {
        false
    }
}

#[test]
fn cuda_backend_conformance() {
    backend_suite::run_and_report(&CudaHarness::default(), &testdata_dir());
}
