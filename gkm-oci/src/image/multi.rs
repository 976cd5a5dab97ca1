//! Multi-target images: one cache for a mixed GPU fleet.
//!
//! A multi-target image is an OCI image index whose manifest descriptors
//! each name a **single-target cache image** (the variant, which MCV and
//! GKM read as before) and carry that image's cache labels
//! (`cache.triton.image/summary`, `entry-count`, `cache-size-bytes`,
//! `org.opencontainers.image.title`; `cache.vllm.image/*` for vLLM) as
//! descriptor annotations. A reader picks the variant for its GPUs from the
//! index alone ([`gkm_core::variant::choose_variant`]) and then fetches only
//! that variant, by its digest.
//!
//! An index none of whose descriptors carries these annotations is a
//! platform index (`docker buildx`), read as before: its linux/amd64
//! manifest. A descriptor without them in an index where others have them
//! is read from its manifest ([`MultiTarget::complete`]).
//!
//! Signing and verification cover the whole: the signature is made over
//! the index digest, the index names each variant by digest, and variants
//! are only ever fetched by those digests (the bytes checked against them),
//! so moving one variant (re-pushing a variant's own tag, or an index with
//! another variant under the same tag) gives either content that is never
//! read or an index digest nobody signed.

use std::collections::BTreeMap;

use gkm_core::cache::Summary;
use gkm_core::compat::CheckOptions;
use gkm_core::gpu::Gpu;
use gkm_core::variant::{VariantChoice, choose_variant};
use oci_spec::image::ImageIndex;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::image::labels::CacheLabels;
use crate::image::manifest::is_index;
use crate::registry::reference::ImageRef;
use crate::registry::repo::RawManifest;
use gkm_core::digest::Digest;
use gkm_core::image_layout::KindLayout;

/// One variant of a multi-target image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    /// Its manifest digest: what it is fetched by.
    pub digest: Digest,
    /// Its manifest media type.
    pub media_type: String,
    /// Its manifest size in bytes.
    pub size: u64,
    /// Its cache labels, from the descriptor's annotations (or, after
    /// [`MultiTarget::complete`], from its manifest); `None` when the
    /// descriptor carries none.
    pub cache: Option<CacheLabels>,
}

impl Variant {
    /// Its targets; empty when unknown.
    pub fn summary(&self) -> Summary {
        self.cache
            .as_ref()
            .map(|c| c.summary.clone())
            .unwrap_or_else(|| Summary::new(Vec::new()))
    }
}

/// A multi-target image: the index as stored and its variants, in its
/// order.
#[derive(Debug, Clone)]
pub struct MultiTarget {
    /// The index as stored (its digest is what is signed).
    pub raw: RawManifest,
    /// The variants, in the index's order.
    pub variants: Vec<Variant>,
}

impl MultiTarget {
    /// Reads `raw` as a multi-target image: `Ok(None)` when it is not an
    /// index, or an index none of whose descriptors carries cache labels
    /// (a platform index). Never panics.
    pub fn parse(raw: &RawManifest) -> Result<Option<MultiTarget>> {
        if !is_index(&raw.media_type) {
            return Ok(None);
        }
        let index: ImageIndex =
            serde_json::from_slice(&raw.bytes).map_err(|e| Error::format("image index", e))?;
        let mut variants = Vec::new();
        for d in index.manifests() {
            let annotations: BTreeMap<String, String> = d
                .annotations()
                .as_ref()
                .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let cache = match KindLayout::from_labels(&annotations) {
                Some(_) => Some(CacheLabels::read(&annotations).map_err(|e| {
                    Error::format(format!("index {} descriptor {}", raw.digest, d.digest()), e)
                })?),
                None => None,
            };
            variants.push(Variant {
                digest: d.digest().to_string().parse()?,
                media_type: d.media_type().to_string(),
                size: d.size(),
                cache,
            });
        }
        if variants.iter().all(|v| v.cache.is_none()) {
            return Ok(None);
        }
        Ok(Some(MultiTarget {
            raw: raw.clone(),
            variants,
        }))
    }

    /// The index digest.
    pub fn digest(&self) -> &Digest {
        &self.raw.digest
    }

    /// Which variant `gpus` get, and why.
    pub fn choose(&self, gpus: &[Gpu], options: &CheckOptions) -> VariantChoice {
        let summaries: Vec<Summary> = self.variants.iter().map(Variant::summary).collect();
        choose_variant(&summaries, gpus, options)
    }
}

