//! A snapshot dict to a file: a pickle (protocol 3, which memory_viz's own
//! unpickler reads) or JSON.

use crate::dict::SnapshotDict;

/// Write `dict` to `path`: JSON if it ends in `.json`, else a pickle
/// (protocol 3).
pub fn write_snapshot(path: &str, dict: &SnapshotDict) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
    let mut w = std::io::BufWriter::new(file);
    if path.ends_with(".json") {
        serde_json::to_writer(&mut w, dict).map_err(|e| format!("{path}: {e}"))?;
    } else {
        pickled::to_writer(&mut w, dict, pickled::SerOptions::new())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    std::io::Write::flush(&mut w).map_err(|e| format!("{path}: {e}"))
}
