//! Reading an image: its manifest (OCI or Docker schema2, through an index
//! if need be), its config labels and its cache layers.

use std::collections::BTreeMap;

use oci_spec::image::{ImageIndex, ImageManifest};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::labels::{CacheLabels, Compression, DOCKER_MANIFEST_LIST, OCI_INDEX};
use crate::multi::MultiTarget;
use crate::reference::ImageRef;
use crate::repo::{RawManifest, Repo};
use gkm_core::digest::Digest;

/// A layer of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// Digest of the (compressed) blob.
    pub digest: Digest,
    /// Its media type.
    pub media_type: String,
    /// Its size in bytes.
    pub size: u64,
}

impl Layer {
    /// How the layer is compressed.
    pub fn compression(&self) -> Result<Compression> {
        Compression::from_media_type(&self.media_type)
    }
}

/// A parsed image manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The config blob.
    pub config: Layer,
    /// The layers, in order.
    pub layers: Vec<Layer>,
    /// Manifest annotations.
    pub annotations: BTreeMap<String, String>,
}

fn descriptor(d: &oci_spec::image::Descriptor) -> Result<Layer> {
    let size = d.size();
    Ok(Layer {
        digest: d.digest().to_string().parse()?,
        media_type: d.media_type().to_string(),
        size,
    })
}

impl Manifest {
    /// Parse an OCI or Docker schema2 image manifest. Never panics.
    pub fn parse(bytes: &[u8]) -> Result<Manifest> {
        let m: ImageManifest =
            serde_json::from_slice(bytes).map_err(|e| Error::format("image manifest", e))?;
        if m.schema_version() != 2 {
            return Err(Error::format(
                "image manifest",
                format!("schemaVersion {}: expected 2", m.schema_version()),
            ));
        }
        Ok(Manifest {
            config: descriptor(m.config())?,
            layers: m.layers().iter().map(descriptor).collect::<Result<_>>()?,
            annotations: m
                .annotations()
                .as_ref()
                .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default(),
        })
    }
}

/// Whether a manifest media type is an index / manifest list.
pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_MANIFEST_LIST
}

/// The manifest an index selects: linux/amd64 if listed, else the first.
pub fn select_from_index(bytes: &[u8]) -> Result<Digest> {
    let index: ImageIndex =
        serde_json::from_slice(bytes).map_err(|e| Error::format("image index", e))?;
    let pick = index
        .manifests()
        .iter()
        .find(|d| {
            d.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
            })
        })
        .or_else(|| index.manifests().first())
        .ok_or_else(|| Error::format("image index", "lists no manifests"))?;
    Ok(pick.digest().to_string().parse()?)
}

#[derive(Deserialize, Default)]
struct ConfigDoc {
    #[serde(default)]
    config: Option<ContainerConfig>,
}

#[derive(Deserialize, Default)]
struct ContainerConfig {
    #[serde(default, rename = "Labels")]
    labels: Option<BTreeMap<String, String>>,
}

/// The labels of an image config (`config.Labels`). Never panics.
pub fn config_labels(bytes: &[u8]) -> Result<BTreeMap<String, String>> {
    let doc: ConfigDoc =
        serde_json::from_slice(bytes).map_err(|e| Error::format("image config", e))?;
    Ok(doc.config.and_then(|c| c.labels).unwrap_or_default())
}

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
    /// add files to them (see [`crate::delta`]).
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
