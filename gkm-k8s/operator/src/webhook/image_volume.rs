//! Serving the `image-volume.gkm.io` pod webhook: an AdmissionReview in,
//! the [`crate::image_volume::admit`] answer out, with the caches the pod
//! names and their node reports read from the apiserver for each pod.
//!
//! Only pods with an image volume naming a cache reach it: the
//! configuration's `matchConditions` (CEL, evaluated by the apiserver) test
//! for the placeholder, so no other pod waits on gkm. For those pods the
//! failure policy is `Fail`: admitted unchanged, the placeholder could not
//! be pulled anyway.

use std::collections::{BTreeMap, BTreeSet};

use http::Method;
use hyper::body::Bytes;
use kube::api::ListParams;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::config::{Endpoint, client_config};
use super::review::{answer_review, log_answer, pod_review, response};
use crate::image_volume::{CacheFacts, PLACEHOLDER_PREFIX, admit, requests};
use crate::pvc::mutation::Answer;
use gkm_k8s_api::cache_object::{CacheObject, NodeReport};
use gkm_k8s_api::crd::{CacheState, ClusterGKMCache, GKMCache};
use gkm_k8s_runtime::endpoints::{ResponseFuture, Routes};

/// The configuration's name.
pub const IMAGE_VOLUME_CONFIGURATION_NAME: &str = "gkm-image-volume";
/// The webhook's name within it.
pub const IMAGE_VOLUME_WEBHOOK_NAME: &str = "image-volume.gkm.io";
/// The path the webhook serves.
pub const IMAGE_VOLUME_PATH: &str = "/mutate-image-volumes";

/// The CEL condition that sends a pod to the webhook: one of its volumes is
/// an image volume naming a gkm cache.
pub fn match_condition() -> String {
    format!(
        "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.image) && \
         has(v.image.reference) && v.image.reference.startsWith('{PLACEHOLDER_PREFIX}'))"
    )
}

/// The server-side apply body of the configuration; `ca_bundle` is the PEM
/// the apiserver trusts for the webhook (none when cert-manager injects it).
pub fn configuration(endpoint: &Endpoint, ca_bundle: Option<&str>) -> Value {
    let client = client_config(endpoint, IMAGE_VOLUME_PATH, ca_bundle);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": IMAGE_VOLUME_CONFIGURATION_NAME,
                     "labels": {"app.kubernetes.io/name": "gkm-operator",
                                "app.kubernetes.io/part-of": "gkm"}},
        "webhooks": [{
            "name": IMAGE_VOLUME_WEBHOOK_NAME,
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "matchConditions": [{"name": "names-a-gkm-cache", "expression": match_condition()}],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
            "reinvocationPolicy": "Never",
        }],
    })
}

/// The nodes whose report on cache `name` says `digest` fits their GPUs:
/// compatible GPUs listed, or the digest on the node (the agent extracts
/// only what fits).
fn fit_nodes<R: NodeReport>(reports: &[R], name: &str, digest: Option<&str>) -> BTreeSet<String> {
    let Some(digest) = digest else {
        return BTreeSet::new();
    };
    reports
        .iter()
        .filter_map(|r| {
            let report = r.report()?;
            let entry = report.caches.as_ref()?.get(name)?.get(digest)?;
            let fits = entry.state != Some(CacheState::Incompatible)
                && (entry
                    .compatible_gpus
                    .as_ref()
                    .is_some_and(|g| !g.is_empty())
                    || entry.state.is_some_and(CacheState::is_on_node));
            fits.then(|| {
                if report.node_name.is_empty() {
                    r.name_any()
                } else {
                    report.node_name.clone()
                }
            })
        })
        .collect()
}

