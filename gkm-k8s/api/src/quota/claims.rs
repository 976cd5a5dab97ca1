//! GPUs a namespace holds through DRA, as its GPU-model quotas count them.
//!
//! Every gkm DeviceClass (gkm-gpu, the model classes, each cache's class)
//! selects the same `gpu.gkm.io` devices, so a quota per class bounds
//! nothing: a GPU is counted here by what was allocated, whatever class
//! asked for it. A claim's allocation names each device by its pool and
//! name; gkm's DRA plugin names a node's pool after the node (and the
//! chart's policy holds it to that), so the pool says which node, and so
//! which model, a device is on. Each device counts once, however many
//! claims of the namespace share it.
//!
//! A pod asking for `nvidia.com/gpu` (or another extended resource) that a
//! DeviceClass serves through DRA gets a claim for it, named in its status
//! (`extendedResourceClaimStatus`): those GPUs are counted from the claim,
//! not again from the pod's resources ([`served_by_claims`]).

use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::dra::DRIVER;

/// A device allocated through DRA: its pool (the node's name) and its name
/// in the pool.
pub type AllocatedDevice = (String, String);

/// The `gpu.gkm.io` devices `claim` is allocated, by pool and name.
pub fn allocated(claim: &ResourceClaim) -> impl Iterator<Item = AllocatedDevice> + '_ {
    claim
        .status
        .iter()
        .filter_map(|s| s.allocation.as_ref())
        .filter_map(|a| a.devices.as_ref())
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver == DRIVER)
        .map(|r| (r.pool.clone(), r.device.clone()))
}

/// The names of the claims `pod` uses: those its spec names, those made
/// for it from templates and the one made for its extended resources (its
/// status).
pub fn claims_of(pod: &Pod) -> HashSet<String> {
    let mut names = HashSet::new();
    let spec_claims = pod
        .spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten());
    names.extend(spec_claims.filter_map(|c| c.resource_claim_name.clone()));
    if let Some(status) = &pod.status {
        let made = status.resource_claim_statuses.iter().flatten();
        names.extend(made.filter_map(|c| c.resource_claim_name.clone()));
        if let Some(extended) = &status.extended_resource_claim_status {
            names.insert(extended.resource_claim_name.clone());
        }
    }
    names
}

/// The extended resources of `pod` that a DRA claim serves (its status'
/// `extendedResourceClaimStatus`): counted from the claim's allocation,
/// not from the pod's resources.
pub fn served_by_claims(pod: &Pod) -> HashSet<String> {
    pod.status
        .iter()
        .filter_map(|s| s.extended_resource_claim_status.as_ref())
        .flat_map(|e| e.request_mappings.iter())
        .map(|m| m.resource_name.clone())
        .collect()
}

/// The distinct `gpu.gkm.io` devices on `model_nodes` allocated to
/// `claims`.
pub fn devices_on<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    model_nodes: &HashSet<String>,
) -> BTreeSet<AllocatedDevice> {
    claims
        .into_iter()
        .flat_map(allocated)
        .filter(|(pool, _)| model_nodes.contains(pool))
        .collect()
}

/// Whole GPUs on `model_nodes` held through DRA by `pod`'s claims
/// (`asked`), and by the namespace's other claims (`held`, each device
/// once and none counted in both).
pub fn split(pod: &Pod, claims: &[ResourceClaim], model_nodes: &HashSet<String>) -> (i64, i64) {
    let own = claims_of(pod);
    let is_own = |c: &&ResourceClaim| c.metadata.name.as_ref().is_some_and(|n| own.contains(n));
    let asked = devices_on(claims.iter().filter(is_own), model_nodes);
    let held = devices_on(claims.iter().filter(|c| !is_own(c)), model_nodes);
    let held = held.difference(&asked).count();
    (count(asked.len()), count(held))
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(name: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .unwrap_or_default()
    }

    fn result(pool: &str, device: &str) -> serde_json::Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": pool, "device": device})
    }

    #[test]
    fn each_device_counts_once_and_only_gkms_on_the_models_nodes() {
        let nodes: HashSet<String> = ["h100-a".to_string(), "h100-b".to_string()].into();
        let claims = [
            claim("through-gkm-gpu", json!([result("h100-a", "gpu-0")])),
            // Another class, the same device (shared), and a second one.
            claim(
                "through-a-cache-class",
                json!([result("h100-a", "gpu-0"), result("h100-b", "gpu-1")]),
            ),
            // Another driver's device, and a device on another model's node.
            claim(
                "other",
                json!([
                    {"request": "nic", "driver": "nic.example.com", "pool": "h100-a", "device": "nic-0"},
                    result("a100-a", "gpu-0"),
                ]),
            ),
            // Not allocated.
            claim("pending", json!([])),
        ];
        let devices = devices_on(&claims, &nodes);
        assert_eq!(
            devices.into_iter().collect::<Vec<_>>(),
            vec![
                ("h100-a".to_string(), "gpu-0".to_string()),
                ("h100-b".to_string(), "gpu-1".to_string()),
            ]
        );
    }

    #[test]
    fn a_pods_claims_are_what_it_asks_and_the_rest_what_is_held() {
        let nodes: HashSet<String> = ["h100-a".to_string()].into();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"containers": [], "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
            "status": {
                "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x7k2p"}],
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "train-extended-resources-abcde",
                    "requestMappings": [{"containerName": "main",
                                         "resourceName": "nvidia.com/gpu",
                                         "requestName": "container-0-request-0"}]},
            },
        }))
        .unwrap_or_default();
        let claims = [
            claim("train-gpu-x7k2p", json!([result("h100-a", "gpu-0")])),
            claim(
                "train-extended-resources-abcde",
                json!([result("h100-a", "gpu-1")]),
            ),
            // Another pod's claim sharing gpu-0 and holding gpu-2.
            claim(
                "other",
                json!([result("h100-a", "gpu-0"), result("h100-a", "gpu-2")]),
            ),
        ];
        assert_eq!(split(&pod, &claims, &nodes), (2, 1));
        assert_eq!(
            served_by_claims(&pod),
            HashSet::from(["nvidia.com/gpu".to_string()])
        );
    }
}
