//! The quota webhook's decision, pure: whether a pod fits its namespace's
//! GPU-model quotas ([`decide`]), whether its node's model is known at all
//! ([`model_known`]), and what an admission request is about (`bound`,
//! `created`).

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Binding, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;

use gkm_k8s_api::crd::GpuModelLimit;
use gkm_k8s_api::quota::{Amount, QuotaExceeded, amount_of_pod, check, usage};

/// Why a pod asking GPUs in a namespace under GPU-model quotas is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It would take the namespace over a quota.
    #[error("{0}")]
    Exceeded(QuotaExceeded),
    /// Its node's GPU model is not known, so no quota can be judged.
    #[error(
        "gkm: the GPU-model quotas of namespace {namespace} cannot be judged for pod {pod} \
         on node {node:?}: {why}; gkm's agent labels a node {label}=<model> once it has found \
         its GPUs, so create the pod once it has, or let the scheduler place it"
    )]
    ModelUnknown {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The node it names or is bound to.
        node: String,
        /// The label naming a node's GPU model.
        label: String,
        /// What is unknown: no such node, or no label.
        why: &'static str,
    },
}

impl From<QuotaExceeded> for Refusal {
    fn from(exceeded: QuotaExceeded) -> Refusal {
        Refusal::Exceeded(exceeded)
    }
}

/// Whether the model of the node `node` that `pod` names or is bound to
/// is known (`labels`: the node's labels, `None` when there is no such
/// node): a pod asking GPUs (by extended resource, `whole_resources`, or
/// DRA claims) on a node that is not there yet or carries no `label` would
/// be counted against no quota, so it is refused until the agent has
/// labelled the node. A pod asking none is not the quota's business.
pub fn model_known(
    pod: &Pod,
    node: &str,
    labels: Option<&std::collections::BTreeMap<String, String>>,
    label: &str,
    whole_resources: &[String],
) -> Result<(), Refusal> {
    let asks = amount_of_pod(pod, whole_resources) != Amount::default()
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
    let why = match labels {
        _ if !asks => return Ok(()),
        None => "no such node",
        Some(labels) if labels.get(label).is_some_and(|m| !m.is_empty()) => return Ok(()),
        Some(_) => "the node has no GPU-model label",
    };
    Err(Refusal::ModelUnknown {
        namespace: pod.namespace().unwrap_or_default(),
        pod: pod.name_any(),
        node: node.to_string(),
        label: label.to_string(),
        why,
    })
}

/// Whether `pod` fits its namespace's `quotas` on a node of `model`, given
/// the namespace's `pods` and the names of the nodes of that model
/// (`model_nodes`); the refusal names the quota, the model, the limit and
/// the use. A pod whose GPU request cannot be read is the scheduler's and
/// the device plugin's to refuse, not a quota's. GPUs allocated through
/// DRA claims are not counted: [`decide_with_claims`] counts them.
pub fn decide(
    pod: &Pod,
    model: &str,
    quotas: &[(String, Vec<GpuModelLimit>)],
    pods: &[Pod],
    model_nodes: &HashSet<String>,
    whole_resources: &[String],
) -> Result<(), QuotaExceeded> {
    decide_with_claims(pod, model, quotas, pods, &[], model_nodes, whole_resources)
}

