//! The backend conformance suite on the simulated device, its captures
//! modelled (CUDA and HIP run the same suite on their stub drivers, and on
//! a device when asked).

use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{backend_suite, scenario, testdata_dir};

#[test]
fn mock_passes_the_backend_conformance_suite() {
    let data = testdata_dir();
    let r = backend_suite::run(&MockHarness, &data).expect("the mock is always present");
    assert!(r.failed.is_empty(), "{:#?}", r.failed);
    assert!(
        r.skipped.is_empty() && r.need_placement.is_empty(),
        "every scenario applies to the mock: {:?} {:?}",
        r.skipped,
        r.need_placement
    );
    let scenarios = scenario::load_all(&data).unwrap().len()
        + scenario::load_suite(&data, "expandable").map_or(0, |v| v.len())
        + scenario::load_suite(&data, "pools").map_or(0, |v| v.len())
        + scenario::load_suite(&data, "versions").map_or(0, |v| v.len());
    let checks = backend_suite::device_checks::<MockHarness>().len();
    assert_eq!(r.passed.len(), checks + scenarios);
    backend_suite::run_and_report(&MockHarness, &data);
}
