//! What a pod asks of GPUs: whole GPUs per resource, a share of one GPU, and
//! the gkm caches it mounts, read as the scheduler reads it; shared by the
//! scheduler extender and the operator's quota webhook.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cache_object::CacheKey;
use gkm_k8s_node::volume::{ATTR_CACHE, ATTR_CLUSTER_CACHE, ATTR_NAMESPACE, DRIVER_NAME};

/// Shared-GPU cores, in percent of one GPU.
pub const GPU_CORES: &str = "gkm.io/gpu-cores";
/// Shared-GPU memory, in MiB.
pub const GPU_MEMORY: &str = "gkm.io/gpu-memory";
/// The cores of one GPU.
pub const CORES_PER_GPU: i64 = gkm_core::assignment::CORES_PER_GPU;
/// The node label naming the GPU model, written by gkm's agent.
pub const DEFAULT_MODEL_LABEL: &str = "gkm.io/gpu.product";
/// The extended resources counted as whole GPUs unless configured.
pub const DEFAULT_WHOLE_RESOURCES: &[&str] = &["nvidia.com/gpu", "amd.com/gpu"];

/// How GPUs are read from pods and nodes: which extended resources count as
/// whole GPUs, and which node label names the GPU model quotas are kept by.
/// Whatever enforces a quota (the scheduler extender, the operator's quota
/// webhook) must read the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReading {
    /// Extended resources counted as whole GPUs.
    pub whole_resources: Vec<String>,
    /// The node label naming the GPU model quotas are kept by.
    pub model_label: String,
}

impl Default for GpuReading {
    fn default() -> Self {
        GpuReading {
            whole_resources: DEFAULT_WHOLE_RESOURCES
                .iter()
                .map(|r| r.to_string())
                .collect(),
            model_label: DEFAULT_MODEL_LABEL.to_string(),
        }
    }
}

/// Why a pod's GPU request cannot be scheduled at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// A GPU resource is not a whole number.
    #[error("{resource}: {value:?} is not a whole number")]
    NotWhole {
        /// The resource.
        resource: String,
        /// Its quantity as written.
        value: String,
    },
    /// More than one GPU's cores, not in whole GPUs.
    #[error(
        "{GPU_CORES}: {0} is more than one GPU ({CORES_PER_GPU}) but not a multiple of it; ask for a share of one GPU or for whole GPUs"
    )]
    CoresSplit(i64),
}

/// A gkm cache a pod mounts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheUse {
    /// A `csi.gkm.io` inline volume naming the cache.
    Volume(CacheKey),
    /// A PersistentVolumeClaim of the pod's namespace, which may be one gkm
    /// filled with a cache (PVC delivery mode).
    Claim {
        /// The pod's namespace.
        namespace: String,
        /// The claim's name.
        claim: String,
    },
}

/// A pod's GPU needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuRequest {
    /// Whole GPUs per extended resource (only resources asked for).
    pub whole: BTreeMap<String, i64>,
    /// Shared-GPU cores, percent of one GPU (`gkm.io/gpu-cores`).
    pub cores: i64,
    /// Shared-GPU memory in MiB (`gkm.io/gpu-memory`).
    pub memory: i64,
    /// The gkm caches it mounts.
    pub caches: Vec<CacheUse>,
}

impl GpuRequest {
    /// Reads `pod`'s requests of `whole_resources` and of the shared-GPU
    /// resources, and its gkm cache volumes.
    ///
    /// As the scheduler does, a pod needs the sum of its containers' requests
    /// (a limit stands for a missing request) or the largest init
    /// container's, whichever is larger.
    pub fn from_pod(pod: &Pod, whole_resources: &[String]) -> Result<GpuRequest, RequestError> {
        let mut request = GpuRequest::default();
        let Some(spec) = &pod.spec else {
            return Ok(request);
        };
        let names = whole_resources
            .iter()
            .map(String::as_str)
            .chain([GPU_CORES, GPU_MEMORY]);
        for name in names {
            let sum = spec
                .containers
                .iter()
                .map(|c| asked(c, name))
                .sum::<Result<i64, _>>()?;
            let init = spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| asked(c, name))
                .collect::<Result<Vec<i64>, _>>()?
                .into_iter()
                .max()
                .unwrap_or(0);
            let amount = sum.max(init);
            match name {
                GPU_CORES => request.cores = amount,
                GPU_MEMORY => request.memory = amount,
                _ if amount > 0 => {
                    request.whole.insert(name.to_string(), amount);
                }
                _ => {}
            }
        }
        if request.cores > CORES_PER_GPU && request.cores % CORES_PER_GPU != 0 {
            return Err(RequestError::CoresSplit(request.cores));
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        request.caches = cache_uses(pod, &namespace);
        Ok(request)
    }

    /// Whether the pod asks for no GPU at all.
    pub fn is_empty(&self) -> bool {
        self.whole.is_empty() && self.cores == 0 && self.memory == 0
    }