/// Refuses variants that cannot make one multi-target image: different
/// cache kinds, the same image twice, a target in two variants.
pub(crate) fn check_variants(variants: &[(&ImageRef, &Digest, &CacheLabels)]) -> Result<()> {
    if let Some(w) = variants.windows(2).find(|w| w[0].2.kind != w[1].2.kind) {
        return Err(Error::format(
            "multi-target image",
            format!(
                "the variants are caches of different kinds ({} and {}): one image holds one kind",
                w[0].2.kind.as_str(),
                w[1].2.kind.as_str()
            ),
        ));
    }
    if let Some((source, _, _)) = variants
        .iter()
        .find(|(_, _, cache)| cache.summary.targets.is_empty())
    {
        return Err(Error::format(
            "multi-target image",
            format!(
                "{source} holds no GPU kernel (C++ kernels only): a node gets a variant by its GPUs, so a CPU-only cache is built as an image of its own"
            ),
        ));
    }
    let mut digests: BTreeMap<&Digest, &ImageRef> = BTreeMap::new();
    let mut targets: BTreeMap<String, &ImageRef> = BTreeMap::new();
    for (source, digest, cache) in variants {
        if let Some(first) = digests.insert(digest, source) {
            return Err(Error::format(
                "multi-target image",
                format!("{source} is the same image as {first} ({digest})"),
            ));
        }
        for target in &cache.summary.targets {
            if let Some(first) = targets.insert(target.to_string(), source) {
                return Err(Error::format(
                    "multi-target image",
                    format!(
                        "target {target} is in both {first} and {source}: a GPU of that target \
                         would have no one variant to get"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::labels::OCI_INDEX;

    fn raw(json: serde_json::Value) -> RawManifest {
        let bytes = serde_json::to_vec(&json).unwrap();
        RawManifest {
            digest: Digest::of(&bytes),
            media_type: OCI_INDEX.into(),
            bytes,
        }
    }

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn descriptor(digest: &str, annotations: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": 100, "annotations": annotations,
        })
    }

    #[test]
    fn an_annotated_index_lists_its_variants_and_a_platform_index_is_none() {
        let sm75 = serde_json::json!({"cache.triton.image/summary":
            r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32}]}"#});
        let index = raw(serde_json::json!({"schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [descriptor(D1, sm75), descriptor(D2, serde_json::json!({}))]}));
        let multi = MultiTarget::parse(&index).unwrap().unwrap();
        assert_eq!(multi.variants.len(), 2);
        assert_eq!(multi.variants[0].digest.as_str(), D1);
        assert_eq!(multi.variants[0].summary().to_string(), "cuda/75/32");
        assert_eq!(multi.variants[1].cache, None);

        let platform = raw(
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [descriptor(D1, serde_json::json!({}))]}),
        );
        assert!(MultiTarget::parse(&platform).unwrap().is_none());
    }

    #[test]
    fn a_malformed_summary_annotation_is_an_error_naming_the_descriptor() {
        let bad = serde_json::json!({"cache.triton.image/summary": "not json"});
        let index = raw(
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX,
            "manifests": [descriptor(D1, bad)]}),
        );
        let err = MultiTarget::parse(&index).unwrap_err().to_string();
        assert!(err.contains(D1) && err.contains("summary"), "{err}");
    }

    #[test]
    fn variants_sharing_a_target_or_kind_conflicts_are_refused() {
        let labels = |summary: &str| {
            CacheLabels::read(&BTreeMap::from([(
                "cache.triton.image/summary".to_string(),
                summary.to_string(),
            )]))
            .unwrap()
        };
        let sm75 = labels(r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32}]}"#);
        let both = labels(
            r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32},{"backend":"cuda","arch":"80","warp_size":32}]}"#,
        );
        let a: ImageRef = "r.local/c:a".parse().unwrap();
        let b: ImageRef = "r.local/c:b".parse().unwrap();
        let (d1, d2): (Digest, Digest) = (D1.parse().unwrap(), D2.parse().unwrap());
        let err = check_variants(&[(&a, &d1, &sm75), (&b, &d2, &both)]).unwrap_err();
        assert!(err.to_string().contains("target cuda/75/32"), "{err}");
        let err = check_variants(&[(&a, &d1, &sm75), (&b, &d1, &sm75)]).unwrap_err();
        assert!(err.to_string().contains("same image"), "{err}");
    }
}
