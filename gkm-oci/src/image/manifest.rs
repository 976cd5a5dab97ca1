//! An image's documents as gkm reads them: the manifest (OCI or Docker
//! schema2), an index's choice of manifest, and the config labels.

use std::collections::BTreeMap;

use oci_spec::image::{ImageIndex, ImageManifest};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::image::erofs::twin::ErofsLayer;
use crate::image::labels::{Compression, DOCKER_MANIFEST_LIST, OCI_INDEX};
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
    /// Its EROFS twin, when its descriptor names one
    /// ([`crate::image::erofs`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erofs: Option<ErofsLayer>,
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
    let digest = d.digest().to_string().parse()?;
    let annotations: BTreeMap<String, String> = d
        .annotations()
        .as_ref()
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let erofs = ErofsLayer::from_annotations(&annotations)
        .map_err(|e| Error::format(format!("layer {digest}"), e))?;
    Ok(Layer {
        digest,
        media_type: d.media_type().to_string(),
        size,
        erofs,
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
