//! The compact policy (`policy:compact`) beyond the fuzz targets: every
//! conformance scenario run under it (its expectations are PyTorch's, so
//! they are not checked; the invariants after every op and a clean teardown
//! are), cross-stream reuse and what the device sees of it, the provided
//! `stream_wait_event` of a backend without one, and the refusals.

use cachealloc_core::testing::TinyBackend;
use cachealloc_core::{BlockSlot, Config, DeviceAllocator, Error, Policy};
use cachealloc_mock::MockDevice;
use cachealloc_tests::harness::MockHarness;
use cachealloc_tests::{allocator, bundled_testdata, scenario, teardown};

use crate::expandable::NoVirtualMemory;

const MIB: u64 = 1 << 20;

/// `conf` with the compact policy added.
pub fn with_compact(conf: &str) -> String {
    if conf.is_empty() {
        "policy:compact".to_string()
    } else {
        format!("{conf},policy:compact")
    }
}

/// Scenario `sc` under the compact policy: its setup and every `config`
/// step gain `policy:compact`, its expectations go.
pub fn compact_scenario(sc: &scenario::Scenario) -> scenario::Scenario {
    let steps = sc
        .steps
        .iter()
        .filter(|s| !matches!(s, scenario::Step::Expect(_)))
        .map(|s| match s {
            scenario::Step::Config(c) => scenario::Step::Config(with_compact(c)),
            s => s.clone(),
        })
        .collect();
    scenario::Scenario {
        name: format!("{} (policy:compact)", sc.name),
        capacity: sc.capacity,
        conf: with_compact(&sc.conf),
        torch: sc.torch.clone(),
        steps,
    }
}

/// Every scenario of every suite, under the compact policy.
pub fn compact_scenarios() -> Vec<scenario::Scenario> {
    let mut out = Vec::new();
    for suite in ["scenarios", "pools", "expandable"] {
        for v in scenario::load_suite(&bundled_testdata(), suite).unwrap() {
            out.push(compact_scenario(&scenario::parse(&v).unwrap()));
        }
    }
    out
}

/// Every conformance scenario runs under the compact policy with the
/// invariants holding after every op and nothing left at teardown. The only
/// errors allowed are out-of-memory ones (the scenarios that expect one) and
/// refusals of what the policy does not do (a checkpoint of its pools).
#[test]
fn every_scenario_runs_under_the_compact_policy() {
    let mut ran = 0;
    let mut ooms = 0;
    let mut refusals = 0;
    let mut fits = 0;
    for sc in compact_scenarios() {
        let mut r = scenario::Run::new(&MockHarness, &sc, 4096).unwrap();
        for (n, step) in sc.steps.iter().enumerate() {
            let res = r.step(step);
            match res {
                Ok(()) => {}
                Err(e) if r.last_oom.as_deref() == Some(e.as_str()) => {
                    assert!(
                        matches!(step, scenario::Step::Alloc { must_oom: true, .. }),
                        "{}: op {n} {step:?}: an OOM where PyTorch's policy has none: {e}",
                        sc.name
                    );
                    ooms += 1;
                }
                Err(e) if e.contains("not supported") => refusals += 1,
                // The policy needs less memory: some expected OOMs do not come.
                Err(e) if e.contains("expected out of memory") => fits += 1,
                Err(e) => panic!("{}: op {n} {step:?}: {e}", sc.name),
            }
            if let Err(v) = r.alloc.check_invariants() {
                panic!("{}: op {n} {step:?}: {v}", sc.name);
            }
        }
        r.release_all()
            .unwrap_or_else(|e| panic!("{}: release: {e}", sc.name));
        ran += 1;
    }
    println!(
        "{ran} scenarios under policy:compact: {ooms} expected OOMs, {fits} expected OOMs \
         that fit, {refusals} refusals"
    );
    assert!(ran >= 50, "only {ran} scenarios");
}

