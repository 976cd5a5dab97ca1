//! What the `gkm.io/pvc-mutation` pod webhook answers in ReadWriteOnce mode.
//! Pure: the server feeds it the pod and the per-node claims it knows.
//!
//! A pod labelled `gkm.io/pvc-mutation: "true"` whose volume claims a
//! ReadWriteOnce cache by the cache's name gets that volume pointed at the
//! claim of the node it is pinned to. The node comes from `spec.nodeName` or
//! from the node affinity a DaemonSet gives its pods (a single
//! `metadata.name` in a required term); a pod whose node cannot be
//! determined, or whose node has no claim, is refused with the reason.
//!
//! The volume is also made `readOnly: true`: a node's claim is shared by
//! every pod on the node, so a pod writing into it would write into all
//! their caches. A pod that writes lays a `gkm view` of the claim into an
//! `emptyDir` (docs/delivery.md, "What a write does").

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::read_only::{gkm_pod, read_only_ops};
use crate::admission::review::Answer;

/// The label a pod opts in with.
pub const MUTATION_LABEL: &str = "gkm.io/pvc-mutation";

/// The claims of ReadWriteOnce caches in the pod's namespace: cache name →
/// node → claim name.
pub type NodeClaims = BTreeMap<String, BTreeMap<String, String>>;

/// The node a pod is pinned to: `spec.nodeName`, else the single
/// `metadata.name` of every required node-affinity term (how a DaemonSet
/// pins its pods).
pub fn pinned_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(node.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    let mut found: Option<String> = None;
    for term in terms {
        let names: Vec<&String> = term
            .match_fields
            .iter()
            .flatten()
            .filter(|f| f.key == "metadata.name" && f.operator == "In")
            .flat_map(|f| f.values.iter().flatten())
            .collect();
        let [name] = names.as_slice() else {
            return None;
        };
        match &found {
            Some(f) if f != *name => return None,
            _ => found = Some((*name).clone()),
        }
    }
    found
}

/// The answer for `pod`, given the ReadWriteOnce caches' node claims
/// `claims` and the names of every claim gkm filled in the pod's namespace
/// (`shared`, of both modes), which the pod mounts read-only
/// ([`read_only_ops`]).
pub fn mutate(pod: &Pod, claims: &NodeClaims, shared: &BTreeSet<String>) -> Answer {
    if gkm_pod(pod) {
        return Answer::Untouched;
    }
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MUTATION_LABEL))
        .is_some_and(|v| v == "true");
    let mut ops = Vec::new();
    let mut pointed = Vec::new();
    if labelled {
        match node_claim_ops(pod, claims) {
            Ok((node_ops, indices)) => {
                ops = node_ops;
                pointed = indices;
            }
            Err(why) => return Answer::Refuse(why),
        }
    }
    ops.extend(read_only_ops(pod, shared, &pointed));
    if ops.is_empty() {
        Answer::Untouched
    } else {
        Answer::Patch(Value::Array(ops))
    }
}

