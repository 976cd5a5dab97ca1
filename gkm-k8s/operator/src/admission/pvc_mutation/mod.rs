//! The `gkm.io/pvc-mutation` pod webhook the operator serves for
//! ReadWriteOnce caches: a labelled pod whose claim names the cache is
//! pointed at the claim of its node ([`decide`], pure). Every pod mounting
//! a claim gkm filled, of either mode, mounts it read-only
//! ([`read_only`], pure): the tree is shared, never the pod's to write.
//!
//! Its MutatingWebhookConfiguration ([`configuration`]): only pods labelled
//! `gkm.io/pvc-mutation: "true"` are sent to the webhook
//! (`objectSelector`), so no other pod ever waits on it. For those pods the
//! failure policy is `Fail`: a labelled pod admitted unchanged would name a
//! claim that does not exist and never start, so refusing it with the
//! webhook's error is the clearer outcome, and the DaemonSet controller
//! retries once the webhook is back.
//!
//! Its second webhook, [`READ_ONLY_WEBHOOK_NAME`], gets every other pod
//! with a claim volume (CEL `matchConditions`), but gkm's own fill pods,
//! and makes its gkm claim volumes read-only. Its failure policy is
//! `Ignore`: it sees pods that may have nothing to do with gkm, which must
//! not be refused because gkm is down (a down webhook delays them by its
//! 5 s timeout at most); a pod admitted past it still finds the filled
//! tree owned by the fill user and not writable by its own (see
//! docs/delivery.md, "What a write does").
//!
//! Serving it: an AdmissionReview in, the [`mutate`] answer out,
//! with the per-node claims read from a watched index of gkm's node claims
//! (started by the first pod, which waits for its first list), not a list
//! of them per pod.

pub mod decide;
pub mod read_only;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

use self::decide::MUTATION_LABEL;
use self::decide::{NodeClaims, mutate};
use super::endpoint::{Endpoint, client_config};
use super::hook::{AdmissionHook, ReviewFuture};
use super::review::{Answer, log_answer, pod_review, response};
use crate::names::{
    CACHE_LABEL, CACHE_NAME_ANNOTATION, KIND_LABEL, MANAGED_BY, NODE_LABEL, NODE_NAME_ANNOTATION,
    labelled_name,
};
use gkm_k8s_runtime::watched_index::{self, Entry, Indexed, ObjectId};

/// The configuration's name.
pub const CONFIGURATION_NAME: &str = "gkm-pvc-mutation";
/// The webhook's name within it.
pub const WEBHOOK_NAME: &str = "pvc-mutation.gkm.io";
/// The path the webhook serves.
pub const MUTATE_PATH: &str = "/mutate-pods";
/// The webhook, in the same configuration, that makes every other pod's
/// gkm claim volumes read-only.
pub const READ_ONLY_WEBHOOK_NAME: &str = "claim-read-only.gkm.io";

/// The CEL condition that sends a pod to [`READ_ONLY_WEBHOOK_NAME`]: one of
/// its volumes is a claim.
pub fn claim_condition() -> String {
    "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.persistentVolumeClaim))"
        .to_string()
}

/// The server-side apply body of the configuration; `ca_bundle` is the PEM
/// the apiserver trusts for the webhook (none when cert-manager injects it).
pub fn configuration(endpoint: &Endpoint, ca_bundle: Option<&str>) -> Value {
    let client = client_config(endpoint, MUTATE_PATH, ca_bundle);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION_NAME,
                     "labels": {"app.kubernetes.io/name": "gkm-operator",
                                "app.kubernetes.io/part-of": "gkm"}},
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {MUTATION_LABEL: "true"}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
        }, {
            "name": READ_ONLY_WEBHOOK_NAME,
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "objectSelector": {"matchExpressions": [
                {"key": MUTATION_LABEL, "operator": "NotIn", "values": ["true"]},
                {"key": MANAGED_BY.0, "operator": "NotIn", "values": [MANAGED_BY.1]}]},
            "matchConditions": [{"name": "mounts-a-claim", "expression": claim_condition()}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
            "reinvocationPolicy": "Never",
        }],
    })
}

