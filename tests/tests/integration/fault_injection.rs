//! A backend failure at every call index of several scenarios (and of a few
//! generated multi-stream sequences): the operation that made the failing
//! call returns an error, the invariants hold after every op, and after
//! freeing everything and `empty_cache` the mock holds 0 bytes and 0 events.

use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{bundled_testdata, ops, scenario, teardown, AsMock};

const SCENARIOS: &[&str] = &[
    "S04 1 MiB is small; 2 MiB segments",
    "S08 split and merge accounting",
    "S12 record_stream deferral",
    "S15 empty_cache completes pending frees",
    "S19 release one oversize block",
    "S22 OOM retry succeeds",
    "S23 OOM",
    "S24 memory fraction",
    "S27 garbage collection single pass",
    "S31e clone chain 10 MiB + 512",
];

fn run_with_fault(sc: &scenario::Scenario, fail_at: Option<u64>) -> Result<(u64, bool), String> {
    let mut r = scenario::Run::new(&MockHarness, sc, 4096)?;
    if let Some(i) = fail_at {
        r.alloc.backend_mut().mock_mut().fail_call(i);
    }
    let mut fired = false;
    for (n, step) in sc.steps.iter().enumerate() {
        let before = r.alloc.backend().mock().counters().total;
        let res = r.step(step);
        let after = r.alloc.backend().mock().counters().total;
        if let Some(i) = fail_at {
            if (before..after).contains(&i) {
                fired = true;
                if res.is_ok() {
                    return Err(format!(
                        "op {n} {step:?}: call {i} failed but the op reported success"
                    ));
                }
            }
        }
        r.alloc
            .check_invariants()
            .map_err(|v| format!("op {n} {step:?} (fault at {fail_at:?}): {v}"))?;
    }
    let total = r.alloc.backend().mock().counters().total;
    r.end_pools()?;
    let live = r.live();

    teardown(&mut r.alloc, live).map_err(|e| format!("fault at {fail_at:?}: {e}"))?;
    Ok((total, fired))
}

/// The same for every private-pool scenario.
#[test]
fn every_backend_call_of_every_pool_scenario_can_fail_cleanly() {
    every_call_of_a_suite_can_fail_cleanly("pools");
}

/// The same for every expandable-segment scenario (reservations, maps,
/// unmaps, stream synchronizations and device queries fail too).
#[test]
fn every_backend_call_of_every_expandable_scenario_can_fail_cleanly() {
    every_call_of_a_suite_can_fail_cleanly("expandable");
}

/// The same for every scenario of every suite under the compact policy
/// (hand-overs' event records and device-side waits, reclaim's unmaps and
/// the stream synchronizations before them fail too).
#[test]
fn every_backend_call_of_every_scenario_under_the_compact_policy_can_fail_cleanly() {
    let all = crate::compact::compact_scenarios();
    let mut checked = 0;
    for sc in &all {
        let (calls, _) = run_with_fault(sc, None).unwrap();
        for i in 0..calls {
            let (_, fired) =
                run_with_fault(sc, Some(i)).unwrap_or_else(|e| panic!("{}: {e}", sc.name));
            assert!(
                fired,
                "{}: the failure planted at call {i} never fired",
                sc.name
            );
            checked += 1;
        }
    }
    println!(
        "{checked} injected failures over {} scenarios under policy:compact",
        all.len()
    );
}

/// A failure at every call index of every scenario of one suite.
fn every_call_of_a_suite_can_fail_cleanly(suite: &str) {
    let all = scenario::load_suite(&bundled_testdata(), suite).unwrap();
    let mut checked = 0;
    for v in &all {
        let sc = scenario::parse(v).unwrap();
        let (calls, _) = run_with_fault(&sc, None).unwrap();
        for i in 0..calls {
            let (_, fired) =
                run_with_fault(&sc, Some(i)).unwrap_or_else(|e| panic!("{}: {e}", sc.name));
            assert!(
                fired,
                "{}: the failure planted at call {i} never fired",
                sc.name
            );
            checked += 1;
        }
    }
    println!(
        "{checked} injected failures over {} {suite} scenarios",
        all.len()
    );
}

