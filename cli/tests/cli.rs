//! The `cachealloc` binary end to end: parity with the reference model, every
//! bad-input rule of the trace format, OOM under a capacity, `check`, `plot`.

use cachealloc_tests::{bundled_testdata, oracle};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cachealloc"))
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run cachealloc")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cachealloc-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

/// `replay --json` equals `pytorch_sim.py` on every memory_stats key, for the
/// smaller bundled traces (the largest is checked by the real-trace test).
#[test]
fn replay_json_matches_the_reference_model() {
    let data = bundled_testdata();
    let traces: Vec<PathBuf> = ["resnet50-train", "bert-mlm-train", "gpt2-train"]
        .iter()
        .map(|n| data.join("traces").join(format!("{n}.jsonl.gz")))
        .collect();
    let cases: Vec<(PathBuf, &str, Option<u64>)> = traces
        .iter()
        .flat_map(|t| {
            [
                (t.clone(), "", None),
                (t.clone(), "max_split_size_mb:200", Some(3u64 << 30)),
            ]
        })
        .collect();
    let dir = scratch("parity");
    let jobs: Vec<oracle::Job> = cases
        .iter()
        .map(|(t, c, cap)| oracle::Job {
            path: t.clone(),
            conf: c.to_string(),
            capacity: *cap,
            memory_fraction: None,
        })
        .collect();
    let model = oracle::run_batch(&data, &jobs, &dir).unwrap();
    for ((t, conf, cap), m) in cases.iter().zip(model) {
        let mut args = vec!["replay", "--json", "--conf", conf];
        let cap_s = cap.map(|c| c.to_string());
        if let Some(c) = &cap_s {
            args.extend(["--capacity", c]);
        }
        args.push(t.to_str().unwrap());
        let out = run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "no progress bar when stderr is not a terminal"
        );
        let v = &json_lines(&out)[0];
        let ours = v["memory_stats"].as_object().unwrap();
        let d = oracle::diff(ours, &m.unwrap());
        assert!(d.is_empty(), "{} {conf:?} {cap:?}: {d:#?}", t.display());
        for key in [
            "trace",
            "events",
            "allocs",
            "ooms",
            "peak_live_bytes",
            "peak_reserved_bytes",
            "fragmentation",
            "replay_seconds",
            "parse_seconds",
            "total_seconds",
            "events_per_second",
            "end_to_end_events_per_second",
        ] {
            assert!(!v[key].is_null(), "missing {key}");
        }
        assert_eq!(v["peak_reserved_bytes"], ours["reserved_bytes.all.peak"]);
    }
}

