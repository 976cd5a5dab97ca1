//! The AdmissionReview envelope every webhook of the operator shares: the
//! pod a review is about, the [`Answer`] a decision gives, the response
//! carrying it, and the HTTP answer around that.

use base64::Engine as _;
use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde::Deserialize;
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

/// An AdmissionReview (`admission.k8s.io/v1`) about an object of type
/// `T`, decoded into the fields the webhooks read: the others, `oldObject`
/// included, are skipped as they are read, never kept.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Review<T> {
    /// `admission.k8s.io/v1`.
    api_version: String,
    /// `AdmissionReview`.
    kind: String,
    /// What is asked.
    pub(crate) request: Request<T>,
}

/// The `request` of a [`Review`].
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request<T> {
    /// Echoed in the response.
    pub(crate) uid: String,
    /// The namespace of the object (the apiserver's word).
    #[serde(default)]
    pub(crate) namespace: Option<String>,
    /// The object's name (none for a pod named by `generateName`).
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// The subresource (`binding`), if any.
    #[serde(default)]
    pub(crate) sub_resource: Option<String>,
    /// The object being admitted.
    pub(crate) object: T,
}

impl<T: serde::de::DeserializeOwned> Review<T> {
    /// The AdmissionReview in `body`, or what is wrong with it.
    pub(crate) fn decode(body: &[u8]) -> Result<Review<T>, String> {
        let review: Review<T> =
            serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
        if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
            return Err(format!(
                "not an admission.k8s.io/v1 AdmissionReview: {}/{}",
                review.api_version, review.kind
            ));
        }
        Ok(review)
    }
}

/// The AdmissionReview response with `answer` to the request `uid`.
pub fn response(uid: &str, answer: &Answer) -> Value {
    response_warning(uid, answer, &[])
}

/// The AdmissionReview response with `answer` to the request `uid`, and
/// `warnings` for the client (kubectl prints each as `Warning: …`).
pub fn response_warning(uid: &str, answer: &Answer, warnings: &[String]) -> Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
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

/// The AdmissionReview in `body` about a pod: the request's uid, the pod
/// and the pod's namespace; or what is wrong with the request.
pub(crate) fn pod_review(body: &[u8]) -> Result<(String, Pod, String), String> {
    let request = Review::<Pod>::decode(body)?.request;
    let pod = request.object;
    let namespace = request
        .namespace
        .or_else(|| pod.namespace())
        .unwrap_or_default();
    Ok((request.uid, pod, namespace))
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
        let r = response("u-1", &Answer::Untouched);
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["allowed"], true);
        let r = response(
            "u-1",
            &Answer::Patch(json!([{"op": "replace", "path": "/x", "value": 1}])),
        );
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(r["response"]["patch"].as_str().expect("patch"))
            .expect("base64");
        assert!(String::from_utf8_lossy(&patch).contains("replace"));
        assert!(r["response"].get("warnings").is_none());
        let r = response_warning("u-1", &Answer::Untouched, &["mind it".to_string()]);
        assert_eq!(r["response"]["warnings"], json!(["mind it"]));
        let r = response("u-1", &Answer::Refuse("no node".into()));
        assert_eq!(r["response"]["allowed"], false);
        assert_eq!(r["response"]["status"]["message"], "no node");
    }

    #[test]
    fn reviews_decode_into_their_object_type_or_say_what_is_wrong() {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-2", "namespace": "a", "object": {"metadata": {"name": "p"}},
                        "oldObject": {"metadata": {"name": "p"}}, "userInfo": {"username": "x"}}});
        let (uid, pod, namespace) = pod_review(body.to_string().as_bytes()).expect("a pod review");
        assert_eq!((uid.as_str(), namespace.as_str()), ("u-2", "a"));
        assert_eq!(pod.name_any(), "p");
        let other = json!({"apiVersion": "v1", "kind": "Pod",
            "request": {"uid": "u", "object": {}}});
        let err = pod_review(other.to_string().as_bytes()).expect_err("not a review");
        assert!(err.contains("v1/Pod"), "{err}");
        let not_a_pod = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "object": {"metadata": 3}}});
        assert!(pod_review(not_a_pod.to_string().as_bytes()).is_err());
        assert!(pod_review(b"[").is_err());
    }
}
