//! `GKMCache` (namespaced) and `ClusterGKMCache` (cluster): a kernel cache
//! image to deliver to the nodes whose GPUs it fits.

use gkm_core::Digest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::common::{CacheCounts, CacheState, PodTemplate, PvcOwner, PvcStatus};
use super::signature::{SignatureMode, SignaturePolicy};
use super::usage::WorkloadUsage;
use super::validation::{
    DNS1123_LABEL, DNS1123_SUBDOMAIN, DURATION, IMAGE_REFERENCE, MANIFEST_DIGEST,
};

/// What both cache kinds ask for. GKM's fields keep GKM's names, so GKM's
/// YAML applies unchanged; `signature`, `nodeSelector` and `resolveInterval`
/// are gkm's own.
///
/// Without `storageClassName` the cache is delivered through the CSI driver
/// `csi.gkm.io` from each node's store; with it, through GKM's PVC modes.
///
/// Every list, map and string in it is bounded (see [`super::bounds`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::bounds::bound_unbounded)]
pub struct CacheSpec {
    /// The cache image: `registry/path[:tag][@sha256:…]`.
    #[schemars(length(min = 1, max = 525), regex(pattern = IMAGE_REFERENCE))]
    pub image: String,
    /// Labels, annotations and scheduling fields for the pods gkm launches
    /// (PVC-filling Jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodTemplate>,
    /// StorageClass of the PVCs in PVC delivery mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS1123_SUBDOMAIN))]
    pub storage_class_name: Option<String>,
    /// Access modes of the PVCs: `ReadWriteOnce` gives a PVC per node,
    /// `ReadOnlyMany` one per namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4))]
    #[x_kube(validation = Rule::new("self.all(m, self.exists_one(n, n == m))")
        .message("accessModes must not repeat a mode"))]
    pub access_modes: Option<Vec<AccessMode>>,
    /// Namespaces whose workloads may use a cluster cache (ClusterGKMCache
    /// only; required there in PVC mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub workload_namespaces: Option<Vec<NamespaceName>>,
    /// Who must have signed the image; the operator's default policy when
    /// unset. Its signers count only in namespaces the operator's
    /// administrator opted in (`--tenant-signer-namespaces`) and in
    /// ClusterGKMCaches; elsewhere the administrator's signers replace them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignaturePolicy>,
    /// Deliver only to nodes matching this selector (on top of GPU fit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// How often the tag is resolved again to follow a moved tag (`5m`):
    /// from 10s to 168h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s') && duration(self) <= duration('168h')")
        .message("resolveInterval must be a duration from 10s to 168h"))]
    pub resolve_interval: Option<String>,
    /// Digests quarantined by hand (`sha256:…`): no node serves them to new
    /// pods; pods already running keep their view. When the tag points at
    /// one, the cache serves the last digest it served that is not
    /// quarantined and still verified (condition `TagFollowed` false,
    /// reason `Quarantined`), or nothing when there is none. Removing a
    /// digest from the list lets the cache follow its tag to it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(d, self.exists_one(e, e == d))")
        .message("quarantine must not repeat a digest"))]
    pub quarantine: Option<Vec<ManifestDigest>>,
}

impl CacheSpec {
    /// Whether `digest` is quarantined ([`quarantine`](Self::quarantine)).
    pub fn quarantines(&self, digest: &str) -> bool {
        self.quarantine.iter().flatten().any(|d| d.0 == digest)
    }
}

/// An image manifest digest: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct ManifestDigest(
    #[schemars(length(equal = 71), regex(pattern = MANIFEST_DIGEST))] pub String,
);

/// A DNS-1123 label naming a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct NamespaceName(
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS1123_LABEL))] pub String,
);

/// A PersistentVolume access mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AccessMode {
    /// One node reads and writes.
    ReadWriteOnce,
    /// Many nodes read.
    ReadOnlyMany,
    /// Many nodes read and write.
    ReadWriteMany,
    /// One pod reads and writes.
    ReadWriteOncePod,
}