/// Under a small capacity allocations fail, are counted, and their frees are
/// skipped; the run still succeeds.
#[test]
fn ooms_under_a_capacity_are_counted_and_their_frees_skipped() {
    let t = bundled_testdata().join("traces/resnet50-train.jsonl.gz");
    let out = run(&[
        "replay",
        "--json",
        "--capacity",
        "1GiB",
        t.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = &json_lines(&out)[0];
    assert!(v["ooms"].as_u64().unwrap() > 0);
    assert_eq!(v["ooms"], v["memory_stats"]["num_ooms"]);
    // Each out-of-memory has a verdict; the first one's figures.
    let by_class = v["ooms_by_class"].as_object().unwrap();
    assert_eq!(by_class.len(), cachealloc_core::OomClass::COUNT);
    let total: u64 = by_class.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(total, v["ooms"].as_u64().unwrap());
    let first = &v["first_oom"];
    let class = first["class"].as_str().unwrap();
    assert!(by_class[class].as_u64().unwrap() > 0, "{first}");
    assert_eq!(first["limit"], 1u64 << 30);
    assert!(first["line"].as_u64().unwrap() > 1);
    let message = first["message"].as_str().unwrap();
    assert!(message.starts_with("CUDA out of memory."), "{message}");
    assert!(
        message.contains(&format!("cachealloc: {class}: ")),
        "{message}"
    );
    // Where the reserved memory is after the last event: the pools add up.
    let f = &v["fragmentation_at_end"][0];
    let total = f["total"]["reserved_bytes"].as_u64().unwrap();
    let pools: u64 = ["small_pool", "large_pool", "private_pools"]
        .iter()
        .map(|p| f[p]["reserved_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(total, pools);
    assert_eq!(
        total,
        v["memory_stats"]["reserved_bytes.all.current"]
            .as_u64()
            .unwrap()
    );
    // The text report names it too.
    let text = run(&["replay", "--capacity", "1GiB", t.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("first OOM"), "{text}");
}

struct Bad {
    name: &'static str,
    text: String,
    line: u64,
    reason: &'static str,
}

fn header() -> &'static str {
    r#"{"format":"cachealloc-trace","version":1,"source":"test","device_capacity":null}"#
}

fn bad_traces() -> Vec<Bad> {
    let h = header();
    let b = |name, body: &str, line, reason| Bad {
        name,
        text: format!("{h}\n{body}\n"),
        line,
        reason,
    };
    vec![
        b("invalid-json", r#"{"op":"alloc","id":1,"size":5"#, 2, "invalid JSON"),
        Bad { name: "missing-header", text: "{\"op\":\"alloc\",\"id\":1,\"size\":5}\n".into(), line: 1, reason: "missing header" },
        Bad { name: "empty", text: "\n\n".into(), line: 0, reason: "missing header" },
        Bad {
            name: "unknown-format",
            text: "{\"format\":\"other-trace\",\"version\":1}\n".into(),
            line: 1,
            reason: "unknown format",
        },
        Bad {
            name: "bad-version",
            text: "{\"format\":\"cachealloc-trace\",\"version\":3}\n".into(),
            line: 1,
            reason: "unsupported version",
        },
        b("alloc-live", "{\"op\":\"alloc\",\"id\":1,\"size\":5}\n\n{\"op\":\"alloc\",\"id\":1,\"size\":5}", 4, "already live"),
        b("free-not-live", r#"{"op":"free","id":7}"#, 2, "not live"),
        b("double-free", "{\"op\":\"alloc\",\"id\":1,\"size\":5}\n{\"op\":\"free\",\"id\":1}\n{\"op\":\"free\",\"id\":1}", 4, "not live"),
        b("record-not-live", r#"{"op":"record_stream","id":3,"stream":1}"#, 2, "not live"),
        b("negative-size", r#"{"op":"alloc","id":1,"size":-5}"#, 2, "`size` is negative"),
        b("fractional-size", r#"{"op":"alloc","id":1,"size":5.5}"#, 2, "`size` is not an integer"),
        b("string-id", r#"{"op":"alloc","id":"a","size":5}"#, 2, "`id` is a string"),
        b("negative-id", r#"{"op":"free","id":-1}"#, 2, "`id` is negative"),
        b("missing-size", r#"{"op":"alloc","id":1}"#, 2, "missing `size`"),
        b("unknown-op", r#"{"op":"teleport","id":1}"#, 2, "unknown op"),
        b("not-an-object", "[1,2,3]", 2, "not an event object"),
    ]
}

/// Every bad-input rule: exit status 2 and `FILE:LINE: reason` on stderr,
/// for `replay`, `check` and `compare`; the same text from a gzip file.
#[test]
fn malformed_traces_give_file_line_and_exit_2() {
    let dir = scratch("bad");
    for bad in bad_traces() {
        for gz in [false, true] {
            let path = dir.join(format!("{}.jsonl{}", bad.name, if gz { ".gz" } else { "" }));
            if gz {
                let mut e = flate2::write::GzEncoder::new(
                    std::fs::File::create(&path).unwrap(),
                    flate2::Compression::fast(),
                );
                e.write_all(bad.text.as_bytes()).unwrap();
                e.finish().unwrap();
            } else {
                std::fs::write(&path, &bad.text).unwrap();
            }
            let p = path.to_str().unwrap();
            let want = if bad.line == 0 {
                format!("{p}: ")
            } else {
                format!("{p}:{}: ", bad.line)
            };
            for args in [
                vec!["replay", p],
                vec!["check", p],
                vec!["compare", "--conf", "", p],
            ] {
                let out = run(&args);
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
                assert!(
                    err.starts_with(&want) && err.contains(bad.reason),
                    "{args:?}: expected {want}... {}, got {err}",
                    bad.reason
                );
                assert!(!err.contains("panicked"), "{err}");
            }
        }
    }
}

#[test]
fn missing_files_bad_gzip_and_bad_conf_exit_2() {
    let dir = scratch("files");
    let missing = dir.join("nope.jsonl");
    let out = run(&["replay", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
    let notgz = dir.join("plain.jsonl.gz");
    std::fs::write(&notgz, format!("{}\n", header())).unwrap();
    let out = run(&["replay", notgz.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("{}:", notgz.display())) && err.contains("cannot read"),
        "{err}"
    );
    let good = bundled_testdata().join("traces/gpt2-train.jsonl.gz");
    let out = run(&[
        "replay",
        "--conf",
        "max_split_size_mb:3",
        good.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_split_size_mb"));
    let out = run(&["replay", "--capacity", "12 parsecs", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

/// A gzip trace cut short: `FILE:LINE: cannot read: truncated or corrupt
/// gzip file (DETAIL)`, the line the reader had reached, exit 2, from
/// every subcommand that reads traces.
#[test]
fn a_truncated_gzip_trace_says_so() {
    let dir = scratch("truncated");
    let whole = std::fs::read(bundled_testdata().join("traces/resnet50-train.jsonl.gz")).unwrap();
    let cut = dir.join("resnet50-cut.jsonl.gz");
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    let p = cut.to_str().unwrap();
    for args in [
        vec!["replay", p],
        vec!["check", p],
        vec!["compare", "--conf", "", p],
        vec!["advise", "-q", p],
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let rest = err
            .strip_prefix(&format!("{p}:"))
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        let (line, why) = rest.split_once(": ").unwrap();
        assert!(line.parse::<u64>().is_ok_and(|l| l > 1), "{args:?}: {err}");
        assert!(
            why.starts_with("cannot read: truncated or corrupt gzip file (")
                && why.trim_end().ends_with(')'),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A misspelt `--conf` key is the option's fault, named as such with the
/// key it is likely a misspelling of, by every subcommand that takes one
/// (`advise` too: it does not blame the trace).
#[test]
fn a_misspelt_conf_names_the_option_and_suggests_the_key() {
    let t = bundled_testdata().join("traces/resnet50-train.jsonl.gz");
    let t = t.to_str().unwrap();
    let dir = scratch("misspelt");
    let svg = dir.join("x.svg");
    let svg = svg.to_str().unwrap();
    let bad = "expandable_segment:True";
    for args in [
        vec!["replay", "--conf", bad, t],
        vec!["compare", "--conf", "", "--conf", bad, t],
        vec!["plot", "--conf", bad, "-o", svg, t],
        vec!["advise", "-q", "--conf", bad, t],
        vec!["advise", "-q", "--conf", bad, "--plot", svg, t],
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("--conf {bad:?}: "))
                && err.contains("option `expandable_segment`")
                && err.contains("unknown option")
                && err
                    .trim_end()
                    .ends_with("did you mean `expandable_segments`?"),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("recorded settings") && !err.contains(t),
            "{args:?}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn check_prints_statistics() {
    let t = bundled_testdata().join("traces/resnet50-train.jsonl.gz");
    let out = run(&["check", "--json", t.to_str().unwrap()]);
    assert!(out.status.success());
    let v = &json_lines(&out)[0];
    assert_eq!(v["events"], 21719);
    assert_eq!(v["allocs"], 11016);
    assert_eq!(v["peak_live_bytes"], 3099799600u64);
    assert_eq!(v["largest_alloc"], 102760448);
}

#[test]
fn compare_finds_the_minimum_capacity() {
    let t = bundled_testdata().join("traces/resnet50-train.jsonl.gz");
    let out = run(&[
        "compare",
        "--json",
        "--min-capacity",
        "--conf",
        "",
        "--conf",
        "max_split_size_mb:64",
        t.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for v in json_lines(&out) {
        let min = v["min_capacity"].as_u64().unwrap();
        assert_eq!(min % (2 << 20), 0);
        assert!(
            min >= v["peak_live_bytes"].as_u64().unwrap()
                && min <= v["peak_reserved_bytes"].as_u64().unwrap() + (2 << 20)
        );
        // At the minimum there is no OOM; 2 MiB less has one.
        let ok = run(&[
            "replay",
            "--json",
            "--conf",
            v["conf"].as_str().unwrap(),
            "--capacity",
            &min.to_string(),
            t.to_str().unwrap(),
        ]);
        assert_eq!(json_lines(&ok)[0]["ooms"], 0);
        let less = run(&[
            "replay",
            "--json",
            "--conf",
            v["conf"].as_str().unwrap(),
            "--capacity",
            &(min - (2 << 20)).to_string(),
            t.to_str().unwrap(),
        ]);
        assert!(json_lines(&less)[0]["ooms"].as_u64().unwrap() > 0);
    }
}

/// `plot` writes a well-formed SVG with both series and the segment map.
#[test]
fn plot_writes_a_well_formed_svg_with_both_series() {
    let t = bundled_testdata().join("traces/resnet50-train.jsonl.gz");
    let out_path = scratch("plot").join("resnet.svg");
    let out = run(&[
        "plot",
        t.to_str().unwrap(),
        "-o",
        out_path.to_str().unwrap(),
    ]);
    if out.status.code() == Some(1)
        && String::from_utf8_lossy(&out.stderr).contains("no TrueType font")
    {
        // A machine without fonts cannot lay out the chart; CI installs one
        // and sets CACHEALLOC_REQUIRE_FONT so this cannot pass unseen there.
        assert!(
            std::env::var_os("CACHEALLOC_REQUIRE_FONT").is_none(),
            "plot needs a font; install fonts-dejavu-core (.ci/run does)"
        );
        println!("skipped: no TrueType font on this machine (Debian: fonts-dejavu-core)");
        return;
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&out_path).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let texts: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|s| s.trim().to_string())
        .collect();
    assert!(
        texts.iter().any(|t| t.starts_with("live bytes")),
        "{texts:?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with("reserved bytes")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("segment map at the peak")),
        "{texts:?}"
    );
    let long_lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| {
            n.attribute("points")
                .is_some_and(|p| p.split_whitespace().count() > 100)
        })
        .count();
    assert!(long_lines >= 2, "two data series, found {long_lines}");
    let rects = doc.descendants().filter(|n| n.has_tag_name("rect")).count();
    assert!(rects > 100, "segment map blocks: {rects}");
}

/// `--version` names the version; `completions` prints a script per shell.
#[test]
fn version_and_completions() {
    let out = run(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("cachealloc {}", env!("CARGO_PKG_VERSION"))
    );
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef"),
        ("fish", "complete -c"),
    ] {
        let out = run(&["completions", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(marker) && text.contains("replay"),
            "{shell}: {text}"
        );
    }
    assert_eq!(run(&["completions", "cmd.exe"]).status.code(), Some(2));
}

/// `replay --snapshot`, `import` and `check --against` end to end: the
/// snapshot of a replay imports back to a trace that replays to the same
/// device mallocs and final blocks; `--snapshot-at peak` stops at the peak.
#[test]
fn snapshot_import_and_check_against() {
    let dir = scratch("snapshot");
    let trace = bundled_testdata().join("traces/gpt2-train.jsonl.gz");
    let (trace, snap, at_peak, imported) = (
        trace.to_str().unwrap(),
        dir.join("s.pickle"),
        dir.join("peak.json"),
        dir.join("imported.jsonl.gz"),
    );
    let (snap, at_peak, imported) = (
        snap.to_str().unwrap(),
        at_peak.to_str().unwrap(),
        imported.to_str().unwrap(),
    );
    let out = run(&["replay", "-q", "--snapshot", snap, trace]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&[
        "replay",
        "-q",
        "--json",
        "--snapshot",
        at_peak,
        "--snapshot-at",
        "peak",
        trace,
    ]);
    assert!(out.status.success(), "{out:?}");
    let report = &json_lines(&out)[0];
    let peak: serde_json::Value = serde_json::from_slice(&std::fs::read(at_peak).unwrap()).unwrap();
    let reserved: u64 = peak["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["total_size"].as_u64().unwrap())
        .sum();
    assert_eq!(reserved, report["peak_reserved_bytes"].as_u64().unwrap());

    let out = run(&["import", snap, "-o", imported]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cold start"));
    let out = run(&["check", "--against", snap, "--real-addresses", imported]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("equal, block for block"), "{text}");

    // Bad input: not a snapshot; a trace without recorded addresses.
    let out = run(&["import", trace, "-o", imported]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a PyTorch memory snapshot"));
    let out = run(&["replay", "--real-addresses", trace]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("records no malloc addresses"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A version 2 trace that captures a graph into a private pool: `replay
/// --json` lists the pool and its segments, the snapshot marks its
/// segments with the pool id; pool ops in a version 1 trace, and a broken
/// pool rule, are bad input.
#[test]
fn a_captured_graph_shows_its_pool() {
    let dir = scratch("pools");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    };
    let graph = write(
        "graph.jsonl",
        r#"{"format":"cachealloc-trace","version":2,"source":"one graph"}
{"op":"alloc","id":1,"size":4096,"stream":1}
{"op":"capture_begin","pool":[1,0],"streams":[1]}
{"op":"alloc","id":2,"size":1048577,"stream":1}
{"op":"alloc","id":3,"size":4096,"stream":1}
{"op":"capture_end","pool":[1,0]}
{"op":"alloc","id":4,"size":4096,"stream":1}
"#,
    );
    let out = run(&["replay", "--json", &graph]);
    assert!(out.status.success(), "{out:?}");
    let v = &json_lines(&out)[0];
    let pools = v["pools"].as_array().expect("pools in the report");
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0]["pool"], serde_json::json!([1, 0]));
    assert_eq!(pools[0]["segments"], 2);
    assert_eq!(pools[0]["reserved_bytes"], (20 << 20) + (2 << 20));
    let snap = dir.join("graph.json");
    let out = run(&["replay", "-q", "--snapshot", snap.to_str().unwrap(), &graph]);
    assert!(out.status.success(), "{out:?}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&snap).unwrap()).unwrap();
    let owners: Vec<(serde_json::Value, u64)> = s["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["segment_pool_id"].clone(),
                g["total_size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [
            (serde_json::json!([0, 0]), 2 << 20),
            (serde_json::json!([1, 0]), 20 << 20),
            (serde_json::json!([1, 0]), 2 << 20)
        ]
    );
    let v1 = write(
        "v1.jsonl",
        "{\"format\":\"cachealloc-trace\",\"version\":1}\n{\"op\":\"pool_release\",\"pool\":[0,1]}\n",
    );
    let unbegun = write(
        "unbegun.jsonl",
        "{\"format\":\"cachealloc-trace\",\"version\":2}\n{\"op\":\"capture_end\",\"pool\":[1,0]}\n",
    );
    for (t, why) in [
        (&v1, "need a version 2 trace"),
        (&unbegun, "not captured into"),
    ] {
        for cmd in ["replay", "check"] {
            let out = run(&[cmd, t]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {t}: {err}");
            assert!(
                err.contains(":2: ") && err.contains(why),
                "{cmd} {t}: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `replay --backend cuda|hip` (built with the `cuda` / `hip` features) on
/// the project's stub drivers, with expandable segments: the real
/// virtual-memory calls through the FFI give the same statistics as the
/// simulated device. (`cargo test -p cachealloc-cli --features cuda,hip`;
/// without the features there is nothing to run.)
#[test]
fn replay_on_the_stub_drivers_with_expandable_segments() {
    let trace = bundled_testdata().join("traces/gpt2-train.jsonl.gz");
    let trace = trace.to_str().unwrap();
    let args = |backend: &'static str| {
        vec![
            "replay",
            "--json",
            "-q",
            "--backend",
            backend,
            "--conf",
            "expandable_segments:True",
            trace,
        ]
    };
    let mock = json_lines(&run(&args("mock")));
    let mut kinds = Vec::new();
    if cfg!(feature = "cuda") {
        kinds.push(("cuda", cachealloc_tests::stub::StubKind::Cuda));
    }
    if cfg!(feature = "hip") {
        kinds.push(("hip", cachealloc_tests::stub::StubKind::Hip));
    }
    for (backend, kind) in kinds {
        let Some(dir) = kind.dir() else { return };
        let out = bin()
            .args(args(backend))
            .env("LD_LIBRARY_PATH", &dir)
            .output()
            .expect("run cachealloc");
        assert!(
            out.status.success(),
            "{backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let gpu = json_lines(&out);
        let stats = |v: &[serde_json::Value]| v[0]["memory_stats"].clone();
        assert_eq!(
            stats(&gpu),
            stats(&mock),
            "{backend} on its stub vs the mock"
        );
        assert!(gpu[0]["memory_stats"]["num_device_alloc"].as_i64().unwrap() > 100);
        println!("{backend} (stub): the statistics equal the simulated device's");
    }
}

/// `generate fresh-streams` writes a valid trace; `compare` with the three
/// policies prints one row each, with device calls and min capacity / live;
/// the compact policy reserves a fraction of what PyTorch's does there.
#[test]
fn compare_three_policies_on_a_fresh_stream_trace() {
    let t = scratch("generate").join("fresh-streams.jsonl.gz");
    let t = t.to_str().unwrap();
    let out = run(&[
        "generate",
        "fresh-streams",
        t,
        "--steps",
        "12",
        "--layers",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(run(&["check", t]).status.success());
    let confs = ["", "expandable_segments:True", "policy:compact"];
    let mut args = vec!["compare", "-q", "--min-capacity"];
    for c in &confs {
        args.extend(["--conf", c]);
    }
    args.push(t);
    let out = run(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("dev calls") && text.contains("min/live"),
        "{text}"
    );
    for c in ["(default)", "expandable_segments:True", "policy:compact"] {
        assert_eq!(text.lines().filter(|l| l.contains(c)).count(), 1, "{text}");
    }
    args[1] = "--json";
    let rows = json_lines(&run(&args));
    let resv = |i: usize| rows[i]["peak_reserved_bytes"].as_u64().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(
        resv(2) * 3 < resv(0),
        "compact {} vs default {}",
        resv(2),
        resv(0)
    );
    assert!(
        rows[2]["memory_stats"]["num_device_alloc"]
            .as_u64()
            .unwrap()
            > 0
    );
}

/// A trace with more live blocks than the replay's first storage has slots
/// replays anyway: the storage doubles as needed and the report says how
/// many slots were used. With `--slots` the storage is fixed, and running
/// out names the option.
#[test]
fn the_replay_grows_its_slots_unless_told_a_number() {
    let t = scratch("scale").join("scale.jsonl.gz");
    let t = t.to_str().unwrap();
    let out = run(&[
        "generate", "scale", "--blocks", "150000", "--order", "random", t,
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = run(&["replay", "--json", t]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = &json_lines(&out)[0];
    let used = v["slots_used"].as_u64().unwrap();
    assert!(used > 150_000, "{v}");
    assert!(v["slots_capacity"].as_u64().unwrap() >= used);
    assert_eq!(v["memory_stats"]["allocation.all.allocated"], 150_000);
    assert_eq!(v["memory_stats"]["allocation.all.current"], 0);

    let out = run(&["replay", "--slots", "1000", t]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("block metadata exhausted") && err.contains("--slots"),
        "{err}"
    );
}

/// `advise --capacity` at 95% of a trace's smallest device under the
/// default settings: it finds a setting that fits whenever `compare
/// --min-capacity` shows one of its settings fits there, and says "none"
/// otherwise; its JSON has the documented keys.
#[test]
fn advise_finds_a_setting_that_fits_when_compare_shows_one() {
    let data = bundled_testdata();
    for name in [
        "resnet50-train",
        "bert-mlm-train",
        "gpt2-train",
        "gpt2-generate",
    ] {
        let t = data.join("traces").join(format!("{name}.jsonl.gz"));
        let t = t.to_str().unwrap();
        let min_of = |confs: &[&str]| -> Vec<(String, u64)> {
            let mut args = vec!["compare", "--min-capacity", "--json", "-q"];
            for c in confs {
                args.extend(["--conf", c]);
            }
            args.push(t);
            let out = run(&args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            json_lines(&out)
                .iter()
                .map(|v| {
                    (
                        v["conf"].as_str().unwrap().to_string(),
                        v["min_capacity"].as_u64().unwrap(),
                    )
                })
                .collect()
        };
        let m = min_of(&[""])[0].1;
        let capacity = m - m / 20;
        let out = run(&["advise", "--json", "--capacity", &capacity.to_string(), t]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = &json_lines(&out)[0];
        for key in [
            "trace",
            "capacity",
            "recorded",
            "settings",
            "any_fits",
            "recommended",
            "summary",
        ] {
            assert!(v.get(key).is_some(), "{name}: no {key}");
        }
        let settings = v["settings"].as_array().unwrap();
        assert!(settings.len() >= 8, "{name}: {} settings", settings.len());
        // The settings compare can run (no memory fraction), and their
        // smallest devices.
        let confs: Vec<&str> = settings
            .iter()
            .filter(|s| s["memory_fraction"].is_null())
            .map(|s| s["conf"].as_str().unwrap())
            .collect();
        let mins = min_of(&confs);
        let exists = mins.iter().any(|(_, min)| *min <= capacity);
        let summary = v["summary"].as_str().unwrap();
        if exists {
            assert_eq!(
                v["any_fits"], true,
                "{name}: {mins:?} under {capacity}: {summary}"
            );
            let best = v["recommended"]["conf"].as_str().unwrap();
            let fits = settings.iter().find(|s| s["conf"] == best).unwrap();
            assert_eq!(fits["fits"], true, "{name}: {summary}");
            assert!(
                summary.starts_with("recommended: PYTORCH_CUDA_ALLOC_CONF="),
                "{summary}"
            );
        } else {
            assert_eq!(
                v["any_fits"], false,
                "{name}: {mins:?} under {capacity}: {summary}"
            );
            assert!(v["recommended"].is_null());
            assert!(summary.starts_with("none"), "{name}: {summary}");
        }
        println!("{name}: capacity {capacity}, a setting fits: {exists}; {summary}");
    }
}

/// `advise` takes a PyTorch snapshot too (imported on the fly, its own
/// settings the recorded ones), and draws the settings with `--plot`.
#[test]
fn advise_imports_a_snapshot_and_plots_the_settings() {
    let t = bundled_testdata().join("traces/gpt2-generate.jsonl.gz");
    let dir = scratch("advise");
    let snap = dir.join("gpt2-generate.pickle");
    let out = run(&[
        "replay",
        "--conf",
        "roundup_power2_divisions:4",
        "--snapshot",
        snap.to_str().unwrap(),
        t.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = dir.join("advice.svg");
    let out = run(&[
        "advise",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
        snap.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let no_font = out.status.code() == Some(1) && stderr.contains("no TrueType font");
    assert!(out.status.success() || no_font, "{stderr}");
    let v = &json_lines(&out)[0];
    assert_eq!(v["recorded"]["conf"], "roundup_power2_divisions:4");
    assert!(v["settings"].as_array().unwrap().len() >= 8);
    if !no_font {
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(
            text.starts_with("<svg") && text.contains("peak reserved bytes by allocator setting")
        );
    }
    // A trace that is neither: a clear error, exit 2.
    let bad = dir.join("not-a-snapshot.pickle");
    std::fs::write(&bad, b"not a pickle").unwrap();
    let out = run(&["advise", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("importing the snapshot"));
    std::fs::remove_dir_all(&dir).ok();
}

/// An RMM log written by hand in RMM's format imports, replays, and is
/// advised on; a malformed one names its line.
#[test]
fn an_rmm_log_imports_and_replays() {
    let log = bundled_testdata().join("rmm/hand-written.csv");
    let dir = scratch("rmm");
    let trace = dir.join("rmm.jsonl.gz");
    let out = run(&[
        "import",
        log.to_str().unwrap(),
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["replay", "--json", trace.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = &json_lines(&out)[0];
    assert_eq!(v["allocs"], 27);
    assert_eq!(v["ooms"], 0);
    // 6 weights, then 6 activations and a copy buffer live at the peak.
    let mib = 1u64 << 20;
    let weights = 64 * mib + 16 * mib + 16 * mib + 4 * mib + mib + 256 * 1024;
    let step = 32 * mib + 8 * mib + 8 * mib + 2 * mib + 512 * 1024 + 4096 + 12 * mib;
    assert_eq!(v["peak_live_bytes"].as_u64().unwrap(), weights + step);
    assert!(v["source"]
        .as_str()
        .unwrap()
        .contains("1 allocate failures"));
    let out = run(&["advise", "--json", log.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(json_lines(&out)[0]["settings"].as_array().unwrap().len() >= 8);
    let bad = dir.join("bad.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.5,deallocate,0x40,8,0x0\n",
    )
    .unwrap();
    let out = run(&[
        "import",
        bad.to_str().unwrap(),
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2: deallocate of 0x40, which no earlier line allocated"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