/// What the apiserver holds of cache `name` of kind `K`, seen from `namespace`.
async fn facts_of<K: CacheObject>(
    client: &Client,
    namespace: Option<&str>,
    name: &str,
    kind: &'static str,
) -> kube::Result<Option<CacheFacts>> {
    let Some(cache) = K::api(client.clone(), namespace).get_opt(name).await? else {
        return Ok(None);
    };
    let status = cache.cache_status().cloned();
    let digest = status.as_ref().and_then(|s| s.resolved_digest.clone());
    let reports = <K::NodeReport as NodeReport>::api(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items;
    let spec = cache.cache_spec();
    Ok(Some(CacheFacts {
        kind,
        image: spec.image.clone(),
        workload_namespaces: match K::SCOPE {
            gkm_k8s_api::cache_object::Scope::Cluster => spec
                .workload_namespaces
                .as_ref()
                .map(|n| n.iter().map(|n| n.0.clone()).collect()),
            gkm_k8s_api::cache_object::Scope::Namespaced => None,
        },
        status,
        fit_nodes: fit_nodes(&reports, name, digest.as_deref()),
    }))
}

/// The webhook's answers, with what it reads from the apiserver.
pub struct ImageVolumeRoutes {
    client: Client,
}

impl ImageVolumeRoutes {
    /// Answers with what `client` reads.
    pub fn new(client: Client) -> ImageVolumeRoutes {
        ImageVolumeRoutes { client }
    }

    /// The cache `name` a pod of `namespace` names: the namespace's
    /// `GKMCache`, else the `ClusterGKMCache`.
    async fn cache(&self, namespace: &str, name: &str) -> kube::Result<Option<CacheFacts>> {
        if let Some(facts) =
            facts_of::<GKMCache>(&self.client, Some(namespace), name, "GKMCache").await?
        {
            return Ok(Some(facts));
        }
        facts_of::<ClusterGKMCache>(&self.client, None, name, "ClusterGKMCache").await
    }

    /// The AdmissionReview answering `body`.
    pub(super) async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let (review, pod, namespace) = pod_review(body)?;
        let mut caches = BTreeMap::new();
        let mut failed = None;
        for (_, name) in requests(&pod) {
            if caches.contains_key(&name) {
                continue;
            }
            match self.cache(&namespace, &name).await {
                Ok(facts) => {
                    caches.insert(name, facts);
                }
                Err(e) => {
                    failed = Some(format!(
                        "gkm could not read cache {name} for {namespace}: {e}"
                    ));
                    break;
                }
            }
        }
        let answer = match failed {
            Some(why) => Answer::Refuse(why),
            None => admit(&pod, &namespace, &caches),
        };
        log_answer(
            &namespace,
            &pod,
            &answer,
            "pinned a pod's cache image volumes",
        );
        Ok(response(&review, &answer))
    }
}

impl Routes for ImageVolumeRoutes {
    fn serves(&self, path: &str) -> bool {
        path == IMAGE_VOLUME_PATH
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

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::GKMCacheNode;

    #[test]
    fn only_pods_naming_a_cache_reach_the_webhook() {
        let body = configuration(
            &Endpoint::Url("https://127.0.0.1:9443/".into()),
            Some("PEM"),
        );
        let hook = &body["webhooks"][0];
        assert_eq!(
            hook["clientConfig"]["url"],
            "https://127.0.0.1:9443/mutate-image-volumes"
        );
        assert_eq!(hook["failurePolicy"], "Fail");
        assert!(
            hook["matchConditions"][0]["expression"]
                .as_str()
                .is_some_and(|e| e.contains("'gkm.invalid/cache/'"))
        );
        let _: k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration =
            serde_json::from_value(body).expect("a valid object");
    }

    #[test]
    fn the_chart_sends_the_same_pods() {
        let chart = include_str!("../../../../deploy/helm/gkm/templates/manifests/operator.yaml");
        let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words(chart).contains(&words(&match_condition())),
            "the chart's gkm-image-volume matchConditions differ from {}",
            match_condition()
        );
        assert!(chart.contains(IMAGE_VOLUME_PATH) && chart.contains(IMAGE_VOLUME_WEBHOOK_NAME));
    }

    #[test]
    fn fit_is_read_from_the_reports_of_the_digest() {
        let report = |node: &str, digest: &str, state: &str, gpus: Value| -> GKMCacheNode {
            serde_json::from_value(json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
                "metadata": {"name": node, "namespace": "ns"},
                "status": {"nodeName": node, "caches": {"c": {digest: {
                    "state": state, "compatibleGPUs": gpus}}}},
            }))
            .expect("report")
        };
        let reports = vec![
            report("extracted", "sha256:a", "Extracted", json!(null)),
            report("downloading", "sha256:a", "Downloading", json!([0])),
            report("incompatible", "sha256:a", "Incompatible", json!(null)),
            report("old-digest", "sha256:b", "Extracted", json!([0])),
            report("pending", "sha256:a", "Pending", json!(null)),
        ];
        assert_eq!(
            fit_nodes(&reports, "c", Some("sha256:a")),
            BTreeSet::from(["downloading".to_string(), "extracted".to_string()])
        );
        assert!(fit_nodes(&reports, "c", None).is_empty());
        assert!(fit_nodes(&reports, "other", Some("sha256:a")).is_empty());
    }
}
