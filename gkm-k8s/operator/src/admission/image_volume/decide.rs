//! What the `image-volume.gkm.io` pod webhook answers: image volumes
//! (Kubernetes 1.36) that name a gkm cache get the cache's verified digest
//! and the pod a node constraint to the nodes whose GPUs fit it. Pure: the
//! server ([`super`]) feeds it the pod and what it
//! read of the caches the pod names.
//!
//! A pod names a cache with an `image` volume whose reference is the
//! placeholder [`PLACEHOLDER_PREFIX`]`<cache name>`. The placeholder's host
//! is in `.invalid` (RFC 2606), a name that never resolves: a pod that
//! reached no webhook fails to pull rather than pulling someone's image.
//! The cache is the pod namespace's `GKMCache` of that name, else the
//! `ClusterGKMCache` of that name when its `workloadNamespaces` allow the
//! namespace (none listed: every namespace), the rules CSI delivery
//! mounts by.
//!
//! The answer is a refusal naming the volume and the cache when the cache
//! is missing, not the namespace's to use, not resolved, not verified (the
//! operator's verdict on the resolved digest), a multi-target image (the
//! runtime would pick its variant by platform, not by GPU), or fits no node. Otherwise
//! the reference becomes `<repository>@<digest>` (a pod never mounts a tag)
//! and every required node-affinity term gains `metadata.name In <the nodes
//! whose agents report the digest fitting their GPUs>` (a term is added when
//! there is none): the scheduler evaluates that by itself, without gkm's
//! extender, and the kubelet checks it again at admission, so the pod runs
//! only where the cache fits. Node names rather than GPU labels: the agents'
//! fit is the whole check (driver, toolkit and PTX versions, every GPU of a
//! mixed node), which labels describing a node's first GPU cannot express.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
};
use serde_json::{Value, json};

use crate::admission::review::Answer;
use gkm_k8s_api::crd::CacheStatus;

/// The reference prefix of an image volume that names a gkm cache.
pub const PLACEHOLDER_PREFIX: &str = "gkm.invalid/cache/";

/// What the webhook read of one cache a pod names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheFacts {
    /// `GKMCache` or `ClusterGKMCache`.
    pub kind: &'static str,
    /// `spec.image`.
    pub image: String,
    /// `spec.workloadNamespaces` (a `ClusterGKMCache`'s; `None`: every namespace).
    pub workload_namespaces: Option<Vec<String>>,
    /// The status the operator wrote.
    pub status: Option<CacheStatus>,
    /// The nodes whose agents report the resolved digest fitting their GPUs.
    pub fit_nodes: BTreeSet<String>,
}

/// The caches the pod's image volumes name, by volume index.
pub fn requests(pod: &Pod) -> Vec<(usize, String)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .enumerate()
        .filter_map(|(index, v)| {
            let reference = v.image.as_ref()?.reference.as_deref()?;
            let name = reference.strip_prefix(PLACEHOLDER_PREFIX)?;
            Some((index, name.to_string()))
        })
        .collect()
}

/// The registry reference of `image` pinned to `digest`, or why it has none.
fn pinned(image: &str, digest: &str) -> Result<String, String> {
    let reference: gkm_oci::ImageRef = image
        .parse()
        .map_err(|e| format!("its image {image:?} is not a reference: {e}"))?;
    let digest = digest
        .parse()
        .map_err(|e| format!("its resolved digest {digest:?} is not a digest: {e}"))?;
    match reference.with_digest(&digest) {
        r @ gkm_oci::ImageRef::Registry(_) => Ok(r.to_string()),
        gkm_oci::ImageRef::Layout { .. } => Err(format!(
            "its image {image} is an OCI layout directory, which the kubelet cannot pull: \
             image volumes need a registry image"
        )),
    }
}

/// The digest `facts` may be mounted at, or why it may not be.
fn verified_digest(facts: &CacheFacts) -> Result<String, String> {
    let status = facts.status.as_ref();
    let Some(digest) = status.and_then(|s| s.resolved_digest.clone()) else {
        return Err(
            "it is not resolved yet: the operator has not resolved its image to a digest"
                .to_string(),
        );
    };
    let verification = status.and_then(|s| s.verification.as_ref());
    if !verification.is_some_and(|v| v.admits(&digest)) {
        let why = verification
            .and_then(|v| v.message.clone())
            .unwrap_or_else(|| "no verdict yet".to_string());
        return Err(format!(
            "its digest {digest} is not verified ({why}); only a digest the operator verified is mounted"
        ));
    }
    if status.is_some_and(|s| s.variants.is_some()) {
        // The runtime picks an index's manifest by platform, and every
        // variant is linux/amd64: it would not take the node's variant.
        return Err(format!(
            "its digest {digest} is a multi-target image, whose variant a container runtime \
             cannot pick by GPU; mount it with a csi.gkm.io volume, which serves each node its variant"
        ));
    }
    Ok(digest)
}

