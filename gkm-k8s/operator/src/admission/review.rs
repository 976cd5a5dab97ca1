//! The AdmissionReview envelope every webhook of the operator shares: the
//! pod a review is about, the [`Answer`] a decision gives, the response
//! carrying it, and the HTTP answer around that.

use base64::Engine as _;
use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::{Value, json};
use tracing::{info, warn};

use gkm_k8s_runtime::endpoints::{ResponseFuture, text};

/// The webhook's answer for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Nothing to change (not labelled, or no volume names such a cache).
    Untouched,
    /// A JSON Patch (RFC 6902) pointing the volumes at the node's claims.
    Patch(Value),
    /// The pod cannot be admitted, and why.
    Refuse(String),
}

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
pub(crate) fn pod_review(body: &[u8]) -> Result<(Value, Pod, String), String> {
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
pub(crate) fn log_answer(namespace: &str, pod: &Pod, answer: &Answer, patched: &str) {
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

/// The HTTP answer of a webhook: `review` (the AdmissionReview it answers
/// with, or what was wrong with the request) for a POST, 405 otherwise.
pub(crate) fn answer_review<'a>(
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
