//! Reading and writing the JSON files of a node store: each written
//! atomically (a synced temporary file in the same directory, then a rename),
//! so a reader sees the old or the new content, never a torn one.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};

pub(super) fn invalid_data(path: &Path, reason: impl Into<String>) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, reason.into()),
    }
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Write `value` as JSON to `path` through a synced temporary file in the
/// same directory and a rename.
pub(super) fn write_json_atomically<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| invalid_data(path, "no parent directory"))?;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| invalid_data(path, format!("serialising: {e}")))?;
    bytes.push(b'\n');
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .suffix(".json")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    tmp.write_all(&bytes).map_err(io_err(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}

pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| invalid_data(path, e.to_string()))
}

pub(super) fn remove_file(path: &Path) -> Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// The entries of `dir`, sorted; none when it does not exist.
pub(super) fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut out: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    out.sort();
    Ok(out)
}

/// `name` for `…/name.json`, skipping temporary files (`.tmp-…`).
pub(super) fn json_stem(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    if file.starts_with('.') {
        return None;
    }
    file.strip_suffix(".json").map(str::to_string)
}

/// Every record in `dir`: each `*.json` file (not a temporary one) read as
/// `F` and made a record by `into_record` (its reason when it cannot be
/// one). Unreadable records are logged (as `what`) and left out.
pub(super) fn read_records<F, T>(
    dir: &Path,
    what: &str,
    into_record: impl Fn(F) -> std::result::Result<T, String>,
) -> Result<Vec<T>>
where
    F: serde::de::DeserializeOwned,
{
    let mut out = Vec::new();
    for path in list_dir(dir)? {
        if json_stem(&path).is_none() {
            continue;
        }
        let parsed = read_json::<F>(&path).and_then(|file| match file {
            Some(file) => into_record(file)
                .map(Some)
                .map_err(|reason| invalid_data(&path, reason)),
            None => Ok(None),
        });
        match parsed {
            Ok(Some(record)) => out.push(record),
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "skipping unreadable {what}"),
        }
    }
    Ok(out)
}
