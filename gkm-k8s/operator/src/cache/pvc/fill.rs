//! Filling a claim: what a fill Job's container runs (`gkm-operator fill`).
//!
//! The digest's tree is extracted into the claim's store beside the tree
//! served now, and served by one atomic switch ([`super::layout`]): readers
//! see the old tree or the new one, whole, never a mix or a gap.

use std::fs;
use std::path::Path;

use gkm_oci::{
    ExtractStats, Image, ImageRef, MultiTarget, RegistryOptions, Repo, UnpackOptions,
    extract_to_dir,
};

use super::layout::Layout;
use crate::error::{Error, Result};

/// Extracts `image` (which must name a digest: a fill never follows a tag)
/// into the claim mounted at `into` and serves it there, replacing the tree
/// served before. A tree of that digest already complete in the claim is
/// served again without fetching it (no files are then counted).
pub async fn fill(
    image: &ImageRef,
    into: &Path,
    registry: &RegistryOptions,
) -> Result<ExtractStats> {
    let Some(pinned) = image.pinned_digest() else {
        return Err(Error::InvalidSpec(format!(
            "{image}: a fill needs an image pinned to a digest (REPO@sha256:…)"
        )));
    };
    fs::create_dir_all(into).map_err(|source| Error::Io {
        path: into.to_path_buf(),
        source,
    })?;
    let layout = Layout::new(into);
    let partial = layout.prepare(&pinned).map_err(|e| writable(into, e))?;
    let mut stats = ExtractStats::default();
    if !layout.tree(&pinned).is_dir() {
        let repo = Repo::open(image, registry)?;
        let fetched = match Image::fetch(&repo).await {
            Err(gkm_oci::Error::MultiTarget { .. }) => {
                return Err(multi_target(image, &repo).await);
            }
            other => other?,
        };
        if fetched.digest != pinned {
            return Err(Error::InvalidSpec(format!(
                "{image}: the registry served {} instead",
                fetched.digest
            )));
        }
        stats = extract_to_dir(&repo, &fetched, &partial, &UnpackOptions::default()).await?;
        layout.complete(&pinned, &partial)?;
    }
    layout.switch(&pinned)?;
    Ok(stats)
}

/// Why a fill of `image`, a multi-target index, is refused: a claim holds
/// one variant's tree, so a fill is pinned to a variant; the error names
/// them.
async fn multi_target(image: &ImageRef, repo: &Repo) -> Error {
    let listed = match repo
        .fetch_manifest()
        .await
        .map(|raw| MultiTarget::parse(&raw))
    {
        Ok(Ok(Some(multi))) => multi
            .variants
            .iter()
            .map(|v| {
                let targets: Vec<String> = v
                    .summary()
                    .targets
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!("{} ({})", v.digest, targets.join(" "))
            })
            .collect::<Vec<_>>()
            .join(", "),
        Ok(Ok(None)) => "none listed".to_string(),
        Ok(Err(e)) | Err(e) => format!("unreadable: {e}"),
    };
    Error::InvalidSpec(format!(
        "{image}: a multi-target image cannot be filled into a claim, which holds one tree; \
         pin the fill to one of its variants: {listed}"
    ))
}

/// `error`, saying why when the claim refuses writes: fills run as a
/// non-root user, so the volume must be writable by it (`fsGroup` does this
/// for volumes that support ownership; a hostPath directory must be owned by
/// the fill user).
fn writable(into: &Path, error: Error) -> Error {
    match &error {
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            Error::InvalidSpec(format!(
                "{}: the claim is not writable by uid {} (the fill's user): {error}; a volume \
                 without fsGroup support (hostPath) must be owned by that user",
                into.display(),
                process_uid()
            ))
        }
        _ => error,
    }
}

/// The uid this process runs as, read from `/proc/self/status`.
fn process_uid() -> String {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(String::from))
        })
        .unwrap_or_else(|| "?".into())
}