/// [`decide`], with the namespace's ResourceClaims (`claims`): every GPU
/// on a node of `model` allocated to one of them counts once, whatever
/// DeviceClass asked for it, to `pod` when the claim is the pod's and to
/// the namespace's use otherwise ([`gkm_k8s_api::quota::usage`]).
pub fn decide_with_claims(
    pod: &Pod,
    model: &str,
    quotas: &[(String, Vec<GpuModelLimit>)],
    pods: &[Pod],
    claims: &[ResourceClaim],
    model_nodes: &HashSet<String>,
    whole_resources: &[String],
) -> Result<(), QuotaExceeded> {
    let (used, asked) = usage(pod, pods, claims, model_nodes, whole_resources);
    if asked == Amount::default() {
        return Ok(());
    }
    let namespace = pod.namespace().unwrap_or_default();
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

/// The subject of a bind of the pod `name` (the request's, else the
/// Binding's own) by `binding`.
pub(super) fn bound(name: Option<String>, binding: Binding) -> Subject {
    Subject::Bound {
        name: name.or(binding.metadata.name).unwrap_or_default(),
        node: binding.target.name.unwrap_or_default(),
    }
}

/// The subject of the creation of `pod`: judged only when it names its node.
pub(super) fn created(pod: Pod) -> Subject {
    let names_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    if names_node {
        Subject::Created(Box::new(pod))
    } else {
        Subject::Nothing
    }
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

    fn claim(name: &str, node: &str, device: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.gkm.io", "pool": node, "device": device}]}}},
        }))
        .unwrap_or_default()
    }

    #[test]
    fn a_gpu_allocated_through_any_class_counts_once_against_the_quota() {
        let quotas = vec![(
            "h100".to_string(),
            vec![GpuModelLimit {
                model: "H100".into(),
                gpus: Some(1),
                ..GpuModelLimit::default()
            }],
        )];
        let nodes: HashSet<String> = ["h1".to_string()].into();
        let resources = gkm_k8s_api::gpu_request::GpuReading::default().whole_resources;
        // One H100 held through the model class, the same one shared by a
        // claim through a cache class: one GPU held.
        let claims = vec![
            claim("through-the-model-class", "h1", "gpu-0"),
            claim("through-a-cache-class", "h1", "gpu-0"),
        ];
        let holder = pod("holder", Some("h1"), 0, "Running");
        let plain = pod("plain", Some("h1"), 1, "Pending");
        assert_eq!(
            decide_with_claims(&plain, "H100", &quotas, std::slice::from_ref(&holder), &claims, &nodes, &resources)
                .map_err(|e| e.to_string()),
            Err("gkm: quota ml/h100 reached: namespace ml holds 1 of 1 GPUs of model H100, the pod asks 1".to_string())
        );
        // A pod being bound with a claim allocated a second H100 through a
        // cache class, no GPU in its resources: refused.
        let mut second: Pod = serde_json::from_value(json!({
            "metadata": {"name": "second", "namespace": "ml"},
            "spec": {"nodeName": "h1", "containers": [{"name": "c"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "cached"}]},
            "status": {"phase": "Pending", "resourceClaimStatuses": [
                {"name": "gpu", "resourceClaimName": "second-gpu-x7k2p"}]},
        }))
        .unwrap_or_default();
        let mut with_second = claims.clone();
        with_second.push(claim("second-gpu-x7k2p", "h1", "gpu-1"));
        assert!(
            decide_with_claims(
                &second,
                "H100",
                &quotas,
                std::slice::from_ref(&holder),
                &with_second,
                &nodes,
                &resources
            )
            .is_err()
        );
        // Alone, its claim's GPU is the namespace's one: it fits, and the
        // claim is not counted again as held.
        let alone = vec![claim("second-gpu-x7k2p", "h1", "gpu-1")];
        assert_eq!(
            decide_with_claims(&second, "H100", &quotas, &[], &alone, &nodes, &resources),
            Ok(())
        );
        // An nvidia.com/gpu a DeviceClass serves through DRA counts from its
        // claim, not twice.
        if let Some(spec) = second.spec.as_mut() {
            spec.containers[0] = serde_json::from_value(json!(
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}))
            .unwrap_or_default();
        }
        if let Some(status) = second.status.as_mut() {
            status.resource_claim_statuses = None;
            status.extended_resource_claim_status = serde_json::from_value(json!({
                "resourceClaimName": "second-gpu-x7k2p",
                "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu",
                                     "requestName": "container-0-request-0"}]}))
            .ok();
        }
        assert_eq!(
            decide_with_claims(&second, "H100", &quotas, &[], &alone, &nodes, &resources),
            Ok(())
        );
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
    fn a_pod_asking_gpus_on_a_node_of_unknown_model_is_refused_naming_the_label() {
        let label = "gkm.io/gpu.product";
        let whole = ["nvidia.com/gpu".to_string()];
        let asking = pod("p", Some("n1"), 1, "Pending");
        let labelled = [(label.to_string(), "A100".to_string())].into();
        assert_eq!(
            model_known(&asking, "n1", Some(&labelled), label, &whole),
            Ok(())
        );
        for (labels, why) in [
            (None, "no such node"),
            (Some(Default::default()), "the node has no GPU-model label"),
            (
                Some([(label.to_string(), String::new())].into()),
                "the node has no GPU-model label",
            ),
        ] {
            let refusal = model_known(&asking, "n1", labels.as_ref(), label, &whole)
                .expect_err("an unknown model is refused");
            let text = refusal.to_string();
            assert!(text.contains(why) && text.contains(label), "{text}");
            assert!(
                text.contains("namespace ml") && text.contains("pod p "),
                "{text}"
            );
        }
        // A pod asking no GPU is not judged.
        let plain = pod("q", Some("n1"), 0, "Pending");
        assert_eq!(model_known(&plain, "n1", None, label, &whole), Ok(()));
    }

    #[test]
    fn only_binds_and_pods_naming_a_node_are_judged() {
        let binding: Binding = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}))
        .expect("a Binding");
        assert!(matches!(
            bound(None, binding),
            Subject::Bound { name, node } if name == "p" && node == "n1"
        ));
        let pod = |spec| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("a Pod")
        };
        assert!(matches!(
            created(pod(json!({"containers": []}))),
            Subject::Nothing
        ));
        assert!(matches!(
            created(pod(json!({"nodeName": "n1", "containers": []}))),
            Subject::Created(_)
        ));
    }
}
