//! The backend conformance suite on the simulated device (CUDA and HIP run
//! the same suite from their own crates' tests when a device is present).

use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{backend_suite, shared_dir};

#[test]
fn mock_passes_the_backend_conformance_suite() {
    let r = backend_suite::run(&MockHarness, &shared_dir()).expect("the mock is always present");
    assert!(r.failed.is_empty(), "{:#?}", r.failed);
    assert!(
        r.skipped.is_empty(),
        "every scenario applies to the mock: {:?}",
        r.skipped
    );
    assert_eq!(r.passed.len(), 5 + 33);
    backend_suite::run_and_report(&MockHarness, &shared_dir());
}
