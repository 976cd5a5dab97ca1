//! Copying an image between registries and layouts (push and pull).

use crate::digest::Digest;
use crate::error::Result;
use crate::image::{Manifest, is_index, select_from_index};
use crate::repo::Repo;

/// Copy the image `src` selects to `dst`, blobs first, then the manifest
/// (byte for byte, so the digest is kept). Blobs `dst` already has are not
/// sent again. An index is resolved to one manifest. Returns the digest.
pub async fn copy_image(src: &Repo, dst: &Repo) -> Result<Digest> {
    let mut raw = src.fetch_manifest().await?;
    if is_index(&raw.media_type) {
        raw = src.fetch_manifest_digest(&select_from_index(&raw.bytes)?).await?;
    }
    let manifest = Manifest::parse(&raw.bytes)?;
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        if dst.has_blob(&blob.digest).await? {
            tracing::debug!(digest = %blob.digest, "blob already present");
            continue;
        }
        let source = src.open_blob(&blob.digest).await?;
        dst.put_blob(&blob.digest, blob.size, source).await?;
    }
    dst.put_manifest(&raw).await?;
    Ok(raw.digest)
}