    /// Whole GPUs asked for, over every whole-GPU resource.
    pub fn gpus(&self) -> i64 {
        self.whole.values().sum()
    }

    /// Whether the pod asks for a share of GPUs.
    pub fn is_shared(&self) -> bool {
        self.cores > 0 || self.memory > 0
    }
}

/// A container's request of `resource` (its limit when no request is set).
fn asked(container: &Container, resource: &str) -> Result<i64, RequestError> {
    let Some(resources) = &container.resources else {
        return Ok(0);
    };
    let quantity = resources
        .requests
        .as_ref()
        .and_then(|r| r.get(resource))
        .or_else(|| resources.limits.as_ref().and_then(|l| l.get(resource)));
    quantity.map_or(Ok(0), |q| whole_number(resource, q))
}

/// A quantity of an extended resource: a whole number, possibly with a
/// decimal (`k`, `M`, `G`) or binary (`Ki`, `Mi`, `Gi`) suffix.
pub fn whole_number(resource: &str, quantity: &Quantity) -> Result<i64, RequestError> {
    let text = quantity.0.trim();
    let not_whole = || RequestError::NotWhole {
        resource: resource.to_string(),
        value: quantity.0.clone(),
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '+'))
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let factor: i64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => return Err(not_whole()),
    };
    digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(not_whole)
}

/// The gkm caches `pod` mounts: `csi.gkm.io` volumes and claims.
fn cache_uses(pod: &Pod, namespace: &str) -> Vec<CacheUse> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let mut uses = Vec::new();
    for volume in volumes {
        if let Some(claim) = &volume.persistent_volume_claim {
            uses.push(CacheUse::Claim {
                namespace: namespace.to_string(),
                claim: claim.claim_name.clone(),
            });
        }
        let Some(csi) = volume.csi.as_ref().filter(|c| c.driver == DRIVER_NAME) else {
            continue;
        };
        let attributes = csi.volume_attributes.clone().unwrap_or_default();
        let attr = |key: &str| attributes.get(key).filter(|v| !v.is_empty()).cloned();
        let key = match (attr(ATTR_CACHE), attr(ATTR_CLUSTER_CACHE)) {
            (Some(name), None) => CacheKey::namespaced(
                attr(ATTR_NAMESPACE).unwrap_or_else(|| namespace.to_string()),
                name,
            ),
            (None, Some(name)) => CacheKey::cluster(name),
            // The CSI driver refuses such volumes with the reason; the pod
            // cannot start anywhere, so placement does not matter.
            _ => continue,
        };
        uses.push(CacheUse::Volume(key));
    }
    uses.sort();
    uses.dedup();
    uses
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap_or_default()
    }

    fn whole() -> Vec<String> {
        vec!["nvidia.com/gpu".into(), "amd.com/gpu".into()]
    }

    #[test]
    fn sums_containers_and_takes_the_larger_init_container() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                    {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1", "gkm.io/gpu-memory": "2Ki"}}},
                ],
            },
        }));
        let r = GpuRequest::from_pod(&p, &whole()).unwrap_or_default();
        assert_eq!(r.whole, BTreeMap::from([("nvidia.com/gpu".to_string(), 3)]));
        assert_eq!((r.cores, r.memory), (0, 2048));
        assert!(r.is_shared());
    }

    #[test]
    fn a_pod_without_gpus_asks_nothing() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": "500m"}}}]}}));
        let r = GpuRequest::from_pod(&p, &whole());
        assert!(r.is_ok_and(|r| r.is_empty()));
    }

    #[test]
    fn refuses_fractions_and_split_cores() {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}}));
        assert!(matches!(
            GpuRequest::from_pod(&p, &whole()),
            Err(RequestError::NotWhole { .. })
        ));
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"gkm.io/gpu-cores": "150"}}}]}}));
        assert_eq!(
            GpuRequest::from_pod(&p, &whole()),
            Err(RequestError::CoresSplit(150))
        );
    }

    #[test]
    fn reads_cache_volumes_and_claims() {
        let p = pod(
            json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {
            "containers": [{"name": "a"}],
            "volumes": [
                {"name": "k", "csi": {"driver": "csi.gkm.io", "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}},
                {"name": "c", "csi": {"driver": "csi.gkm.io", "volumeAttributes": {"csi.gkm.io/ClusterGKMCache": "shared"}}},
                {"name": "o", "csi": {"driver": "other.csi", "volumeAttributes": {"csi.gkm.io/GKMCache": "x"}}},
                {"name": "v", "persistentVolumeClaim": {"claimName": "kernels"}},
            ]}}),
        );
        let r = GpuRequest::from_pod(&p, &whole()).unwrap_or_default();
        assert_eq!(
            r.caches,
            vec![
                CacheUse::Volume(CacheKey::namespaced("ml", "vector-add")),
                CacheUse::Volume(CacheKey::cluster("shared")),
                CacheUse::Claim {
                    namespace: "ml".into(),
                    claim: "kernels".into()
                },
            ]
        );
    }
}