/// What is kept of one of gkm's claims, found by its namespace.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeClaim {
    /// The cache it holds.
    cache: String,
    /// The node it is for (a ReadWriteOnce claim's); `None`: a
    /// ReadOnlyMany claim.
    node: Option<String>,
    /// Whether a `GKMCache` (not a `ClusterGKMCache`) made it.
    namespaced: bool,
}

/// A node claim gkm made, found by its namespace; `None` for other claims.
pub(crate) fn node_claim(claim: &PersistentVolumeClaim) -> Option<Entry<String, NodeClaim>> {
    let labels = claim.labels();
    if labels.get(MANAGED_BY.0).map(String::as_str) != Some(MANAGED_BY.1) {
        return None;
    }
    Some(Entry::one(
        claim.namespace()?,
        NodeClaim {
            cache: labelled_name(claim.meta(), CACHE_LABEL, CACHE_NAME_ANNOTATION)?,
            node: labelled_name(claim.meta(), NODE_LABEL, NODE_NAME_ANNOTATION),
            namespaced: labels.get(KIND_LABEL).map(String::as_str) == Some("GKMCache"),
        },
    ))
}

/// The claims of one namespace as the webhook reads them: cache → node →
/// claim. A `GKMCache`'s claims win over a `ClusterGKMCache`'s of the same
/// name.
pub(crate) fn node_claims(claims: Vec<(ObjectId, NodeClaim)>) -> NodeClaims {
    let mut out: NodeClaims = BTreeMap::new();
    let mut namespaced: BTreeMap<(String, String), bool> = BTreeMap::new();
    for ((_, name), claim) in claims {
        let Some(node) = claim.node else {
            continue;
        };
        let id = (claim.cache.clone(), node.clone());
        if namespaced.get(&id) == Some(&true) && !claim.namespaced {
            continue;
        }
        namespaced.insert(id, claim.namespaced);
        out.entry(claim.cache).or_default().insert(node, name);
    }
    out
}

/// The names of gkm's claims of one namespace, of both modes.
pub(crate) fn claim_names(claims: &[(ObjectId, NodeClaim)]) -> BTreeSet<String> {
    claims.iter().map(|((_, name), _)| name.clone()).collect()
}

/// How long a pod waits for the first list of the claims.
const FIRST_LIST: Duration = Duration::from_secs(8);

/// gkm's node claims, by namespace, kept by a watch of their own.
struct WatchedClaims {
    claims: Arc<Indexed<String, NodeClaim>>,
    watch: tokio::task::AbortHandle,
}

impl Drop for WatchedClaims {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

/// The webhook's HTTP routes.
pub struct MutationRoutes {
    client: Client,
    /// gkm's node claims, watched from the first pod on.
    claims: tokio::sync::OnceCell<WatchedClaims>,
}

impl MutationRoutes {
    /// Answers with the claims `client` reads.
    pub fn new(client: Client) -> MutationRoutes {
        MutationRoutes {
            client,
            claims: tokio::sync::OnceCell::new(),
        }
    }

    /// The claims gkm made in `namespace`: the ReadWriteOnce ones by cache
    /// and node, and the names of all; the watch starts on the first call.
    async fn node_claims(&self, namespace: &str) -> Result<(NodeClaims, BTreeSet<String>), String> {
        let watched = self
            .claims
            .get_or_init(|| async {
                let selector = format!("{CACHE_LABEL},{}={}", MANAGED_BY.0, MANAGED_BY.1);
                let api = Api::<PersistentVolumeClaim>::all(self.client.clone());
                let config = watcher::Config::default().labels(&selector);
                let claims = Arc::new(Indexed::default());
                let watch = watched_index::keep(api, config, claims.clone(), node_claim, |_| {});
                WatchedClaims { claims, watch }
            })
            .await;
        tokio::time::timeout(FIRST_LIST, watched.claims.wait_until_listed())
            .await
            .map_err(|_| format!("no list of the cache claims in {FIRST_LIST:?}"))?;
        let claims = watched.claims.under(&namespace.to_string());
        let names = claim_names(&claims);
        Ok((node_claims(claims), names))
    }

    async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let (uid, pod, namespace) = pod_review(body)?;
        let answer = match self.node_claims(&namespace).await {
            Ok((claims, names)) => mutate(&pod, &claims, &names),
            Err(e) => Answer::Refuse(format!(
                "gkm could not read the cache claims of {namespace}: {e}"
            )),
        };
        log_answer(
            &namespace,
            &pod,
            &answer,
            "pointed a pod at its node's claim",
        );
        Ok(response(&uid, &answer))
    }
}

