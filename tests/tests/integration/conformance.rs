//! Every PyTorch-parity scenario of the test data's `conformance/` (the JSON
//! file and the extra blocks of the Markdown file), every op and expected
//! key. `CACHEALLOC_TESTDATA=DIR` runs the scenarios of `DIR/conformance/`.

use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{scenario, testdata_dir};

#[test]
fn all_conformance_scenarios_pass() {
    let data = testdata_dir();
    let all = scenario::load_all(&data).expect("load scenarios");
    let names = scenario::names_in_files(&data);
    assert!(!all.is_empty(), "no scenarios in {}", data.display());
    assert_eq!(
        all.len(),
        names.len(),
        "the loader found {} scenarios, the files name {}: {names:?}",
        all.len(),
        names.len()
    );
    let mut failures = Vec::new();
    for v in &all {
        let sc = scenario::parse(v).expect("parse scenario");
        let fails = scenario::run_every_version(&MockHarness, &sc);
        println!(
            "{} {}",
            if fails.is_empty() { "ok  " } else { "FAIL" },
            sc.name
        );
        for f in &fails {
            println!("      {f}");
        }
        if !fails.is_empty() {
            failures.push(sc.name.clone());
        }
    }
    println!(
        "conformance: {} scenarios from {}, {} failed",
        all.len(),
        data.join("conformance").display(),
        failures.len()
    );
    assert!(failures.is_empty(), "failed scenarios: {failures:?}");
}

/// The runner must notice a wrong number, a wrong placement and a wrong
/// message (a runner that cannot fail proves nothing).
#[test]
fn runner_reports_every_kind_of_mismatch() {
    let v = serde_json::json!({
        "scenario": "deliberately wrong",
        "setup": {"capacity": 20971520},
        "ops": [["alloc", "a", 19922944], ["alloc_oom", "b", 1],
                ["expect", {"allocated_bytes.all.current": 1, "at:a": [0, 512, 20971520],
                            "oom_message_contains": "Tried to allocate 3.00 MiB",
                            "no_such_key.all.current": 0}]]
    });
    let fails = scenario::run(&MockHarness, &scenario::parse(&v).unwrap());
    assert_eq!(fails.len(), 4, "{fails:#?}");
}

/// A folder with only some scenarios (here: two, in a JSON file only) runs
/// exactly those; one with neither file is an error.
#[test]
fn a_folder_of_some_scenarios_loads_exactly_those() {
    let all = scenario::load_all(&cachealloc_tests::bundled_testdata()).unwrap();
    let dir = std::env::temp_dir().join(format!("cachealloc-some-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("conformance")).unwrap();
    let some = serde_json::Value::Array(all[..2].to_vec());
    std::fs::write(
        dir.join("conformance/scenarios.json"),
        serde_json::to_string_pretty(&some).unwrap(),
    )
    .unwrap();
    let loaded = scenario::load_all(&dir).unwrap();
    assert_eq!(loaded, all[..2].to_vec());
    assert_eq!(scenario::names_in_files(&dir).len(), 2);
    std::fs::remove_file(dir.join("conformance/scenarios.json")).unwrap();
    assert!(scenario::load_all(&dir).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every private-pool scenario of the test data's `conformance/pools.json`
/// and `pools.md` (CUDA-graph capture, `MemPool`, `use_on_oom`, `no_split`;
/// the count comes from the files). A `CACHEALLOC_TESTDATA` folder without
/// pool scenarios skips.
#[test]
fn all_pool_scenarios_pass() {
    run_suite("pools");
}

/// Every expandable-segment scenario of `conformance/expandable.json` and
/// `expandable.md` (`expandable_segments:True`). A `CACHEALLOC_TESTDATA`
/// folder without them skips.
#[test]
fn all_expandable_scenarios_pass() {
    run_suite("expandable");
}

/// The scenarios that tell torch releases apart (`conformance/versions.md`:
/// the block order of 2.11, 2.12 and 2.13 on, the rejection policy,
/// `large_segment_size_mb`), each under the releases it names.
#[test]
fn all_version_scenarios_pass() {
    run_suite("versions");
}

/// Several pools in one CUDA graph (`conformance/graph-pools.md`): torch
/// 2.14's retained side pools against earlier releases' calls.
#[test]
fn all_graph_pool_scenarios_pass() {
    run_suite("graph-pools");
}

/// Allocation at an address (`conformance/at-address.md`): torch 2.13's
/// `mallocWithAddress`.
#[test]
fn all_at_address_scenarios_pass() {
    run_suite("at-address");
}

/// Run every scenario of one optional suite on the mock.
fn run_suite(suite: &str) {
    let data = testdata_dir();
    let all = match scenario::load_suite(&data, suite) {
        Ok(all) => all,
        Err(e) if cachealloc_tests::testdata_overridden() => {
            println!("skipped: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let names = scenario::names_in_suite(&data, suite);
    assert!(
        !all.is_empty(),
        "no {suite} scenarios in {}",
        data.display()
    );
    assert_eq!(all.len(), names.len(), "loader vs files: {names:?}");
    let mut failures = Vec::new();
    for v in &all {
        let sc = scenario::parse(v).expect("parse scenario");
        let fails = scenario::run_every_version(&MockHarness, &sc);
        println!(
            "{} {}",
            if fails.is_empty() { "ok  " } else { "FAIL" },
            sc.name
        );
        for f in &fails {
            println!("      {f}");
        }
        if !fails.is_empty() {
            failures.push(sc.name.clone());
        }
    }
    println!(
        "{suite}: {} scenarios from {}, {} failed",
        all.len(),
        data.join("conformance").display(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "failed {suite} scenarios: {failures:?}"
    );
}
