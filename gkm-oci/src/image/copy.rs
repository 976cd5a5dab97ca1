//! Copying an image between registries and layouts (push and pull).

use futures::StreamExt;

use crate::error::Result;
use crate::image::erofs;
use crate::image::manifest::{Manifest, is_index, select_from_index};
use crate::image::multi::MultiTarget;
use crate::progress::{Progress, step};
use crate::registry::repo::{BlobSource, RawManifest, Repo};
use gkm_core::digest::Digest;

/// Copy the image `src` selects to `dst`, blobs first (with the layers'
/// EROFS twins), then the manifest (byte for byte, so the digest is kept),
/// then, when it has twins, the referrer that keeps them
/// ([`erofs::referrer`]). Blobs `dst` already has are not sent again. An
/// index is resolved to one manifest. Returns the digest.
///
/// `progress`, when given, gets one step for the blobs to send, with their
/// total size, and the bytes sent so far.
///
/// A multi-target image is copied whole: every variant (its blobs, then its
/// manifest by digest), then the index.
pub async fn copy_image(src: &Repo, dst: &Repo, progress: Option<Progress>) -> Result<Digest> {
    let mut raw = src.fetch_manifest().await?;
    if let Some(multi) = MultiTarget::parse(&raw)? {
        for variant in &multi.variants {
            let manifest = src.fetch_manifest_digest(&variant.digest).await?;
            if is_index(&manifest.media_type) {
                return Err(crate::Error::Format {
                    what: format!("variant {} of {}", variant.digest, src.image()),
                    reason: "nested indexes are not supported".into(),
                });
            }
            let parsed = copy_blobs(src, dst, &manifest, progress.clone()).await?;
            dst.put_manifest_by_digest(&manifest).await?;
            put_erofs_referrer(dst, &manifest, &parsed).await?;
        }
        dst.put_manifest(&raw).await?;
        return Ok(raw.digest);
    }
    if is_index(&raw.media_type) {
        raw = src
            .fetch_manifest_digest(&select_from_index(&raw.bytes)?)
            .await?;
    }
    let parsed = copy_blobs(src, dst, &raw, progress).await?;
    dst.put_manifest(&raw).await?;
    put_erofs_referrer(dst, &raw, &parsed).await?;
    Ok(raw.digest)
}

/// Stores the artifact manifest that keeps the EROFS twins of the image
/// `raw` in `dst` ([`erofs::referrer`]), and its empty config, when the
/// image has twins.
async fn put_erofs_referrer(dst: &Repo, raw: &RawManifest, manifest: &Manifest) -> Result<()> {
    let Some(referrer) = erofs::referrer(raw, &manifest.layers)? else {
        return Ok(());
    };
    let empty = Digest::of(erofs::EMPTY_CONFIG);
    if !dst.has_blob(&empty).await? {
        let chunk: std::io::Result<bytes::Bytes> =
            Ok(bytes::Bytes::from_static(erofs::EMPTY_CONFIG));
        let stream = futures::stream::once(async move { chunk });
        dst.put_blob(
            &empty,
            erofs::EMPTY_CONFIG.len() as u64,
            BlobSource::Stream(Box::pin(stream)),
        )
        .await?;
    }
    dst.put_manifest_by_digest(&referrer).await
}

/// Copies the blobs of the image manifest `raw` that `dst` lacks (its
/// config, its layers and their EROFS twins); returns the manifest parsed.
async fn copy_blobs(
    src: &Repo,
    dst: &Repo,
    raw: &RawManifest,
    progress: Option<Progress>,
) -> Result<Manifest> {
    let manifest = Manifest::parse(&raw.bytes)?;
    let twins = manifest.layers.iter().filter_map(|l| l.erofs.as_ref());
    let blobs = std::iter::once(&manifest.config)
        .chain(&manifest.layers)
        .map(|b| Blob {
            digest: b.digest.clone(),
            size: b.size,
        })
        .chain(twins.map(|t| Blob {
            digest: t.digest.clone(),
            size: t.size,
        }));
    let mut missing = Vec::new();
    for blob in blobs {
        if dst.has_blob(&blob.digest).await? {
            tracing::debug!(digest = %blob.digest, "blob already present");
        } else {
            missing.push(blob);
        }
    }
    let total: u64 = missing.iter().map(|b| b.size).sum();
    step(
        progress.as_ref(),
        &format!("copying {} blob(s) to {}", missing.len(), dst.image()),
        Some(total),
    );
    let mut sent = 0u64;
    for blob in missing {
        // A host (a mirror) whose bytes the destination refuses is
        // skipped for the next one.
        let mut start = 0;
        loop {
            let (mut source, from) = src.open_blob_from(&blob.digest, start).await?;
            if let Some(p) = progress.clone() {
                let stream = source.into_stream().await?;
                let base = sent;
                let mut done = 0u64;
                source = BlobSource::Stream(
                    stream
                        .inspect(move |chunk| {
                            if let Ok(c) = chunk {
                                done += c.len() as u64;
                                p.bytes(base + done);
                            }
                        })
                        .boxed(),
                );
            }
            match dst.put_blob(&blob.digest, blob.size, source).await {
                Err(e) if !from.last => {
                    tracing::warn!(
                        host = %from.label, digest = %blob.digest, error = %e,
                        "the blob a registry host served was refused; trying the next host"
                    );
                    start = from.index + 1;
                }
                result => break result?,
            }
        }
        sent += blob.size;
    }
    Ok(manifest)
}

/// A blob to copy: its digest and size.
struct Blob {
    digest: Digest,
    size: u64,
}