/// Declares a cache kind's spec, `$spec`, with the `kube` attributes that
/// set the two kinds apart (`$kube`) and, declared once here, what they share:
/// the group and version, the status, the category and the printer columns.
macro_rules! cache_kind {
    ($(#[$doc:meta])* $spec:ident, $($kube:tt)*) => {
        $(#[$doc])*
        #[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
        #[kube(
            group = "gkm.io",
            version = "v1alpha1",
            status = "CacheStatus",
            category = "gkm",
            $($kube)*,
            printcolumn(name = "Status", type_ = "string", json_path = ".status.state"),
            printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.counts.nodeCnt"),
            printcolumn(name = "Node-In-Use", type_ = "integer", json_path = ".status.counts.nodeInUseCnt"),
            printcolumn(name = "Node-Not-In-Use", type_ = "integer", json_path = ".status.counts.nodeNotInUseCnt"),
            printcolumn(name = "Node-Error", type_ = "integer", json_path = ".status.counts.nodeErrorCnt"),
            printcolumn(name = "Node-Incompatible", type_ = "integer", json_path = ".status.counts.nodeIncompatibleCnt"),
            printcolumn(name = "Pod-Running", type_ = "integer", json_path = ".status.counts.podRunningCnt"),
            printcolumn(name = "Pod-Outdated", type_ = "integer", json_path = ".status.counts.podOutdatedCnt"),
            printcolumn(name = "Pod-Deleting", type_ = "integer", json_path = ".status.counts.podDeletingCnt", priority = "1"),
            printcolumn(name = "Digest", type_ = "string", json_path = ".status.resolvedDigest", priority = "1"),
            printcolumn(name = "Inert", type_ = "string", json_path = ".status.conditions[?(@.type==\"Inert\")].status", priority = "1"),
            printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
        )]
        pub struct $spec {
            /// The cache.
            #[serde(flatten)]
            pub cache: CacheSpec,
        }
    };
}

cache_kind!(
    /// The namespaced cache kind: delivered to the workloads of its namespace.
    GKMCacheSpec,
    kind = "GKMCache",
    plural = "gkmcaches",
    namespaced,
    shortname = "gkmc",
    doc = "A GPU kernel cache image delivered to the nodes whose GPUs it fits, for the workloads of its namespace.",
    validation = Rule::new("!has(self.spec.workloadNamespaces)")
        .message("spec.workloadNamespaces is only meaningful on a ClusterGKMCache: a GKMCache serves its own namespace")
        .field_path(".spec.workloadNamespaces")
);

cache_kind!(
    /// The cluster cache kind: delivered to the workloads of `workloadNamespaces`.
    ClusterGKMCacheSpec,
    kind = "ClusterGKMCache",
    plural = "clustergkmcaches",
    shortname = "cgkmc",
    doc = "A GPU kernel cache image delivered to the nodes whose GPUs it fits, for workloads in the namespaces it names.",
    validation = Rule::new("!has(self.spec.storageClassName) || (has(self.spec.workloadNamespaces) && size(self.spec.workloadNamespaces) > 0)")
        .message("spec.workloadNamespaces must name at least one namespace when spec.storageClassName is set (PVC mode)")
        .field_path(".spec.workloadNamespaces")
);

/// What the operator observed of a cache, cluster-wide.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheStatus {
    /// The state shown in the Status column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<CacheState>,
    /// The digest `spec.image` resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_digest: Option<String>,
    /// What signature verification proved, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationStatus>,
    /// Who manages PVCs (PVC mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_owner: Option<PvcOwner>,
    /// PVCs by namespace (PVC mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_status: Option<BTreeMap<String, PvcStatus>>,
    /// `Verified`, `Ready`, `Progressing`, `Degraded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// Node and pod counts across the cluster.
    #[serde(default)]
    pub counts: CacheCounts,
    /// Of a multi-target image: each variant, in the index's order, with
    /// how many nodes hold it (extracted there, in use or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variants: Option<Vec<VariantNodes>>,
    /// What the workloads on writable views of the resolved digest
    /// compiled into them, across the nodes: per workload, its pods counted
    /// and its last pod's new entries (the cache's misses for it), the most
    /// recent first. The `Inert` condition says when a workload compiles
    /// more than the cache holds. Read-only volumes, PVCs and image volumes
    /// cannot see misses and are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub workloads: Option<Vec<WorkloadUsage>>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When this status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
}