impl AdmissionHook for MutationRoutes {
    fn path(&self) -> &'static str {
        MUTATE_PATH
    }

    fn review<'a>(&'a self, body: &'a [u8]) -> ReviewFuture<'a> {
        Box::pin(self.review(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, labels: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team", "labels": labels},
        }))
        .expect("a claim")
    }

    #[test]
    fn a_namespace_s_node_claims_come_from_gkm_s_claims_and_its_own_caches_win() {
        let gkm = |cache: &str, node: &str, kind: &str| {
            json!({CACHE_LABEL: cache, NODE_LABEL: node, KIND_LABEL: kind,
                   MANAGED_BY.0: MANAGED_BY.1})
        };
        let index = Indexed::default();
        for (name, labels) in [
            ("own-n1", gkm("c", "n1", "GKMCache")),
            ("cluster-n1", gkm("c", "n1", "ClusterGKMCache")),
            ("cluster-n2", gkm("c", "n2", "ClusterGKMCache")),
            ("other-n1", gkm("d", "n1", "ClusterGKMCache")),
            ("foreign", json!({CACHE_LABEL: "c", NODE_LABEL: "n3"})),
            (
                "shared",
                json!({CACHE_LABEL: "e", KIND_LABEL: "GKMCache", MANAGED_BY.0: MANAGED_BY.1}),
            ),
        ] {
            index.observe(&watcher::Event::Apply(claim(name, labels)), node_claim);
        }
        let names = claim_names(&index.under(&"team".to_string()));
        assert_eq!(
            names.iter().map(String::as_str).collect::<Vec<_>>(),
            ["cluster-n1", "cluster-n2", "other-n1", "own-n1", "shared"]
        );
        let claims = node_claims(index.under(&"team".to_string()));
        assert_eq!(
            claims,
            BTreeMap::from([
                (
                    "c".to_string(),
                    BTreeMap::from([
                        ("n1".to_string(), "own-n1".to_string()),
                        ("n2".to_string(), "cluster-n2".to_string()),
                    ])
                ),
                (
                    "d".to_string(),
                    BTreeMap::from([("n1".to_string(), "other-n1".to_string())])
                ),
            ])
        );
        assert!(node_claims(index.under(&"elsewhere".to_string())).is_empty());
    }

    #[test]
    fn the_chart_sends_the_same_pods() {
        crate::admission::assert_chart_sends(READ_ONLY_WEBHOOK_NAME, &claim_condition());
    }

    #[test]
    fn only_labelled_pods_reach_the_webhook() {
        let body = configuration(
            &Endpoint::Url("https://127.0.0.1:9443/".into()),
            Some("PEM"),
        );
        let hook = &body["webhooks"][0];
        assert_eq!(
            hook["objectSelector"]["matchLabels"][MUTATION_LABEL],
            "true"
        );
        assert_eq!(
            hook["clientConfig"]["url"],
            "https://127.0.0.1:9443/mutate-pods"
        );
        assert_eq!(hook["clientConfig"]["caBundle"], "UEVN");
        assert_eq!(hook["failurePolicy"], "Fail");
        // Every other pod with a claim, but gkm's own, for read-only claims.
        let read_only = &body["webhooks"][1];
        assert_eq!(read_only["name"], READ_ONLY_WEBHOOK_NAME);
        assert_eq!(read_only["failurePolicy"], "Ignore");
        assert_eq!(read_only["clientConfig"], hook["clientConfig"]);
        assert_eq!(
            read_only["objectSelector"]["matchExpressions"][1],
            json!({"key": MANAGED_BY.0, "operator": "NotIn", "values": [MANAGED_BY.1]})
        );
        let _: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_json::from_value(body).expect("a valid object");
        let service = Endpoint::Service {
            namespace: "gkm-system".into(),
            name: "gkm-operator-webhook".into(),
            port: 443,
        };
        let body = configuration(&service, None);
        assert_eq!(
            body["webhooks"][0]["clientConfig"]["service"]["path"],
            MUTATE_PATH
        );
        assert!(
            body["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none()
        );
    }
}