/// A block freed on one stream serves a request on another: the request's
/// stream waits on the device for an event recorded on the first (no host
/// wait, no new memory), and the block then belongs to the new stream.
#[test]
fn a_block_freed_on_one_stream_serves_another_after_a_device_side_wait() {
    let mut a = allocator(None, Config::parse("policy:compact").unwrap(), 256);
    let x = a.malloc(64 * MIB, 1).unwrap();
    a.free_ptr(x.ptr).unwrap();
    let reserved = a.stats().reserved_bytes.all().current;
    let syncs = a.backend().counters().event_synchronize;
    let y = a.malloc(64 * MIB, 2).unwrap();
    assert_eq!(y.ptr, x.ptr, "the freed block is reused");
    assert_eq!(a.stats().reserved_bytes.all().current, reserved);
    assert_eq!(a.stream_handovers(), 1);
    assert_eq!(a.backend().stream_waits(), &[(2, 1)]);
    assert_eq!(
        a.backend().counters().event_synchronize,
        syncs,
        "no host wait"
    );
    assert_eq!(a.allocation_info_ptr(y.ptr).unwrap().stream, 2);
    a.check_invariants().unwrap();
    // PyTorch's policy takes new memory instead.
    let mut p = allocator(None, Config::parse("").unwrap(), 256);
    let x = p.malloc(64 * MIB, 1).unwrap();
    p.free_ptr(x.ptr).unwrap();
    let z = p.malloc(64 * MIB, 2).unwrap();
    assert_ne!(z.ptr, x.ptr);
    assert_eq!(p.backend().stream_waits(), &[]);
    teardown(&mut a, [y.ptr]).unwrap();
}

/// A runtime that takes a fresh stream every step: under the compact policy
/// the cache stays one step's working set; under PyTorch's it grows every
/// step.
#[test]
fn fresh_streams_do_not_grow_the_cache() {
    let steps = 30u64;
    let run = |conf: &str| {
        let mut a = allocator(None, Config::parse(conf).unwrap(), 1024);
        for s in 1..=steps {
            let xs: Vec<_> = [96 * MIB, 8 * MIB, 3 * MIB, 512 << 10, 40 * MIB]
                .iter()
                .map(|&n| a.malloc(n, s).unwrap())
                .collect();
            for x in xs {
                a.free_ptr(x.ptr).unwrap();
            }
            a.check_invariants().unwrap();
        }
        let peak = a.stats().reserved_bytes.all().peak;
        teardown(&mut a, []).unwrap();
        peak
    };
    let step = 96 * MIB + 8 * MIB + 4 * MIB + 2 * MIB + 40 * MIB;
    let compact = run("policy:compact");
    let pytorch = run("");
    assert!(
        compact <= (step + step / 10) as i64,
        "compact reserved {compact}"
    );
    assert!(
        pytorch >= (steps * step) as i64,
        "pytorch reserved {pytorch}"
    );
}

/// A backend that does not implement `stream_wait_event` gets the provided
/// one, a host wait for the event: still correct.
#[test]
fn a_backend_without_device_side_waits_gets_a_host_wait() {
    let mut a: DeviceAllocator<TinyBackend, Box<[BlockSlot]>, 16> = DeviceAllocator::with_events(
        TinyBackend::new(),
        vec![BlockSlot::VACANT; 64].into_boxed_slice(),
        Config::parse("policy:compact").unwrap(),
    );
    let x = a.malloc(8 * MIB, 1).unwrap();
    a.free_ptr(x.ptr).unwrap();
    let y = a.malloc(8 * MIB, 2).unwrap();
    assert_eq!(y.ptr, x.ptr);
    assert_eq!(a.stream_handovers(), 1);
    a.free_ptr(y.ptr).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.release_all().unwrap(), 0);
    assert_eq!(a.backend().held, 0);
    assert_eq!(a.backend().reservations, 0);
}

/// Without virtual memory the policy is refused with a message naming it
/// and the backend; a settings string that does not mention the policy
/// keeps it.
#[test]
fn the_policy_needs_virtual_memory_and_stays_in_force() {
    let mut a = DeviceAllocator::new(
        NoVirtualMemory(MockDevice::new(None)),
        vec![BlockSlot::VACANT; 64].into_boxed_slice(),
        Config::parse("policy:compact").unwrap(),
    );
    let e = a.malloc(MIB, 0).unwrap_err();
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("policy:compact") && msg.contains("a device without virtual memory"),
        "{msg}"
    );
    a.check_invariants().unwrap();

    let mut a = allocator(None, Config::parse("policy:compact").unwrap(), 64);
    a.set_config(Config::parse("max_split_size_mb:64").unwrap());
    assert_eq!(a.config().policy, Policy::Compact);
    a.set_config(Config::parse("policy:pytorch").unwrap());
    assert_eq!(a.config().policy, Policy::PyTorch);
}
