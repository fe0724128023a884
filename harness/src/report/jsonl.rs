//! JSON Lines: one serde value per line.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{HarnessError, Result};

/// Writes `items` to `path`, one JSON object per line. Returns the path.
pub fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<PathBuf> {
    let file = std::fs::File::create(path).map_err(|e| HarnessError::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    for item in items {
        serde_json::to_writer(&mut w, item).map_err(|e| HarnessError::io(path, e.into()))?;
        w.write_all(b"\n").map_err(|e| HarnessError::io(path, e))?;
    }
    w.flush().map_err(|e| HarnessError::io(path, e))?;
    Ok(path.to_path_buf())
}

/// Reads a JSONL file back (blank lines skipped). A bad line gives
/// [`HarnessError::ResultParse`] with its line number.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| HarnessError::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| HarnessError::ResultParse {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}
