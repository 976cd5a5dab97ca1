//! Serving the webhook: an AdmissionReview in, the [`mutate`] answer out,
//! with the per-node claims read from the apiserver for each pod.

use std::collections::BTreeMap;

use base64::Engine as _;
use http::{Method, StatusCode};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::config::MUTATE_PATH;
use crate::pvc::mutation::{Answer, NodeClaims, mutate};
use crate::pvc::objects::{CACHE_LABEL, KIND_LABEL, MANAGED_BY, NODE_LABEL};
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

/// The ReadWriteOnce claims gkm made in `namespace`: cache → node → claim.
/// A `GKMCache`'s claims win over a `ClusterGKMCache`'s of the same name.
pub async fn node_claims(client: &Client, namespace: &str) -> crate::Result<NodeClaims> {
    let selector = format!(
        "{NODE_LABEL},{CACHE_LABEL},{}={}",
        MANAGED_BY.0, MANAGED_BY.1
    );
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mut out: NodeClaims = BTreeMap::new();
    let mut namespaced: BTreeMap<(String, String), bool> = BTreeMap::new();
    for claim in claims.items {
        let labels = claim.labels();
        let (Some(cache), Some(node)) = (labels.get(CACHE_LABEL), labels.get(NODE_LABEL)) else {
            continue;
        };
        let own = labels.get(KIND_LABEL).map(String::as_str) == Some("GKMCache");
        let id = (cache.clone(), node.clone());
        if namespaced.get(&id) == Some(&true) && !own {
            continue;
        }
        namespaced.insert(id, own);
        out.entry(cache.clone())
            .or_default()
            .insert(node.clone(), claim.name_any());
    }
    Ok(out)
}

/// The webhook's HTTP routes.
pub struct MutationRoutes {
    client: Client,
}

impl MutationRoutes {
    /// Answers with the claims `client` reads.
    pub fn new(client: Client) -> MutationRoutes {
        MutationRoutes { client }
    }

    async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let (review, pod, namespace) = pod_review(body)?;
        let answer = match node_claims(&self.client, &namespace).await {
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
