//! EROFS twins of cache layers: the same tree as a tar layer, as an EROFS
//! image a node can mount from one file instead of writing the tree file by
//! file.
//!
//! The format (docs/delivery.md, "EROFS layers"): the image's layers stay
//! the tar layers MCV and GKM's extractor read. Each tar layer that has a
//! twin names it in its own descriptor's annotations, [`DIGEST_ANNOTATION`],
//! [`SIZE_ANNOTATION`] and [`COMPRESSION_ANNOTATION`], so the twin's digest
//! is in the manifest the signature covers and a node finds it in the
//! manifest it reads anyway: no request more than a tar delivery. The blob
//! ([`MEDIA_TYPE`]) holds exactly the tree the tar layer holds: it is made
//! by unpacking that layer ([`write`]).
//!
//! A registry keeps only blobs a manifest lists, so [`referrer`] gives the
//! artifact manifest that lists the twins: an OCI 1.1 referrer of the image
//! (its `subject`), pushed beside the image and listed in the image's
//! `sha256-<hex>` tag-schema index. It is a function of the image manifest
//! alone, so copying an image writes it again instead of looking for it.

pub mod superblock;
pub mod twin;
pub mod write;

pub use twin::{
    COMPRESSION_ANNOTATION, DIGEST_ANNOTATION, EMPTY_CONFIG, EMPTY_CONFIG_TYPE, ErofsCompression,
    ErofsLayer, LAYER_ANNOTATION, MEDIA_TYPE, SIZE_ANNOTATION,
};

use crate::error::Result;
use crate::image::manifest::Layer;
use crate::registry::media_types::OCI_MANIFEST;
use crate::registry::repo::RawManifest;
use gkm_core::digest::Digest;

/// The artifact manifest that keeps `image`'s EROFS twins in a registry:
/// the twins of its `layers` as its layers (each annotated with the tar
/// layer it is of), an empty config, `image` as its subject. `None` when no
/// layer has a twin.
pub fn referrer(image: &RawManifest, layers: &[Layer]) -> Result<Option<RawManifest>> {
    let twins: Vec<serde_json::Value> = layers
        .iter()
        .filter_map(|l| l.erofs.as_ref().map(|t| (l, t)))
        .map(|(l, t)| {
            serde_json::json!({
                "mediaType": MEDIA_TYPE,
                "size": t.size,
                "digest": t.digest.as_str(),
                "annotations": {LAYER_ANNOTATION: l.digest.as_str()},
            })
        })
        .collect();
    if twins.is_empty() {
        return Ok(None);
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": MEDIA_TYPE,
        "config": {
            "mediaType": EMPTY_CONFIG_TYPE,
            "size": EMPTY_CONFIG.len(),
            "digest": Digest::of(EMPTY_CONFIG).as_str(),
        },
        "layers": twins,
        "subject": {
            "mediaType": image.media_type,
            "size": image.bytes.len(),
            "digest": image.digest.as_str(),
        },
    });
    let bytes = crate::json::canonical(&manifest)?;
    Ok(Some(RawManifest {
        digest: Digest::of(&bytes),
        media_type: OCI_MANIFEST.to_string(),
        bytes,
    }))
}
