//! Every PyTorch-parity scenario of `../shared/conformance/` (the JSON file
//! and the extra blocks of the Markdown file), every op and expected key.

use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{scenario, shared_dir};

#[test]
fn all_conformance_scenarios_pass() {
    let all = scenario::load_all(&shared_dir()).expect("load scenarios");
    assert_eq!(
        all.len(),
        33,
        "scenarios.json plus the Markdown-only blocks"
    );
    let mut failures = Vec::new();
    for v in &all {
        let sc = scenario::parse(v).expect("parse scenario");
        let fails = scenario::run(&MockHarness, &sc);
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