/// For a labelled pod: the operations pointing each volume that claims a
/// ReadWriteOnce cache by name at its node's claim, read-only, and those
/// volumes' indices; or why the pod is refused.
fn node_claim_ops(pod: &Pod, claims: &NodeClaims) -> Result<(Vec<Value>, Vec<usize>), String> {
    let pod_name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .cloned()
        .unwrap_or_default();
    let mut ops = Vec::new();
    let mut pointed = Vec::new();
    for (index, volume) in volumes.iter().enumerate() {
        let Some(source) = &volume.persistent_volume_claim else {
            continue;
        };
        let Some(by_node) = claims.get(&source.claim_name) else {
            continue;
        };
        let cache = &source.claim_name;
        let Some(node) = pinned_node(pod) else {
            return Err(format!(
                "pod {pod_name} is labelled {MUTATION_LABEL}: \"true\" and mounts cache {cache}, \
                 but its node cannot be determined: ReadWriteOnce caches have a claim per node, \
                 so the pod must be pinned to one node (a DaemonSet pod, or spec.nodeName)"
            ));
        };
        let Some(claim) = by_node.get(&node) else {
            return Err(format!(
                "node {node} has no claim of cache {cache}: its GPUs do not fit the cache, \
                 or the cache is not verified or not yet resolved there"
            ));
        };
        ops.push(json!({
            "op": "replace",
            "path": format!("/spec/volumes/{index}/persistentVolumeClaim/claimName"),
            "value": claim,
        }));
        // The node's claim is shared by every pod on the node: none writes it.
        ops.push(json!({
            "op": "add",
            "path": format!("/spec/volumes/{index}/persistentVolumeClaim/readOnly"),
            "value": true,
        }));
        pointed.push(index);
    }
    Ok((ops, pointed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        labelled: bool,
        node_name: Option<&str>,
        affinity_nodes: &[&[&str]],
        claim: &str,
    ) -> Pod {
        let mut spec = json!({
            "containers": [{"name": "c", "image": "x"}],
            "volumes": [{"name": "other", "emptyDir": {}},
                        {"name": "k", "persistentVolumeClaim": {"claimName": claim}}],
        });
        if let Some(n) = node_name {
            spec["nodeName"] = json!(n);
        }
        if !affinity_nodes.is_empty() {
            let terms: Vec<Value> = affinity_nodes
                .iter()
                .map(|names| json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": names}]}))
                .collect();
            spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
        }
        let labels = if labelled {
            json!({MUTATION_LABEL: "true"})
        } else {
            json!({})
        };
        serde_json::from_value(json!({"metadata": {"name": "p", "labels": labels}, "spec": spec}))
            .expect("pod")
    }

    #[test]
    fn answers() {
        let claims: NodeClaims = BTreeMap::from([(
            "cache".to_string(),
            BTreeMap::from([
                ("n1".to_string(), "cache-aaa".to_string()),
                ("n2".to_string(), "cache-bbb".to_string()),
            ]),
        )]);
        let patched = |claim: &str| {
            Answer::Patch(json!([{"op": "replace",
                "path": "/spec/volumes/1/persistentVolumeClaim/claimName", "value": claim},
                {"op": "add", "path": "/spec/volumes/1/persistentVolumeClaim/readOnly",
                 "value": true}]))
        };
        let cases: Vec<(&str, Pod, Result<Answer, &str>)> = vec![
            (
                "unlabelled pods are never touched",
                pod(false, Some("n1"), &[], "cache"),
                Ok(Answer::Untouched),
            ),
            (
                "other claims are left alone",
                pod(true, Some("n1"), &[], "data"),
                Ok(Answer::Untouched),
            ),
            (
                "a DaemonSet pod gets its node's claim",
                pod(true, None, &[&["n2"]], "cache"),
                Ok(patched("cache-bbb")),
            ),
            (
                "nodeName works too",
                pod(true, Some("n1"), &[], "cache"),
                Ok(patched("cache-aaa")),
            ),
            (
                "no node: refused",
                pod(true, None, &[], "cache"),
                Err("cannot be determined"),
            ),
            (
                "two candidate nodes: refused",
                pod(true, None, &[&["n1", "n2"]], "cache"),
                Err("cannot be determined"),
            ),
            (
                "terms naming different nodes: refused",
                pod(true, None, &[&["n1"], &["n2"]], "cache"),
                Err("cannot be determined"),
            ),
            (
                "an unlabelled pod naming a node's claim mounts it read-only",
                pod(false, Some("n1"), &[], "cache-aaa"),
                Ok(Answer::Patch(json!([{"op": "add",
                    "path": "/spec/volumes/1/persistentVolumeClaim/readOnly", "value": true}]))),
            ),
            (
                "a node without a claim: refused",
                pod(true, Some("n3"), &[], "cache"),
                Err("node n3 has no claim of cache cache"),
            ),
        ];
        let shared = BTreeSet::from(["cache-aaa".to_string(), "cache-bbb".to_string()]);
        for (what, pod, want) in cases {
            let got = mutate(&pod, &claims, &shared);
            match want {
                Ok(answer) => assert_eq!(got, answer, "{what}"),
                Err(needle) => match got {
                    Answer::Refuse(message) => {
                        assert!(message.contains(needle), "{what}: {message}")
                    }
                    other => panic!("{what}: {other:?}"),
                },
            }
        }
    }
}
