//! Which claim volumes of a pod the pvc-mutation webhook makes
//! `readOnly: true`: every volume naming a claim gkm filled (a
//! ReadOnlyMany claim, shared by every pod of the namespace, or a node's
//! ReadWriteOnce claim, shared by every pod on the node), so no workload
//! writes the verified tree others read. Pure.
//!
//! A workload that writes into its cache lays a `gkm view` of the claim into
//! an `emptyDir` instead (docs/delivery.md, "What a write does"). gkm's own
//! fill Jobs, which write the claims, are left alone.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use crate::names::MANAGED_BY;

/// Whether `pod` is one of gkm's own (a fill Job's pod), which writes its
/// claim.
pub fn gkm_pod(pod: &Pod) -> bool {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY.0))
        .is_some_and(|v| v == MANAGED_BY.1)
}

/// The JSON Patch operations making each volume of `pod` that names one of
/// `claims` (gkm's claims in the pod's namespace) read-only, but for the
/// volumes at `skip` and those already read-only. None for gkm's own pods.
pub fn read_only_ops(pod: &Pod, claims: &BTreeSet<String>, skip: &[usize]) -> Vec<Value> {
    if gkm_pod(pod) {
        return Vec::new();
    }
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .enumerate()
        .filter(|(index, _)| !skip.contains(index))
        .filter_map(|(index, volume)| {
            let source = volume.persistent_volume_claim.as_ref()?;
            let shared = claims.contains(&source.claim_name) && source.read_only != Some(true);
            shared.then(|| {
                json!({"op": "add",
                       "path": format!("/spec/volumes/{index}/persistentVolumeClaim/readOnly"),
                       "value": true})
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(labels: Value, volumes: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": volumes}}))
        .expect("pod")
    }

    #[test]
    fn every_volume_naming_a_gkm_claim_is_made_read_only() {
        let claims = BTreeSet::from(["kernels".to_string(), "kernels-n1".to_string()]);
        let volumes = json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "a", "persistentVolumeClaim": {"claimName": "kernels"}},
            {"name": "b", "persistentVolumeClaim": {"claimName": "kernels-n1", "readOnly": false}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "kernels", "readOnly": true}},
            {"name": "d", "emptyDir": {}},
        ]);
        let ops = read_only_ops(&pod(json!({}), volumes.clone()), &claims, &[]);
        let paths: Vec<&str> = ops.iter().filter_map(|o| o["path"].as_str()).collect();
        assert_eq!(
            paths,
            [
                "/spec/volumes/1/persistentVolumeClaim/readOnly",
                "/spec/volumes/2/persistentVolumeClaim/readOnly"
            ]
        );
        assert!(ops.iter().all(|o| o["value"] == true && o["op"] == "add"));
        assert_eq!(
            read_only_ops(&pod(json!({}), volumes.clone()), &claims, &[1]).len(),
            1
        );
        // A fill Job's pod writes its claim.
        let fill = pod(json!({MANAGED_BY.0: MANAGED_BY.1}), volumes);
        assert!(read_only_ops(&fill, &claims, &[]).is_empty());
    }
}
