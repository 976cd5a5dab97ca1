//! Extracting an image's cache tree into a plain directory (`gkm extract`,
//! the PVC fill job).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::image::Image;
use crate::progress::{Progress, step};
use crate::registry::layout::tmp_name;
use crate::registry::repo::Repo;
use crate::store::disk::check_free_space;
use crate::store::extract::{ExtractPolicy, ExtractStats, Mapping};
use crate::store::pipeline::{extract_layers, sync_dir, sync_filesystem};

/// Options of [`extract_to_dir`].
#[derive(Clone, Default)]
pub struct UnpackOptions {
    /// The extraction policy.
    pub policy: ExtractPolicy,
    /// Skip flushing the tree to disk before it is moved into place.
    pub no_sync: bool,
    /// Progress callback.
    pub progress: Option<Progress>,
}

struct Cleanup(Option<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

/// Extract the cache tree of `image` (without its `io.*.cache/` prefix and
/// manifest; every layer, in order, for a delta image) into `out`, within the policy's byte budget and free-space
/// reserve; on any error nothing of the tree is left in or next to `out`.
///
/// When `out` does not exist the tree is built next to it and renamed into
/// place in one step. When it is an existing empty directory (a mount
/// point), the tree is built in a hidden directory inside it and its
/// top-level entries are moved in. A non-empty `out` is refused.
pub async fn extract_to_dir(
    repo: &Repo,
    image: &Image,
    out: &Path,
    options: &UnpackOptions,
) -> Result<ExtractStats> {
    let layers = image.cache_layers()?.to_vec();
    let exists = match fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::Destination {
                    path: out.to_path_buf(),
                    reason: "directory is not empty".into(),
                });
            }
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(Error::io(out, e)),
    };
    let staging = if exists {
        out.join(tmp_name(".gkm-staging-"))
    } else {
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        parent.join(tmp_name(".gkm-staging-"))
    };
    check_free_space(
        staging.parent().unwrap_or(out),
        image,
        options.policy.byte_budget,
        options.policy.free_space_reserve,
    )?;
    // Private while it is being filled.
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(|e| Error::io(&staging, e))?;
    let mut cleanup = Cleanup(Some(staging.clone()));
    let stats = extract_layers(
        repo,
        &layers,
        &staging,
        Mapping::CacheOnly,
        &options.policy,
        options.progress.clone(),
    )
    .await?;
    let out = out.to_path_buf();
    let no_sync = options.no_sync;
    let what = if no_sync {
        "moving the tree into place"
    } else {
        "flushing the tree to disk"
    };
    step(options.progress.as_ref(), what, None);
    tokio::task::spawn_blocking(move || -> Result<()> {
        if !no_sync {
            sync_filesystem(&staging)?;
        }
        if exists {
            move_entries(&staging, &out)?;
        } else {
            fs::set_permissions(&staging, fs::Permissions::from_mode(0o755))
                .map_err(|e| Error::io(&staging, e))?;
            fs::rename(&staging, &out).map_err(|e| Error::io(&out, e))?;
        }
        if !no_sync {
            sync_dir(
                out.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
            )?;
        }
        Ok(())
    })
    .await??;
    if !exists {
        cleanup.0 = None;
    }
    Ok(stats)
}

/// Moves the top-level entries of `staging` into `out`. On failure the
/// entries already moved go back into `staging` (which the caller then
/// removes), so `out` is never left holding part of the tree.
fn move_entries(staging: &Path, out: &Path) -> Result<()> {
    let mut moved = Vec::new();
    let mut move_all = || -> Result<()> {
        let entries = fs::read_dir(staging).map_err(|e| Error::io(staging, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(staging, e))?;
            let to = out.join(entry.file_name());
            fs::rename(entry.path(), &to).map_err(|e| Error::io(&to, e))?;
            moved.push(entry.file_name());
        }
        Ok(())
    };
    let result = move_all();
    if result.is_err() {
        for name in moved {
            let back = fs::rename(out.join(&name), staging.join(&name));
            if let Err(e) = back {
                tracing::warn!(path = %out.join(&name).display(), error = %e,
                    "could not take back part of a failed extraction");
            }
        }
    }
    result
}
