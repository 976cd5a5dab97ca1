//! Images: reading one ([`Image`]: its manifest, through an index if need
//! be, its config labels and its cache layers), the documents it is made of
//! ([`manifest`], [`labels`]), its layer ([`layer`]) and the layer's EROFS
//! twin ([`erofs`]), building one ([`build`]), multi-target images
//! ([`multi`], [`assemble`]) and copying one between registries and
//! layouts ([`copy`]).

pub(crate) mod assemble;
pub mod build;
pub(crate) mod copy;
pub mod erofs;
pub mod labels;
pub(crate) mod layer;
pub(crate) mod manifest;
pub(crate) mod multi;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::image::labels::CacheLabels;
use crate::image::manifest::{Layer, Manifest, config_labels, is_index, select_from_index};
use crate::image::multi::MultiTarget;
use crate::registry::reference::ImageRef;
use crate::registry::repo::{RawManifest, Repo};
use gkm_core::digest::Digest;

/// An image whose manifest and config have been read.
#[derive(Debug, Clone)]
pub struct Image {
    /// Where it was read from.
    pub reference: ImageRef,
    /// The image (manifest) digest.
    pub digest: Digest,
    /// The index digest, when the reference named an index.
    pub index_digest: Option<Digest>,
    /// The manifest as stored.
    pub raw: RawManifest,
    /// The parsed manifest.
    pub manifest: Manifest,
    /// The config labels (empty when [`Image::fetch_annotated`] did not
    /// read the config).
    pub labels: BTreeMap<String, String>,
}

/// What resolving a reference read ([`Image::resolve_manifest`]).
#[derive(Debug, Clone)]
pub enum Resolution {
    /// An image: its digest, and its manifest when the reference named it
    /// directly (not through a platform index) and it parses.
    Image {
        /// The image (manifest) digest.
        digest: Digest,
        /// The manifest, when read.
        manifest: Option<Manifest>,
    },
    /// A multi-target image.
    MultiTarget(MultiTarget),
}

impl Resolution {
    /// The digest resolved: the image's, or the multi-target index's.
    pub fn digest(&self) -> &Digest {
        match self {
            Resolution::Image { digest, .. } => digest,
            Resolution::MultiTarget(multi) => multi.digest(),
        }
    }
}

/// Whether reading an image reads its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConfigRead {
    Always,
    UnlessAnnotated,
}

impl Image {
    /// The digest the reference names, read with one manifest request:
    /// what re-resolving a tag needs, without the config. For a platform
    /// index, the digest of the manifest [`Image::fetch`] reads (that
    /// manifest itself is not read, so a nested index is found only when
    /// the image is fetched); for a multi-target image, the index's digest.
    pub async fn resolve(repo: &Repo) -> Result<Digest> {
        Ok(Image::resolve_manifest(repo).await?.digest().clone())
    }

    /// What [`Image::resolve`] gives, with what the one request read: the
    /// manifest of an image (its annotations may carry the cache labels),
    /// or the variants of a multi-target image.
    pub async fn resolve_manifest(repo: &Repo) -> Result<Resolution> {
        let raw = repo.fetch_manifest().await?;
        if let Some(multi) = MultiTarget::parse(&raw)? {
            Ok(Resolution::MultiTarget(multi))
        } else if is_index(&raw.media_type) {
            Ok(Resolution::Image {
                digest: select_from_index(&raw.bytes)?,
                manifest: None,
            })
        } else {
            Ok(Resolution::Image {
                digest: raw.digest.clone(),
                manifest: Manifest::parse(&raw.bytes).ok(),
            })
        }
    }

    /// Resolve the reference and read the manifest and config.
    pub async fn fetch(repo: &Repo) -> Result<Image> {
        Image::read(repo, ConfigRead::Always).await
    }

    /// Resolve the reference and read the manifest, and the config only
    /// when the manifest's annotations lack the cache labels (gkm's images
    /// carry them in both): all that checking and extracting a cache needs,
    /// in one request fewer. `labels` stays empty when the config is not
    /// read.
    pub async fn fetch_annotated(repo: &Repo) -> Result<Image> {
        Image::read(repo, ConfigRead::UnlessAnnotated).await
    }

    async fn read(repo: &Repo, config: ConfigRead) -> Result<Image> {
        let mut raw = repo.fetch_manifest().await?;
        let mut index_digest = None;
        if is_index(&raw.media_type) {
            if let Some(multi) = MultiTarget::parse(&raw)? {
                return Err(Error::MultiTarget {
                    location: repo.image().to_string(),
                    variants: multi.variants.len(),
                });
            }
            let chosen = select_from_index(&raw.bytes)?;
            index_digest = Some(raw.digest.clone());
            raw = repo.fetch_manifest_digest(&chosen).await?;
            if is_index(&raw.media_type) {
                return Err(Error::format(
                    "image index",
                    "nested indexes are not supported",
                ));
            }
        }
        let manifest = Manifest::parse(&raw.bytes)?;
        let annotated = CacheLabels::read(&manifest.annotations).is_ok();
        let labels = if config == ConfigRead::UnlessAnnotated && annotated {
            BTreeMap::new()
        } else {
            config_labels(&repo.fetch_small_blob(&manifest.config.digest).await?)?
        };
        Ok(Image {
            reference: repo.image().clone(),
            digest: raw.digest.clone(),
            index_digest,
            raw,
            manifest,
            labels,
        })
    }

    /// The cache labels: from the config labels, else from the manifest
    /// annotations.
    pub fn cache(&self) -> Result<CacheLabels> {
        CacheLabels::read(&self.labels)
            .or_else(|e| CacheLabels::read(&self.manifest.annotations).map_err(|_| e))
    }

    /// The layers of a cache image, in the order they are applied: its one
    /// layer, or a base image's layers followed by the delta layers that
    /// add files to them (see [`crate::capture::delta`]).
    pub fn cache_layers(&self) -> Result<&[Layer]> {
        if self.manifest.layers.is_empty() {
            return Err(Error::format(
                format!("manifest of {}", self.reference),
                "no layers: a cache image has at least one",
            ));
        }
        Ok(&self.manifest.layers)
    }

    /// The one layer of a single-layer cache image (a delta image has
    /// more: [`Image::cache_layers`]).
    pub fn cache_layer(&self) -> Result<&Layer> {
        match self.manifest.layers.as_slice() {
            [layer] => Ok(layer),
            layers => Err(Error::format(
                format!("manifest of {}", self.reference),
                format!("{} layers: expected exactly one", layers.len()),
            )),
        }
    }
}
