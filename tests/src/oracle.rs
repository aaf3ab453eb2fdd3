//! Driving the reference model, `oracle/pytorch_sim.py` of the test data.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The model's `memory_stats` for one trace, or why it failed.
pub type ModelStats = Result<Map<String, Value>, String>;

/// One trace for the model.
pub struct Job {
    /// The trace file.
    pub path: PathBuf,
    /// `--conf`.
    pub conf: String,
    /// `--capacity` (the header's when `None`).
    pub capacity: Option<u64>,
    /// `--memory-fraction`.
    pub memory_fraction: Option<f64>,
}

/// The model's `memory_stats` (device 0) for each job, in order, run in one
/// Python process through `tests/oracle_batch.py`.
pub fn run_batch(data: &Path, jobs: &[Job], scratch: &Path) -> Result<Vec<ModelStats>, String> {
    run_batch_as(data, jobs, scratch, None)
}

/// [`run_batch`] with the model taking torch `torch`'s decisions
/// (`PYTORCH_SIM_TORCH_VERSION`; the model's default, the newest, if `None`).
pub fn run_batch_as(
    data: &Path,
    jobs: &[Job],
    scratch: &Path,
    torch: Option<&str>,
) -> Result<Vec<ModelStats>, String> {
    let list = write_jobs(jobs, scratch)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle_batch.py");
    let mut cmd = Command::new("python3");
    if let Some(v) = torch {
        cmd.env("PYTORCH_SIM_TORCH_VERSION", v);
    }
    let out = cmd
        .arg(&script)
        .arg(data.join("oracle"))
        .arg(&list)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "oracle batch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let results: Vec<_> = stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).map_err(|e| format!("oracle output: {e}"))?;
            match v.get("ok").and_then(Value::as_object) {
                Some(m) => Ok(m.clone()),
                None => Err(v
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string()),
            }
        })
        .collect();
    if results.len() != jobs.len() {
        return Err(format!(
            "oracle answered {} of {} jobs: {}",
            results.len(),
            jobs.len(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(results)
}

/// The model's snapshot (segments, one trace list per device, settings)
/// after each job, with its memory history on, run in one Python process
/// through `tests/oracle_history.py`.
pub fn run_history_batch(
    data: &Path,
    jobs: &[Job],
    scratch: &Path,
) -> Result<Vec<Result<Value, String>>, String> {
    let list = write_jobs(jobs, scratch)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle_history.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(data.join("oracle"))
        .arg(&list)
        .arg(scratch)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "oracle history batch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let results: Vec<_> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).map_err(|e| format!("oracle output: {e}"))?;
            match v.get("ok") {
                Some(snap) => Ok(snap.clone()),
                None => Err(v["error"].as_str().unwrap_or("?").to_string()),
            }
        })
        .collect();
    if results.len() != jobs.len() {
        return Err(format!(
            "oracle answered {} of {} jobs",
            results.len(),
            jobs.len()
        ));
    }
    Ok(results)
}

/// Write the jobs as JSON lines in `scratch`; the file's path.
fn write_jobs(jobs: &[Job], scratch: &Path) -> Result<PathBuf, String> {
    let list = scratch.join("jobs.jsonl");
    let mut text = String::new();
    for j in jobs {
        text.push_str(
            &serde_json::json!({"path": j.path, "conf": j.conf, "capacity": j.capacity, "memory_fraction": j.memory_fraction})
                .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(&list, text).map_err(|e| format!("{}: {e}", list.display()))?;
    Ok(list)
}

/// The model's command line on one trace: `python3 pytorch_sim.py TRACE`,
/// returning `devices."0".memory_stats`.
pub fn run_cli(data: &Path, trace: &Path, conf: &str) -> Result<Map<String, Value>, String> {
    let out = Command::new("python3")
        .arg(data.join("oracle").join("pytorch_sim.py"))
        .arg(trace)
        .arg("--conf")
        .arg(conf)
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    v["devices"]["0"]["memory_stats"]
        .as_object()
        .cloned()
        .ok_or_else(|| "no memory_stats".to_string())
}

/// Whether the model's error is the internal assert PyTorch stops on at
/// the model's commit (pytorch/pytorch#119452: `max_split_size` with
/// expandable segments releases an expandable block as a whole segment; the
/// model exits with status 3). We follow the fix (PR #134338), so such a
/// case has nothing to compare.
pub fn model_stopped_on_known_bug(error: &str) -> bool {
    error.starts_with("InternalAssertError")
}

/// Keys whose values differ (or that one side lacks), as readable lines.
pub fn diff(ours: &Map<String, Value>, theirs: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in theirs {
        match ours.get(k) {
            Some(o) if o == v => {}
            o => out.push(format!(
                "{k}: oracle {v}, ours {}",
                o.map_or("missing".to_string(), |x| x.to_string())
            )),
        }
    }
    for k in ours.keys() {
        if !theirs.contains_key(k) {
            out.push(format!("{k}: not in the oracle's output"));
        }
    }
    out
}
