//! The `gkm.io/v1alpha1` custom resources.
//!
//! - [`GKMCache`] and [`ClusterGKMCache`]: a cache image to deliver, with
//!   GKM's field names so GKM's YAML applies unchanged.
//! - [`GKMCacheNode`] and [`ClusterGKMCacheNode`]: one per node, written by
//!   that node's agent.
//! - [`GKMCacheRelease`] and [`ClusterGKMCacheRelease`]: one per cache,
//!   written by the operator: what the nodes act on.
//! - [`GKMCacheCapture`]: a workload's warmed cache, captured from its
//!   capture volume into a signed image.
//! - [`GKMGPUQuota`]: the GPUs of each model a namespace may hold, enforced
//!   by the scheduler extender.
//!
//! Validation is in the schema (OpenAPI and CEL), so the apiserver rejects an
//! invalid object with a message naming the field.
//!
//! ```
//! let yaml = gkm_k8s_api::crd::crds_yaml().unwrap();
//! assert!(yaml.contains("name: gkmcaches.gkm.io"));
//! ```

// kube's `printcolumn(...)` attributes repeat keys such as `type_` by design.
#![allow(clippy::duplicated_attributes)]

pub mod bounds;
mod cache;
mod capture;
mod common;
mod node;
mod quota;
mod release;
mod signature;
mod usage;
pub mod validation;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use cache::{
    AccessMode, CacheSpec, CacheStatus, ClusterGKMCache, ClusterGKMCacheSpec, GKMCache,
    GKMCacheSpec, ManifestDigest, NamespaceName, VariantNodes, VerificationStatus,
};
pub use capture::{
    BYTE_SIZE, CaptureFramework, CapturePhase, CaptureSignatureFormat, CaptureSigning,
    CaptureStatus, DEFAULT_CAPTURE_MAX_BYTES, DEFAULT_CAPTURE_MAX_FILES, GKMCacheCapture,
    GKMCacheCaptureSpec,
};
pub use common::{
    CacheCounts, CacheState, PodData, PodTemplate, PodTemplateSpec, PvcOwner, PvcStatus,
    TemplateMetadata,
};
pub use gkm_core::duration::{
    MAX_RESOLVE_INTERVAL, MIN_RESOLVE_INTERVAL, parse_duration, resolve_interval,
};
pub use node::{
    CacheNodeStatus, ClusterGKMCacheNode, ClusterGKMCacheNodeSpec, GKMCacheNode, GKMCacheNodeSpec,
    GpuStatus, IncompatibleGpu, NodeCacheStatus,
};
pub use quota::{GKMGPUQuota, GKMGPUQuotaSpec, GpuModelLimit, GpuModelUse, GpuQuotaStatus};
pub use release::{
    CacheRelease, ClusterGKMCacheRelease, ClusterGKMCacheReleaseSpec, GKMCacheRelease,
    GKMCacheReleaseSpec, ImageTarget, ImageVariant,
};
pub use signature::{
    ConfigMapKeyRef, KeySigner, KeylessSigner, SecretKeyRef, SignatureMode, SignaturePolicy,
    Signer, UnknownSignatureMode,
};
pub use usage::WorkloadUsage;

/// Every gkm CRD, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        GKMCache::crd(),
        ClusterGKMCache::crd(),
        node::spec_optional(GKMCacheNode::crd()),
        node::spec_optional(ClusterGKMCacheNode::crd()),
        GKMCacheRelease::crd(),
        ClusterGKMCacheRelease::crd(),
        GKMGPUQuota::crd(),
        GKMCacheCapture::crd(),
    ]
}

/// Every CRD as one multi-document YAML stream, as `gkm crds` prints it.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
