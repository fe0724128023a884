//! JSON Lines: one serde value per line.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{HarnessError, Result};

/// Writes `items` to `path`, one JSON object per line, through a temporary file renamed over
/// `path` ([`write_atomic`]), so a reader never sees a half-written file. Returns the path.
pub fn write_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<PathBuf> {
    write_atomic(path, |w| write_lines(path, w, items))?;
    Ok(path.to_path_buf())
}

/// Appends `items` to `path` (created when missing), one JSON object per line, then flushes
/// them to the disk: what a run has finished survives a crash or a kill after this returns.
pub fn append_jsonl<T: Serialize>(path: &Path, items: &[T]) -> Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| HarnessError::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    write_lines(path, &mut w, items)?;
    let file = w
        .into_inner()
        .map_err(|e| HarnessError::io(path, e.into_error()))?;
    file.sync_data().map_err(|e| HarnessError::io(path, e))
}

fn write_lines<T: Serialize>(path: &Path, w: &mut dyn Write, items: &[T]) -> Result<()> {
    for item in items {
        serde_json::to_writer(&mut *w, item).map_err(|e| HarnessError::io(path, e.into()))?;
        w.write_all(b"\n").map_err(|e| HarnessError::io(path, e))?;
    }
    w.flush().map_err(|e| HarnessError::io(path, e))
}

/// The temporary name `path` is written under before [`write_atomic`] renames it:
/// `.NAME.tmp` in the same folder.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp"))
}

/// Writes `path` by `fill` into [`temp_path`] and renames it over `path` once complete: the
/// file is either the old one or the whole new one, never a mix.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let temp = temp_path(path);
    let file = std::fs::File::create(&temp).map_err(|e| HarnessError::io(&temp, e))?;
    let mut w = std::io::BufWriter::new(file);
    let filled = fill(&mut w).and_then(|()| w.flush().map_err(|e| HarnessError::io(&temp, e)));
    drop(w);
    if let Err(e) = filled {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    std::fs::rename(&temp, path).map_err(|e| HarnessError::io(path, e))
}

/// Reads a JSONL file back (blank lines skipped). A bad line gives
/// [`HarnessError::ResultParse`] with its line number.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| HarnessError::io(path, e))?;
    parse_lines(path, &text)
}

/// Reads a JSONL file a run appended to and may have been killed writing: a missing file is
/// empty, and a last line cut short (no final newline) is dropped.
///
/// # Errors
/// As [`read_jsonl`] for the whole lines.
pub fn read_appended_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(HarnessError::io(path, e)),
    };
    let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
    parse_lines(path, whole)
}

fn parse_lines<T: DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>> {
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
