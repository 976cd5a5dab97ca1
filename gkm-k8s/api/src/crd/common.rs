//! Types shared by the cache and cache-node kinds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a cache stands, cluster-wide or on one node: GKM's state vocabulary,
/// shown in the `Status` printer column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
pub enum CacheState {
    /// Not yet reconciled.
    #[default]
    Pending,
    /// Being pulled and extracted.
    Downloading,
    /// Extracted; no pod uses it.
    Extracted,
    /// Extracted and mounted by at least one pod.
    Running,
    /// Mounted by a pod, but a newer digest of the image exists.
    Outdated,
    /// Deleted, waiting for the pods that still use it.
    Deleting,
    /// Failed: see the conditions or the node report for why.
    Error,
    /// A workload namespace the cache serves does not exist.
    NoNamespace,
    /// The cache fits no GPU of the node (on a node report), or of any node
    /// that reported it (on a cache): not an error, there is nothing to fix.
    Incompatible,
}

impl CacheState {
    /// The state as its `Status` column reads (`Running`, `NoNamespace`).
    ///
    /// ```
    /// use gkm_k8s_api::crd::CacheState;
    /// assert_eq!(CacheState::NoNamespace.as_str(), "NoNamespace");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Pending => "Pending",
            CacheState::Downloading => "Downloading",
            CacheState::Extracted => "Extracted",
            CacheState::Running => "Running",
            CacheState::Outdated => "Outdated",
            CacheState::Deleting => "Deleting",
            CacheState::Error => "Error",
            CacheState::NoNamespace => "NoNamespace",
            CacheState::Incompatible => "Incompatible",
        }
    }

    /// Whether a node report in this state says the digest's tree is in the
    /// node's store, ready to mount: extracted, mounted, or mounted at an
    /// older digest. The operator counts such nodes, the scheduler extender
    /// prefers them.
    pub fn is_on_node(self) -> bool {
        matches!(
            self,
            CacheState::Extracted | CacheState::Running | CacheState::Outdated
        )
    }
}

/// Per-state node and pod counts (GKM's `counts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheCounts {
    /// Nodes considered (one for a node report).
    pub node_cnt: i32,
    /// Nodes where the cache is extracted and used by a pod.
    pub node_in_use_cnt: i32,
    /// Nodes where the cache is extracted and used by no pod.
    pub node_not_in_use_cnt: i32,
    /// Nodes where the cache could not be delivered: verification, reading
    /// or extraction failed.
    pub node_error_cnt: i32,
    /// Nodes none of whose GPUs the cache fits (GPU-less nodes included).
    #[serde(default)]
    pub node_incompatible_cnt: i32,
    /// Pods mounting the cache.
    pub pod_running_cnt: i32,
    /// Pods mounting a cache whose resource was deleted.
    pub pod_deleting_cnt: i32,
    /// Pods mounting an older digest than the one resolved now.
    pub pod_outdated_cnt: i32,
}

impl CacheCounts {
    /// Whether every node that reported the cache has settled: extracted
    /// (in use or not) or incompatible. A node still reading or extracting
    /// counts in `nodeCnt` but in none of the others.
    pub fn all_settled(&self) -> bool {
        self.node_in_use_cnt + self.node_not_in_use_cnt + self.node_incompatible_cnt
            == self.node_cnt
    }
}

/// Who manages the PVCs in PVC delivery mode (GKM's `pvcOwner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum PvcOwner {
    /// Not evaluated yet.
    #[default]
    Unknown,
    /// The node agent: one PVC per node (ReadWriteOnce).
    Agent,
    /// The operator: one PVC per namespace (ReadOnlyMany).
    Operator,
}

/// A PVC made to hold an extracted cache (GKM's `pvcStatus` values).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcStatus {
    /// The PersistentVolume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv_name: Option<String>,
    /// The PersistentVolumeClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_name: Option<String>,
    /// The Job that filled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Who manages it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_owner: Option<PvcOwner>,
    /// Its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

/// The pod fields gkm copies onto the pods it launches (PVC-filling Jobs).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplate {
    /// Labels and annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// Scheduling fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodTemplateSpec>,
}

/// Labels and annotations for launched pods.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels: at most 64, values of at most 63 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::bounds::labels)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations: at most 64, values of at most 2048 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::bounds::annotations)]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// Scheduling fields for launched pods; no other pod field is accepted.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateSpec {
    /// Node labels the pod must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Taints the pod tolerates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Node and pod affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// The pod's PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
}

/// A pod mounting a cache (GKM's `PodData`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodData {
    /// The pod's namespace.
    #[serde(default)]
    pub pod_namespace: String,
    /// The pod's name.
    #[serde(default)]
    pub pod_name: String,
    /// The CSI volume id the kubelet gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// The image digest the pod mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}
