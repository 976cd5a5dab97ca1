//! Listing and reading cache files, with errors that name the path.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::CacheError;

/// The last component of `path`, lossily as text (empty for none): for
/// matching a file against a kind's names.
pub(crate) fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The error for `path`, a file `kind` (its title) does not write there:
/// `what` it is, then what the kind's tree holds (`expected`).
pub(crate) fn foreign(path: &Path, kind: &'static str, what: &str, expected: &str) -> CacheError {
    CacheError::Foreign {
        path: path.to_path_buf(),
        kind,
        reason: format!("{what}; expected {expected}"),
    }
}

/// The error for `path`, a torn entry: why a tool would not use it.
pub(crate) fn torn(path: &Path, reason: impl Into<String>) -> CacheError {
    CacheError::TornEntry {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// `path` below `root`, `/`-separated: how kinds key an entry by where it
/// is filed.
pub(crate) fn key_below(root: &Path, path: &Path) -> String {
    let below = path.strip_prefix(root).unwrap_or(path);
    below
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// Subdirectories of `dir`, sorted; symbolic links are not followed.
pub(crate) fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, CacheError> {
    list(dir, |t| t.is_dir())
}

/// Names of the regular files in `dir`, sorted; symbolic links are skipped.
pub(crate) fn files(dir: &Path) -> Result<Vec<String>, CacheError> {
    Ok(list(dir, |t| t.is_file())?
        .into_iter()
        .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
        .collect())
}

/// Children of `dir` whose type passes `keep`, sorted by path.
pub(crate) fn list(
    dir: &Path,
    keep: impl Fn(&fs::FileType) -> bool,
) -> Result<Vec<PathBuf>, CacheError> {
    let io = |source| CacheError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if keep(&entry.file_type().map_err(io)?) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// At most `limit` bytes from the start of a file.
pub(crate) fn read_head(path: &Path, limit: u64) -> Result<Vec<u8>, CacheError> {
    let io = |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut buf = Vec::new();
    fs::File::open(path)
        .map_err(io)?
        .take(limit)
        .read_to_end(&mut buf)
        .map_err(io)?;
    Ok(buf)
}
