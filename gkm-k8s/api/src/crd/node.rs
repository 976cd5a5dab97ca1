//! `GKMCacheNode` / `ClusterGKMCacheNode`: one per node, written by that node's
//! agent, reporting its GPUs and every cache on it.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};

use super::common::{CacheCounts, CacheState, PodData, PvcStatus};
use super::usage::WorkloadUsage;

/// Declares a node kind's (empty) spec, `$spec`, with the `kube` attributes
/// that set the two kinds apart (`$kube`) and, declared once here, what they
/// share: the group and version, the status, the category and the printer
/// columns.
macro_rules! node_kind {
    ($(#[$doc:meta])* $spec:ident, $($kube:tt)*) => {
        $(#[$doc])*
        #[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, JsonSchema)]
        #[kube(
            group = "gkm.io",
            version = "v1alpha1",
            status = "CacheNodeStatus",
            category = "gkm",
            $($kube)*,
            printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
            printcolumn(
                name = "Node-In-Use",
                type_ = "integer",
                json_path = ".status.counts.nodeInUseCnt"
            ),
            printcolumn(
                name = "Node-Not-In-Use",
                type_ = "integer",
                json_path = ".status.counts.nodeNotInUseCnt"
            ),
            printcolumn(
                name = "Node-Error",
                type_ = "integer",
                json_path = ".status.counts.nodeErrorCnt"
            ),
            printcolumn(
                name = "Node-Incompatible",
                type_ = "integer",
                json_path = ".status.counts.nodeIncompatibleCnt"
            ),
            printcolumn(
                name = "Pod-Running",
                type_ = "integer",
                json_path = ".status.counts.podRunningCnt"
            ),
            printcolumn(
                name = "Pod-Outdated",
                type_ = "integer",
                json_path = ".status.counts.podOutdatedCnt"
            ),
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        pub struct $spec {}
    };
}

node_kind!(
    /// Node reports have no spec: the agent owns their status. The object is
    /// named after its node. As in GKM, `spec` may be left out or null (GKM's
    /// own samples write `spec:` with nothing under it): it reads as empty.
    GKMCacheNodeSpec,
    kind = "GKMCacheNode",
    plural = "gkmcachenodes",
    namespaced,
    shortname = "gkmcn",
    doc = "One node's report on the GKMCaches of its namespace: the node's GPUs and, per cache and digest, its state."
);

node_kind!(
    /// The cluster-scoped node report, for ClusterGKMCaches. As in GKM, `spec`
    /// may be left out or null: it reads as empty.
    ClusterGKMCacheNodeSpec,
    kind = "ClusterGKMCacheNode",
    plural = "clustergkmcachenodes",
    shortname = "cgkmcn",
    doc = "One node's report on the ClusterGKMCaches: the node's GPUs and, per cache and digest, its state."
);

/// Reads an empty spec from anything, including a missing or null `spec`:
/// serde asks a missing field for an option, which reads as `None`.
fn empty_spec<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    Option::<IgnoredAny>::deserialize(d).map(|_| ())
}

impl<'de> Deserialize<'de> for GKMCacheNodeSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        empty_spec(d).map(|()| GKMCacheNodeSpec {})
    }
}

impl<'de> Deserialize<'de> for ClusterGKMCacheNodeSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        empty_spec(d).map(|()| ClusterGKMCacheNodeSpec {})
    }
}

/// A node kind's CRD with `spec` no longer required at the top level, so
/// the apiserver accepts GKM's spec-less node objects.
pub(super) fn spec_optional(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        let schema = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut());
        if let Some(schema) = schema {
            if let Some(required) = schema.required.as_mut() {
                required.retain(|field| field != "spec");
            }
            if schema.required.as_ref().is_some_and(Vec::is_empty) {
                schema.required = None;
            }
        }
    }
    crd
}

/// A node's report.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheNodeStatus {
    /// The node.
    #[serde(default)]
    pub node_name: String,
    /// Counts for this node (nodeCnt is 1).
    #[serde(default)]
    pub counts: CacheCounts,
    /// The node's GPUs, grouped by type as GKM does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuStatus>>,
    /// The vector ISA PyTorch Inductor picks on the node's CPU (`avx2`,
    /// `avx512`…), what caches of C++ kernels only are judged by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_isa: Option<String>,
    /// Per cache name, per image digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caches: Option<BTreeMap<String, BTreeMap<String, NodeCacheStatus>>>,
    /// Conditions of the agent on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

/// GPUs of one type on a node (GKM's `GpuStatus`), plus gkm's target fields.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuStatus {
    /// Product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Driver version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Indexes of the GPUs of this type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<i32>>,
    /// Compiler backend (`cuda`, `hip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Architecture (`75`, `gfx90a`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Threads per warp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warp_size: Option<i32>,
}

/// One cache digest on a node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCacheStatus {
    /// Where the cache stands on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<CacheState>,
    /// GPU ids the cache fits.
    #[serde(
        default,
        rename = "compatibleGPUs",
        skip_serializing_if = "Option::is_none"
    )]
    pub compatible_gpus: Option<Vec<i32>>,
    /// GPU ids the cache does not fit.
    #[serde(
        default,
        rename = "incompatibleGPUs",
        skip_serializing_if = "Option::is_none"
    )]
    pub incompatible_gpus: Option<Vec<i32>>,
    /// Why, per incompatible GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incompatible_reasons: Option<Vec<IncompatibleGpu>>,
    /// A human-readable account of the state (errors, refusals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The variant of a multi-target image this node holds: its manifest
    /// digest, the one its GPUs get (absent for a single-target image,
    /// which is its own variant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Extracted size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_size: Option<i64>,
    /// Pods mounting it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Vec<PodData>>,
    /// PVCs by namespace (PVC mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_status: Option<BTreeMap<String, PvcStatus>>,
    /// What the workloads whose pods' writable views of this digest ended
    /// on this node compiled into them: the cache's misses, per workload,
    /// the most recent first ([`crate::workloads`]). Read-only volumes
    /// cannot see misses and are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub workloads: Option<Vec<WorkloadUsage>>,
    /// When this entry last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
}

/// Why a cache does not fit one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IncompatibleGpu {
    /// The GPU id.
    pub id: i32,
    /// Every reason.
    pub reasons: Vec<String>,
}