/// One variant of a multi-target image and the nodes holding it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariantNodes {
    /// The variant's manifest digest.
    pub digest: String,
    /// Its targets (`cuda/90/32`).
    pub targets: Vec<String>,
    /// How many nodes hold it, extracted (in use or not).
    pub nodes: i32,
}

impl CacheStatus {
    /// The digest `spec.image` resolved to, parsed; `None` while unresolved
    /// (or if the field holds something that is not a digest).
    pub fn resolved(&self) -> Option<Digest> {
        self.resolved_digest.as_deref()?.parse().ok()
    }
}

/// The outcome of verifying a cache image's signature, and the operator's
/// verdict on it: the agents and the CSI driver deliver what `deliverable`
/// says and decide nothing themselves. Only the operator writes it: being
/// allowed to write a cache's `status` is being allowed to deliver it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerificationStatus {
    /// Whether a signer of the policy was proven.
    pub verified: bool,
    /// Whether the image may be delivered: verified, or not required to be
    /// by the mode in force. Absent (a status written without it): `verified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliverable: Option<bool>,
    /// The mode in force: the cache's (or the default policy's) as the
    /// operator's floor allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<SignatureMode>,
    /// A fingerprint of the policy in force and its key material; a
    /// verdict is reused only while it is unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// When the signatures were last proven (a verified image only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<Time>,
    /// The digest the signature covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The signature format (`cosign-v2`, `sigstore-bundle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Who signed: a key fingerprint, or issuer and subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// Why verification failed, or a note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl VerificationStatus {
    /// The operator's verdict: may the image be delivered?
    pub fn is_deliverable(&self) -> bool {
        self.deliverable.unwrap_or(self.verified)
    }

    /// Whether the operator's verdict lets `digest` be delivered: the verdict
    /// is about `digest` (not a digest the tag pointed to before) and says
    /// deliverable.
    ///
    /// Deliverability is decided in two steps, each in one place. The
    /// operator decides what signature verification allows and records it
    /// here; this is the one rule a node reads it by. The agent then adds
    /// what only the node knows (a GPU fits, the digest is extracted) in
    /// `agent::plan` and publishes the outcome as a
    /// `Delivery` (`gkm_k8s_node::delivery`), whose `is_deliverable` is all
    /// the CSI driver checks before a mount.
    pub fn admits(&self, digest: &str) -> bool {
        self.digest.as_deref() == Some(digest) && self.is_deliverable()
    }
}

#[cfg(test)]
mod tests {
    use super::VerificationStatus;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const OLD: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn a_verdict_admits_only_the_digest_it_is_about() {
        let verified = VerificationStatus {
            verified: true,
            deliverable: Some(true),
            digest: Some(DIGEST.into()),
            ..Default::default()
        };
        assert!(verified.admits(DIGEST));
        assert!(!verified.admits(OLD), "a verdict on another digest");
        assert!(!VerificationStatus::default().admits(DIGEST), "no verdict");

        // Not verified but not enforced (Audit, Off): deliverable.
        let audited = VerificationStatus {
            verified: false,
            deliverable: Some(true),
            ..verified.clone()
        };
        assert!(audited.admits(DIGEST));
        // Enforced and not verified: not deliverable.
        let refused = VerificationStatus {
            verified: false,
            deliverable: Some(false),
            ..verified.clone()
        };
        assert!(!refused.admits(DIGEST));
        // A status without a verdict: `verified` decides.
        let older = VerificationStatus {
            deliverable: None,
            ..verified
        };
        assert!(older.admits(DIGEST));
    }
}
