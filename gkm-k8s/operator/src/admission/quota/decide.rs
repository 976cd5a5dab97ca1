//! The quota webhook's decision, pure: whether a pod fits its namespace's
//! GPU-model quotas ([`decide`]), and what an admission request is about
//! (`subject`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Binding, Pod};
use kube::ResourceExt;
use serde_json::Value;

use gkm_k8s_api::crd::GpuModelLimit;
use gkm_k8s_api::gpu_request::GpuRequest;
use gkm_k8s_api::quota::{Amount, QuotaExceeded, check, holds_on};

/// Whether `pod` fits its namespace's `quotas` on a node of `model`, given
/// the namespace's `pods` and the names of the nodes of that model
/// (`model_nodes`); the refusal names the quota, the model, the limit and
/// the use. A pod whose GPU request cannot be read is the scheduler's and
/// the device plugin's to refuse, not a quota's.
pub fn decide(
    pod: &Pod,
    model: &str,
    quotas: &[(String, Vec<GpuModelLimit>)],
    pods: &[Pod],
    model_nodes: &HashSet<String>,
    whole_resources: &[String],
) -> Result<(), QuotaExceeded> {
    let amount = |pod: &Pod| {
        GpuRequest::from_pod(pod, whole_resources)
            .ok()
            .map(|r| gkm_k8s_api::quota::amount_of(&r))
            .unwrap_or_default()
    };
    let asked = amount(pod);
    if asked == Amount::default() {
        return Ok(());
    }
    let namespace = pod.namespace().unwrap_or_default();
    let mut used = Amount::default();
    for other in pods {
        if other.name_any() == pod.name_any() {
            continue;
        }
        if holds_on(other).is_some_and(|node| model_nodes.contains(node)) {
            used += amount(other);
        }
    }
    let quotas = quotas.iter().map(|(n, l)| (n.as_str(), l.as_slice()));
    check(&namespace, model, quotas, used, asked)
}

/// What one admission request is about: the pod and the node it would run on.
#[derive(Debug)]
pub(super) enum Subject {
    /// A pod created already naming its node.
    Created(Box<Pod>),
    /// A bind of the pod `name` to a node.
    Bound {
        /// The pod.
        name: String,
        /// The node.
        node: String,
    },
    /// Nothing for a quota (a pod that names no node).
    Nothing,
}

/// Reads the subject of the AdmissionReview `request`.
pub(super) fn subject(request: &Value) -> Result<Subject, String> {
    if request["subResource"].as_str() == Some("binding") {
        let binding: Binding = serde_json::from_value(request["object"].clone())
            .map_err(|e| format!("request.object is not a Binding: {e}"))?;
        let name = request["name"]
            .as_str()
            .map(String::from)
            .or(binding.metadata.name)
            .unwrap_or_default();
        return Ok(Subject::Bound {
            name,
            node: binding.target.name.unwrap_or_default(),
        });
    }
    let pod: Pod = serde_json::from_value(request["object"].clone())
        .map_err(|e| format!("request.object is not a Pod: {e}"))?;
    let names_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    Ok(if names_node {
        Subject::Created(Box::new(pod))
    } else {
        Subject::Nothing
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>, gpus: i64, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
            "status": {"phase": phase},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn pods_on_nodes_of_the_model_count_and_the_refusal_names_the_quota() {
        let quotas = vec![(
            "a100".to_string(),
            vec![GpuModelLimit {
                model: "A100".into(),
                gpus: Some(2),
                ..GpuModelLimit::default()
            }],
        )];
        let nodes: HashSet<String> = ["a1".to_string(), "a2".to_string()].into();
        let resources = gkm_k8s_api::gpu_request::GpuReading::default().whole_resources;
        let pods = vec![
            pod("one", Some("a1"), 1, "Running"),
            pod("other-model", Some("h1"), 4, "Running"),
            pod("done", Some("a2"), 4, "Succeeded"),
            pod("pending", None, 4, "Pending"),
        ];
        let new = pod("two", Some("a2"), 1, "Pending");
        assert_eq!(
            decide(&new, "A100", &quotas, &pods, &nodes, &resources),
            Ok(())
        );
        let mut pods = pods;
        pods.push(new);
        let third = pod("three", Some("a1"), 1, "Pending");
        assert_eq!(
            decide(&third, "A100", &quotas, &pods, &nodes, &resources).map_err(|e| e.to_string()),
            Err("gkm: quota ml/a100 reached: namespace ml holds 2 of 2 GPUs of model A100, the pod asks 1".to_string())
        );
        // The pod being bound is not counted twice.
        let bound = pod("two", None, 1, "Pending");
        assert_eq!(
            decide(&bound, "A100", &quotas, &pods, &nodes, &resources),
            Ok(())
        );
    }

    #[test]
    fn only_binds_and_pods_naming_a_node_are_judged() {
        let binding = json!({"subResource": "binding", "name": "p", "object": {
            "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}});
        assert!(matches!(
            subject(&binding),
            Ok(Subject::Bound { name, node }) if name == "p" && node == "n1"
        ));
        let unbound = json!({"object": {"metadata": {"name": "p"}, "spec": {"containers": []}}});
        assert!(matches!(subject(&unbound), Ok(Subject::Nothing)));
        let named = json!({"object": {"metadata": {"name": "p"},
                                      "spec": {"nodeName": "n1", "containers": []}}});
        assert!(matches!(subject(&named), Ok(Subject::Created(_))));
    }
}
