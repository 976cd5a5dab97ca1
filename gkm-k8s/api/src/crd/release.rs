//! `GKMCacheRelease` / `ClusterGKMCacheRelease`: what the nodes act on for
//! one cache, written by the operator only and only when it changes.
//!
//! A cache's status changes every time a node's report changes its counts:
//! at a thousand nodes, hundreds of writes per cache, none of which matters
//! to a node. The agents watch the release instead: one per cache, named
//! after it, owned by it (so deleted with it), holding exactly what they plan
//! from (the image, its node selection and workload namespaces, the digest
//! the operator resolved, its verdict, the image's variants and their
//! targets, and whether the cache is being deleted). Its counts never touch
//! it, so a node's report wakes no other node, and the image's targets are
//! read once per digest by the operator rather than once per node.

use gkm_core::Digest;
use gkm_core::cache::{Summary, Target};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::cache::NamespaceName;

/// Declares a release kind's spec, `$spec`, with the `kube` attributes that
/// set the two kinds apart (`$kube`) and, declared once here, what they
/// share.
macro_rules! release_kind {
    ($(#[$doc:meta])* $spec:ident, $($kube:tt)*) => {
        $(#[$doc])*
        #[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
        #[kube(
            group = "gkm.io",
            version = "v1alpha1",
            category = "gkm",
            $($kube)*,
            printcolumn(name = "Digest", type_ = "string", json_path = ".spec.digest"),
            printcolumn(name = "Deliverable", type_ = "boolean", json_path = ".spec.deliverable"),
            printcolumn(name = "Deleting", type_ = "boolean", json_path = ".spec.deleting", priority = "1"),
            printcolumn(name = "Image", type_ = "string", json_path = ".spec.image", priority = "1"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        pub struct $spec {
            /// What the nodes act on.
            #[serde(flatten)]
            pub release: CacheRelease,
        }
    };
}

release_kind!(
    /// The release of a `GKMCache`, in its namespace, named after it.
    GKMCacheReleaseSpec,
    kind = "GKMCacheRelease",
    plural = "gkmcachereleases",
    namespaced,
    shortname = "gkmcr",
    doc = "What the nodes act on for the GKMCache of the same name: written by gkm's operator only, when it changes."
);

release_kind!(
    /// The release of a `ClusterGKMCache`, named after it.
    ClusterGKMCacheReleaseSpec,
    kind = "ClusterGKMCacheRelease",
    plural = "clustergkmcachereleases",
    shortname = "cgkmcr",
    doc = "What the nodes act on for the ClusterGKMCache of the same name: written by gkm's operator only, when it changes."
);

/// What the nodes act on for one cache: the operator copies it from the
/// cache's spec and its own decisions, and writes it only when it changes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheRelease {
    /// The cache's `spec.image`: the repository the nodes pull from.
    pub image: String,
    /// The cache's `spec.nodeSelector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// The cache's `spec.workloadNamespaces` (a ClusterGKMCache's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_namespaces: Option<Vec<NamespaceName>>,
    /// The digest the operator resolved `image` to; absent while unresolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The operator's verdict on `digest`: whether nodes may deliver it.
    #[serde(default)]
    pub deliverable: bool,
    /// Why `digest` may not be delivered (its signatures were not proven, or
    /// not yet); absent when it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The image's variants, each with the GPU targets it was compiled for:
    /// one for a single-target image. Set once `digest` is deliverable and
    /// the operator has read the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variants: Option<Vec<ImageVariant>>,
    /// Why the operator could not read the image's variants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variants_error: Option<String>,
    /// Whether the cache is being deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

impl CacheRelease {
    /// The resolved digest, parsed; `None` while unresolved (or if the field
    /// holds something that is not a digest).
    pub fn resolved(&self) -> Option<Digest> {
        self.digest.as_deref()?.parse().ok()
    }

    /// The variant of the image whose manifest is `digest`.
    pub fn variant(&self, digest: &Digest) -> Option<&ImageVariant> {
        self.variants
            .iter()
            .flatten()
            .find(|v| v.digest == digest.as_str())
    }
}

/// One variant of a cache image: a manifest and the GPU targets its kernels
/// were compiled for (the image's `summary` label).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageVariant {
    /// The manifest's digest.
    pub digest: String,
    /// The distinct targets.
    pub targets: Vec<ImageTarget>,
    /// The CPU ISA a PyTorch cache of C++ kernels was declared built for
    /// (`declared-cpu-isa`, `gkm build --cpu-isa`): a variant without
    /// targets that declares one fits the nodes whose CPU ISA is this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_isa: Option<String>,
}

impl ImageVariant {
    /// The variant `digest` with the targets of `summary`.
    pub fn new(digest: &Digest, summary: &Summary) -> ImageVariant {
        ImageVariant {
            digest: digest.to_string(),
            targets: summary.targets.iter().map(ImageTarget::from).collect(),
            cpu_isa: None,
        }
    }

    /// This variant, declaring the CPU ISA `cpu_isa` its C++ kernels were
    /// built for (none: `None`).
    pub fn with_cpu_isa(mut self, cpu_isa: Option<String>) -> ImageVariant {
        self.cpu_isa = cpu_isa;
        self
    }

    /// Its targets as a summary to check GPUs against, or why one of them
    /// cannot be read.
    pub fn summary(&self) -> Result<Summary, gkm_core::gpu::ParseArchError> {
        let targets = self
            .targets
            .iter()
            .map(Target::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Summary::new(targets))
    }
}

/// One GPU target of a variant, as the image's summary label records it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageTarget {
    /// The compiler backend (`cuda`, `hip`…).
    pub backend: String,
    /// The architecture (`75`, `gfx90a`…).
    pub arch: String,
    /// Threads per warp.
    pub warp_size: u32,
    /// The PTX ISA version (CUDA), e.g. 84 for 8.4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_version: Option<u32>,
    /// The CUDA toolkit version, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// The Triton version, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triton_version: Option<String>,
}

impl From<&Target> for ImageTarget {
    fn from(t: &Target) -> ImageTarget {
        ImageTarget {
            backend: t.backend.to_string(),
            arch: t.arch.to_string(),
            warp_size: t.warp_size,
            ptx_version: t.ptx_version,
            cuda_version: t.cuda_version.clone(),
            triton_version: t.triton_version.clone(),
        }
    }
}

impl TryFrom<&ImageTarget> for Target {
    type Error = gkm_core::gpu::ParseArchError;

    fn try_from(t: &ImageTarget) -> Result<Target, Self::Error> {
        Ok(Target {
            backend: t.backend.parse()?,
            arch: t.arch.parse()?,
            warp_size: t.warp_size,
            ptx_version: t.ptx_version,
            cuda_version: t.cuda_version.clone(),
            triton_version: t.triton_version.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_carries_the_summary_it_was_made_from() {
        let summary = Summary::from_label(
            r#"{"targets":[{"backend":"cuda","arch":"sm_75","warp_size":32,"ptx_version":84},
                {"backend":"hip","arch":"gfx90a","warp_size":64}]}"#,
        )
        .unwrap();
        let digest: Digest =
            "sha256:1111111111111111111111111111111111111111111111111111111111111111"
                .parse()
                .unwrap();
        let variant = ImageVariant::new(&digest, &summary);
        assert_eq!(variant.targets[0].arch, "75");
        assert_eq!(variant.summary().unwrap(), summary);
        let release = CacheRelease {
            variants: Some(vec![variant.clone()]),
            ..CacheRelease::default()
        };
        assert_eq!(release.variant(&digest), Some(&variant));
    }

    #[test]
    fn a_target_that_cannot_be_read_is_an_error_naming_it() {
        let variant = ImageVariant {
            digest: "sha256:11".into(),
            targets: vec![ImageTarget {
                backend: "quantum".into(),
                arch: "75".into(),
                warp_size: 32,
                ..ImageTarget::default()
            }],
            cpu_isa: None,
        };
        let err = variant.summary().unwrap_err();
        assert!(err.to_string().contains("quantum"), "{err}");
    }
}
