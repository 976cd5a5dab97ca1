//! Serving the webhook: an AdmissionReview in, the [`mutate`] answer out,
//! with the per-node claims read from a watched index of gkm's node claims
//! (started by the first pod, which waits for its first list), not a list
//! of them per pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::{Method, StatusCode};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::config::MUTATE_PATH;
use crate::pvc::mutation::{Answer, NodeClaims, mutate};
use crate::pvc::objects::{
    CACHE_LABEL, CACHE_NAME_ANNOTATION, KIND_LABEL, MANAGED_BY, NODE_LABEL, NODE_NAME_ANNOTATION,
    labelled_name,
};
use crate::watched_index::{self, Entry, Indexed, ObjectId};
use gkm_k8s_runtime::endpoints::{ResponseFuture, Routes, text};

/// The AdmissionReview response for the request `review` and `answer`.
pub fn response(review: &Value, answer: &Answer) -> Value {
    let uid = review["request"]["uid"].clone();
    let mut response = json!({"uid": uid, "allowed": true});
    match answer {
        Answer::Untouched => {}
        Answer::Patch(patch) => {
            response["patchType"] = json!("JSONPatch");
            response["patch"] =
                json!(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
        }
        Answer::Refuse(message) => {
            response["allowed"] = json!(false);
            response["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

/// The AdmissionReview in `body` about a pod: the review, the pod and the
/// pod's namespace; or what is wrong with the request.
pub(super) fn pod_review(body: &[u8]) -> Result<(Value, Pod, String), String> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
    let request = &review["request"];
    let pod: Pod = serde_json::from_value(request["object"].clone())
        .map_err(|e| format!("request.object is not a Pod: {e}"))?;
    let namespace = request["namespace"]
        .as_str()
        .map(String::from)
        .or_else(|| pod.namespace())
        .unwrap_or_default();
    Ok((review, pod, namespace))
}

/// Logs a pod webhook's `answer` for `pod` in `namespace`; `patched` says
/// what a patch did.
pub(super) fn log_answer(namespace: &str, pod: &Pod, answer: &Answer, patched: &str) {
    let name = pod
        .metadata
        .name
        .clone()
        .or(pod.metadata.generate_name.clone())
        .unwrap_or_default();
    match answer {
        Answer::Untouched => {}
        Answer::Patch(patch) => {
            info!(pod = %format!("{namespace}/{name}"), %patch, "{patched}")
        }
        Answer::Refuse(why) => {
            warn!(pod = %format!("{namespace}/{name}"), %why, "refused a pod")
        }
    }
}

/// What is kept of one of gkm's ReadWriteOnce node claims, found by its
/// namespace.
#[derive(Debug, Clone, PartialEq)]
struct NodeClaim {
    /// The cache it holds.
    cache: String,
    /// The node it is for.
    node: String,
    /// Whether a `GKMCache` (not a `ClusterGKMCache`) made it.
    namespaced: bool,
}

/// A node claim gkm made, found by its namespace; `None` for other claims.
fn node_claim(claim: &PersistentVolumeClaim) -> Option<Entry<String, NodeClaim>> {
    let labels = claim.labels();
    if labels.get(MANAGED_BY.0).map(String::as_str) != Some(MANAGED_BY.1) {
        return None;
    }
    Some(Entry::one(
        claim.namespace()?,
        NodeClaim {
            cache: labelled_name(claim.meta(), CACHE_LABEL, CACHE_NAME_ANNOTATION)?,
            node: labelled_name(claim.meta(), NODE_LABEL, NODE_NAME_ANNOTATION)?,
            namespaced: labels.get(KIND_LABEL).map(String::as_str) == Some("GKMCache"),
        },
    ))
}

/// The claims of one namespace as the webhook reads them: cache → node →
/// claim. A `GKMCache`'s claims win over a `ClusterGKMCache`'s of the same
/// name.
fn node_claims(claims: Vec<(ObjectId, NodeClaim)>) -> NodeClaims {
    let mut out: NodeClaims = BTreeMap::new();
    let mut namespaced: BTreeMap<(String, String), bool> = BTreeMap::new();
    for ((_, name), claim) in claims {
        let id = (claim.cache.clone(), claim.node.clone());
        if namespaced.get(&id) == Some(&true) && !claim.namespaced {
            continue;
        }
        namespaced.insert(id, claim.namespaced);
        out.entry(claim.cache).or_default().insert(claim.node, name);
    }
    out
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

    /// The ReadWriteOnce claims gkm made in `namespace`: cache → node →
    /// claim; the watch starts on the first call.
    async fn node_claims(&self, namespace: &str) -> Result<NodeClaims, String> {
        let watched = self
            .claims
            .get_or_init(|| async {
                let selector = format!(
                    "{NODE_LABEL},{CACHE_LABEL},{}={}",
                    MANAGED_BY.0, MANAGED_BY.1
                );
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
        Ok(node_claims(watched.claims.under(&namespace.to_string())))
    }

    async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let (review, pod, namespace) = pod_review(body)?;
        let answer = match self.node_claims(&namespace).await {
            Ok(claims) => mutate(&pod, &claims),
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
        Ok(response(&review, &answer))
    }
}

impl Routes for MutationRoutes {
    fn serves(&self, path: &str) -> bool {
        path == MUTATE_PATH
    }

    fn respond<'a>(
        &'a self,
        method: &'a Method,
        _path: &'a str,
        body: Bytes,
    ) -> ResponseFuture<'a> {
        answer_review(method, async move { self.review(&body).await })
    }
}

/// The HTTP answer of a webhook: `review` (the AdmissionReview it answers
/// with, or what was wrong with the request) for a POST, 405 otherwise.
pub(super) fn answer_review<'a>(
    method: &Method,
    review: impl Future<Output = Result<Value, String>> + Send + 'a,
) -> ResponseFuture<'a> {
    let post = method == Method::POST;
    Box::pin(async move {
        if !post {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "the webhook takes POST\n".into(),
            );
        }
        match review.await {
            Ok(answer) => {
                let mut response = text(StatusCode::OK, answer.to_string());
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(message) => text(StatusCode::BAD_REQUEST, format!("{message}\n")),
        }
    })
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
        ] {
            index.observe(&watcher::Event::Apply(claim(name, labels)), node_claim);
        }
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
    fn long_cache_and_node_names_are_read_whole() {
        use crate::pvc::objects;
        use crate::pvc::plan::ClaimPlan;
        let cache = format!("cache-{}", "c".repeat(70));
        let node = format!("node-{}", "n".repeat(70));
        let plan = ClaimPlan {
            namespace: "team".into(),
            name: "per-node".into(),
            node: Some(node.clone()),
            volume: None,
            job: None,
            fill_digest: None,
        };
        let key = gkm_k8s_api::cache_object::CacheKey::namespaced("team", cache.as_str());
        let spec = gkm_k8s_api::crd::CacheSpec {
            storage_class_name: Some("standard".into()),
            ..Default::default()
        };
        let body = objects::claim(&key, &spec, &plan, &objects::PvcOptions::default());
        let index = Indexed::default();
        let made = serde_json::from_value(body).expect("a claim");
        index.observe(&watcher::Event::Apply(made), node_claim);
        assert_eq!(
            node_claims(index.under(&"team".to_string())),
            BTreeMap::from([(cache, BTreeMap::from([(node, "per-node".to_string())]))])
        );
    }

    #[test]
    fn responses_carry_the_uid_the_patch_and_the_refusal() {
        let review = json!({"request": {"uid": "u-1"}});
        let r = response(&review, &Answer::Untouched);
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["allowed"], true);
        let r = response(
            &review,
            &Answer::Patch(json!([{"op": "replace", "path": "/x", "value": 1}])),
        );
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().expect("patch"))
            .expect("base64");
        assert!(String::from_utf8_lossy(&patch).contains("replace"));
        let r = response(&review, &Answer::Refuse("no node".into()));
        assert_eq!(r["response"]["allowed"], false);
        assert_eq!(r["response"]["status"]["message"], "no node");
    }
}