#[test]
fn every_backend_call_of_five_plus_scenarios_can_fail_cleanly() {
    // Named scenarios, so always from the bundled data.
    let all = scenario::load_all(&bundled_testdata()).unwrap();
    let mut checked = 0;
    for name in SCENARIOS {
        let v = all
            .iter()
            .find(|v| v["scenario"] == *name)
            .unwrap_or_else(|| panic!("scenario {name}"));
        let sc = scenario::parse(v).unwrap();
        let (calls, _) = run_with_fault(&sc, None).unwrap();
        assert!(calls > 0, "{name}: no backend calls");
        for i in 0..calls {
            let (_, fired) = run_with_fault(&sc, Some(i)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(fired, "{name}: the failure planted at call {i} never fired");
            checked += 1;
        }
    }
    println!(
        "{checked} injected failures over {} scenarios",
        SCENARIOS.len()
    );
}

/// The same on generated multi-stream sequences with record_stream, syncs and
/// a capacity, with their config and under the compact policy: every call
/// index (up to 400 per case).
#[test]
fn every_backend_call_of_generated_sequences_can_fail_cleanly() {
    let mut cases = 0;
    let mut injected = 0;
    let mut seed = 1u64;
    while cases < 4 {
        seed += 1;
        let c = ops::generate(seed);
        if c.capacity.is_none()
            || !c
                .ops
                .iter()
                .any(|o| matches!(o, ops::Op::RecordStream { .. }))
        {
            continue;
        }
        cases += 1;
        for conf in [c.conf.clone(), crate::compact::with_compact(&c.conf)] {
            let c = ops::Case { conf, ..c.clone() };
            let setup_calls = c.memory_fraction.is_some() as u64;
            let calls = (ops::replay(&c).unwrap().alloc().backend().counters().total - setup_calls)
                .min(400);
            for i in 0..calls {
                let mut a = cachealloc_tests::allocator(
                    c.capacity,
                    cachealloc_core::Config::parse(&c.conf).unwrap(),
                    1 << 12,
                );
                if let Some(f) = c.memory_fraction {
                    a.set_memory_fraction(f).unwrap();
                }
                let abs = a.backend().counters().total + i;
                a.backend_mut().fail_call(i);
                let mut live = std::collections::HashMap::new();
                let mut orphans = Vec::new();
                let mut fired = false;
                for op in &c.ops {
                    let before = a.backend().counters().total;
                    let ok = match *op {
                        ops::Op::Alloc {
                            id, size, stream, ..
                        } => match a.malloc(size, stream) {
                            Ok(x) => {
                                // A free that failed leaves its id live; the trace may reuse it.
                                if let Some(old) = live.insert(id, x.ptr) {
                                    orphans.push(old);
                                }
                                true
                            }
                            Err(_) => false,
                        },
                        ops::Op::Free { id } => match live.get(&id) {
                            Some(&p) => a.free_ptr(p).map(|_| live.remove(&id)).is_ok(),
                            None => true,
                        },
                        ops::Op::RecordStream { id, stream } => live
                            .get(&id)
                            .is_none_or(|&p| a.record_stream_ptr(p, stream).is_ok()),
                        ops::Op::Sync { stream } => {
                            a.backend_mut().sync(stream);
                            true
                        }
                        ops::Op::EmptyCache => a.empty_cache().is_ok(),
                        // Generated cases make no pool ops (the pool scenarios
                        // are injected above).
                        _ => true,
                    };
                    if (before..a.backend().counters().total).contains(&abs) {
                        fired = true;
                        assert!(
                            !ok,
                            "seed {seed}: call {i} failed inside {op:?}, which reported success"
                        );
                    }
                    a.check_invariants()
                        .unwrap_or_else(|v| panic!("seed {seed}, fault at {i}, after {op:?}: {v}"));
                }
                assert!(fired, "seed {seed}: fault at {i} never fired");
                injected += 1;
                teardown(&mut a, live.into_values().chain(orphans))
                    .unwrap_or_else(|e| panic!("seed {seed}, fault at {i}: {e}"));
            }
        }
    }
    println!(
        "{injected} injected failures over {cases} generated sequences, each with its \
         config and with policy:compact added"
    );
}
