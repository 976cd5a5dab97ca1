//! Filling a claim: what a fill Job's container runs (`gkm-operator fill`).
//!
//! The new tree is extracted beside the old one inside the volume, then the
//! old entries are removed and the new ones moved to the volume root, so a
//! refill after a moved tag never leaves a mix of two digests behind.

use std::fs;
use std::path::Path;

use gkm_oci::{
    ExtractStats, Image, ImageRef, RegistryOptions, Repo, UnpackOptions, extract_to_dir,
};

use crate::error::{Error, Result};

/// The hidden directory a fill builds the new tree in.
const NEXT: &str = ".gkm-next";

/// Extracts `image` (which must name a digest: a fill never follows a tag)
/// into the volume mounted at `into`, replacing what it held.
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
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io { path, source }
    };
    fs::create_dir_all(into).map_err(io(into))?;
    let next = into.join(NEXT);
    if next.exists() {
        fs::remove_dir_all(&next).map_err(io(&next))?;
    }
    let repo = Repo::open(image, registry)?;
    let fetched = Image::fetch(&repo).await?;
    if fetched.digest != pinned {
        return Err(Error::InvalidSpec(format!(
            "{image}: the registry served {} instead",
            fetched.digest
        )));
    }
    let stats = extract_to_dir(&repo, &fetched, &next, &UnpackOptions::default()).await?;
    for entry in fs::read_dir(into).map_err(io(into))? {
        let entry = entry.map_err(io(into))?;
        if entry.file_name() == NEXT {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type().map_err(io(&path))?.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.map_err(io(&path))?;
    }
    for entry in fs::read_dir(&next).map_err(io(&next))? {
        let entry = entry.map_err(io(&next))?;
        let to = into.join(entry.file_name());
        fs::rename(entry.path(), &to).map_err(io(&to))?;
    }
    fs::remove_dir(&next).map_err(io(&next))?;
    Ok(stats)
}
