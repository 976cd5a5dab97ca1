//! `GKMGPUQuota` (namespaced): how many GPUs, and how much of shared GPUs, of
//! each model the pods of a namespace may hold. The scheduler extender
//! enforces it at bind and writes the use into its status; the operator's
//! admission webhook enforces it for pods that name their node and binds
//! by any other scheduler. Both decide with [`crate::quota::check`].

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Limits per GPU model. Every quota of a namespace applies: a pod fits only
/// if it breaks none.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "gkm.io",
    version = "v1alpha1",
    kind = "GKMGPUQuota",
    plural = "gkmgpuquotas",
    namespaced,
    status = "GpuQuotaStatus",
    shortname = "gkmq",
    category = "gkm",
    doc = "Caps the GPUs (whole, and shared cores and memory) of each GPU model that the pods of a namespace may hold; enforced by gkm's scheduler extender.",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GKMGPUQuotaSpec {
    /// One entry per GPU model.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(l, self.exists_one(m, m.model == l.model))")
        .message("limits must not repeat a model"))]
    pub limits: Vec<GpuModelLimit>,
}

/// The caps for one GPU model. An unset cap is no cap.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuModelLimit {
    /// The model: the value of the nodes' GPU product label
    /// (`gkm.io/gpu.product`, written by gkm's agent), e.g.
    /// `NVIDIA-A100-SXM4-80GB`.
    #[schemars(length(min = 1, max = 63))]
    pub model: String,
    /// Whole GPUs (`nvidia.com/gpu`, `amd.com/gpu`, passthrough GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub gpus: Option<i64>,
    /// Shared-GPU cores (`gkm.io/gpu-cores`), in percent of one GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub cores: Option<i64>,
    /// Shared-GPU memory (`gkm.io/gpu-memory`), in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub memory: Option<i64>,
}

/// What the namespace holds now, per model the quota names.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuQuotaStatus {
    /// Use per model, in the order of `spec.limits`.
    #[serde(default)]
    pub used: Vec<GpuModelUse>,
    /// `EnforcedAtAdmission` (the operator's): whether the admission
    /// webhooks judge the namespace's pods too, and if not, how to make
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
}

/// What the pods of the namespace hold on nodes of one model: bound pods and
/// pods the extender has reserved room for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuModelUse {
    /// The model.
    pub model: String,
    /// Whole GPUs.
    pub gpus: i64,
    /// Shared-GPU cores, in percent of one GPU.
    pub cores: i64,
    /// Shared-GPU memory, in MiB.
    pub memory: i64,
}
