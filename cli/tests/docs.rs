//! The output the docs quote, checked against what the command prints now,
//! so a quoted figure cannot go stale.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// docs/oom.md quotes the verdict of `cachealloc replay --capacity 1GiB
/// tests/data/traces/resnet50-train.jsonl.gz`.
#[test]
fn the_out_of_memory_example_of_docs_oom_is_what_the_replay_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .current_dir(repo())
        .args([
            "replay",
            "--capacity",
            "1GiB",
            "tests/data/traces/resnet50-train.jsonl.gz",
        ])
        .output()
        .expect("run cachealloc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let verdict = stdout
        .lines()
        .find_map(|l| l.split_once("cachealloc: fragmentation: ").map(|(_, v)| v))
        .unwrap_or_else(|| panic!("no fragmentation verdict in:\n{stdout}"));
    let doc = std::fs::read_to_string(repo().join("docs/oom.md")).expect("docs/oom.md");
    // The doc wraps the message; compare it with its line breaks as spaces.
    let doc = doc.replace('\n', " ");
    assert!(
        doc.contains(&format!("cachealloc: fragmentation: {}", verdict.trim())),
        "docs/oom.md should quote the verdict the replay prints now: {verdict}"
    );
}

/// docs/cli.md quotes the whole of `cachealloc advise --capacity 9GiB
/// tests/data/traces/gpt2-train.jsonl.gz`.
#[test]
fn the_advise_example_of_docs_cli_is_what_advise_prints() {
    let out = Command::new(env!("CARGO_BIN_EXE_cachealloc"))
        .current_dir(repo())
        .args([
            "advise",
            "-q",
            "--capacity",
            "9GiB",
            "tests/data/traces/gpt2-train.jsonl.gz",
        ])
        .output()
        .expect("run cachealloc");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("recommended:"), "{stdout}");
    let doc = std::fs::read_to_string(repo().join("docs/cli.md")).expect("docs/cli.md");
    assert!(
        doc.contains(&format!("```text\n{stdout}```")),
        "docs/cli.md should quote advise's output as it is now:\n{stdout}"
    );
}