/// The answer for `pod` in `namespace`, given what was read of each cache it
/// names (`None`: no such cache).
pub fn admit(pod: &Pod, namespace: &str, caches: &BTreeMap<String, Option<CacheFacts>>) -> Answer {
    let requests = requests(pod);
    if requests.is_empty() {
        return Answer::Untouched;
    }
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .cloned()
        .unwrap_or_default();
    let mut ops = Vec::new();
    let mut nodes: Option<BTreeSet<String>> = None;
    for (index, name) in &requests {
        let volume = volumes.get(*index).map_or("", |v| v.name.as_str());
        let refuse = |why: String| {
            Answer::Refuse(format!(
                "image volume {volume:?} names gkm cache {name}, but {why}"
            ))
        };
        let Some(Some(facts)) = caches.get(name) else {
            return refuse(format!(
                "there is no GKMCache {name} in namespace {namespace} and no ClusterGKMCache {name} \
                 this namespace may use"
            ));
        };
        if let Some(allowed) = &facts.workload_namespaces
            && !allowed.iter().any(|n| n == namespace)
        {
            return refuse(format!(
                "ClusterGKMCache {name}'s workloadNamespaces ({}) do not include namespace {namespace}",
                allowed.join(", ")
            ));
        }
        let reference = match verified_digest(facts).and_then(|d| pinned(&facts.image, &d)) {
            Ok(reference) => reference,
            Err(why) => return refuse(format!("{} {name}: {why}", facts.kind)),
        };
        if facts.fit_nodes.is_empty() {
            return refuse(format!(
                "no node's agent reports {} {name}'s digest fitting its GPUs",
                facts.kind
            ));
        }
        nodes = Some(match nodes {
            None => facts.fit_nodes.clone(),
            Some(n) => n.intersection(&facts.fit_nodes).cloned().collect(),
        });
        ops.push(json!({"op": "replace",
            "path": format!("/spec/volumes/{index}/image/reference"), "value": reference}));
    }
    let nodes = nodes.unwrap_or_default();
    if nodes.is_empty() {
        return Answer::Refuse(format!(
            "no node fits every gkm cache the pod's image volumes name ({})",
            requests
                .iter()
                .map(|(_, n)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let spec = pod.spec.clone().unwrap_or_default();
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty())
        && !nodes.contains(node)
    {
        return Answer::Refuse(format!(
            "the pod names node {node}, whose GPUs the gkm caches its image volumes name do not fit \
             (they fit: {})",
            nodes.iter().cloned().collect::<Vec<_>>().join(", ")
        ));
    }
    ops.push(json!({"op": "add", "path": "/spec/affinity",
        "value": constrained(spec.affinity.unwrap_or_default(), &nodes)}));
    Answer::Patch(Value::Array(ops))
}

/// `affinity` with every required node-affinity term also requiring the
/// node to be one of `nodes` (terms are ORed, so each one gains it).
fn constrained(mut affinity: Affinity, nodes: &BTreeSet<String>) -> Affinity {
    let requirement = NodeSelectorRequirement {
        key: "metadata.name".into(),
        operator: "In".into(),
        values: Some(nodes.iter().cloned().collect()),
    };
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    let required = node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_fields
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
    affinity
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::VerificationStatus;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn pod(node_name: Option<&str>, affinity: Option<Value>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "nodeName": node_name,
                "affinity": affinity,
                "containers": [{"name": "c", "image": "x"}],
                "volumes": [{"name": "scratch", "emptyDir": {}},
                            {"name": "kernels", "image": {"reference": "gkm.invalid/cache/vector-add"}},
                            {"name": "other", "image": {"reference": "registry.example/tools:1"}}],
            },
        }))
        .expect("pod")
    }

    fn facts(verified: bool, nodes: &[&str]) -> CacheFacts {
        CacheFacts {
            kind: "GKMCache",
            image: "127.0.0.1:5000/gkm/vector-add:cuda".into(),
            workload_namespaces: None,
            status: Some(CacheStatus {
                resolved_digest: Some(DIGEST.into()),
                verification: Some(VerificationStatus {
                    verified,
                    digest: Some(DIGEST.into()),
                    message: (!verified).then(|| "no signature of a policy signer".into()),
                    ..VerificationStatus::default()
                }),
                ..CacheStatus::default()
            }),
            fit_nodes: nodes.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn caches(f: Option<CacheFacts>) -> BTreeMap<String, Option<CacheFacts>> {
        BTreeMap::from([("vector-add".to_string(), f)])
    }

    fn refusal(answer: Answer) -> String {
        match answer {
            Answer::Refuse(m) => m,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn only_placeholder_volumes_are_requests() {
        assert_eq!(
            requests(&pod(None, None)),
            vec![(1, "vector-add".to_string())]
        );
    }

    #[test]
    fn a_verified_cache_is_pinned_and_the_pod_kept_to_fitting_nodes() {
        let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}},
            "podAntiAffinity": {}});
        let Answer::Patch(patch) = admit(
            &pod(None, Some(affinity)),
            "team-a",
            &caches(Some(facts(true, &["n1", "n2"]))),
        ) else {
            panic!("not patched")
        };
        assert_eq!(patch[0]["path"], "/spec/volumes/1/image/reference");
        assert_eq!(
            patch[0]["value"],
            format!("127.0.0.1:5000/gkm/vector-add@{DIGEST}")
        );
        let affinity = &patch[1]["value"];
        let terms = &affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        for term in terms.as_array().expect("terms") {
            assert_eq!(term["matchExpressions"][0]["key"], "zone", "kept: {term}");
            assert_eq!(
                term["matchFields"][0],
                json!({"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]})
            );
        }
        assert!(
            affinity.get("podAntiAffinity").is_some(),
            "other affinity kept"
        );
        // No affinity at all: one term is made.
        let Answer::Patch(patch) = admit(
            &pod(None, None),
            "team-a",
            &caches(Some(facts(true, &["n1"]))),
        ) else {
            panic!("not patched")
        };
        assert_eq!(
            patch[1]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
        );
    }

    #[test]
    fn refusals_name_the_volume_the_cache_and_why() {
        let cases: Vec<(&str, Pod, Option<CacheFacts>, &str)> = vec![
            (
                "missing",
                pod(None, None),
                None,
                "there is no GKMCache vector-add in namespace team-a",
            ),
            (
                "unverified",
                pod(None, None),
                Some(facts(false, &["n1"])),
                "is not verified (no signature of a policy signer)",
            ),
            (
                "unresolved",
                pod(None, None),
                Some(CacheFacts {
                    status: None,
                    ..facts(true, &["n1"])
                }),
                "not resolved yet",
            ),
            (
                "verdict on another digest",
                pod(None, None),
                Some(CacheFacts {
                    status: Some(CacheStatus {
                        resolved_digest: Some(DIGEST.replace('1', "2")),
                        ..facts(true, &[]).status.unwrap_or_default()
                    }),
                    ..facts(true, &["n1"])
                }),
                "is not verified",
            ),
            (
                "multi-target",
                pod(None, None),
                Some(CacheFacts {
                    status: Some(CacheStatus {
                        variants: Some(Vec::new()),
                        ..facts(true, &[]).status.unwrap_or_default()
                    }),
                    ..facts(true, &["n1"])
                }),
                "is a multi-target image",
            ),
            (
                "no fit",
                pod(None, None),
                Some(facts(true, &[])),
                "fitting its GPUs",
            ),
            (
                "nodeName elsewhere",
                pod(Some("n9"), None),
                Some(facts(true, &["n1"])),
                "the pod names node n9",
            ),
            (
                "namespace not allowed",
                pod(None, None),
                Some(CacheFacts {
                    kind: "ClusterGKMCache",
                    workload_namespaces: Some(vec!["team-b".into()]),
                    ..facts(true, &["n1"])
                }),
                "workloadNamespaces (team-b) do not include namespace team-a",
            ),
            (
                "layout image",
                pod(None, None),
                Some(CacheFacts {
                    image: "oci:/tmp/layout:v1".into(),
                    ..facts(true, &["n1"])
                }),
                "image volumes need a registry image",
            ),
        ];
        for (what, pod, facts, needle) in cases {
            let message = refusal(admit(&pod, "team-a", &caches(facts)));
            assert!(message.contains(needle), "{what}: {message}");
            assert!(
                message.starts_with("image volume \"kernels\" names gkm cache vector-add")
                    || what == "nodeName elsewhere",
                "{what}: {message}"
            );
        }
    }

    #[test]
    fn pods_without_placeholders_are_untouched() {
        let plain: Pod = serde_json::from_value(json!({"spec": {"containers": [],
            "volumes": [{"name": "v", "image": {"reference": "registry.example/x:1"}}]}}))
        .expect("pod");
        assert_eq!(admit(&plain, "ns", &BTreeMap::new()), Answer::Untouched);
    }
}
