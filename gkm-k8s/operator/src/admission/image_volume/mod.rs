//! Serving the `image-volume.gkm.io` pod webhook: an AdmissionReview in,
//! the [`admit`] answer out ([`decide`], pure), with the caches the pod
//! names read from the apiserver for each pod and the nodes each fits from
//! a watched index of the node reports ([`ReportIndex`]), not a list of
//! them per pod. The watch starts with the first pod, which waits for its
//! first list.
//!
//! Only pods with an image volume naming a cache reach it: the
//! configuration's `matchConditions` (CEL, evaluated by the apiserver) test
//! for the placeholder, so no other pod waits on gkm. For those pods the
//! failure policy is `Fail`: admitted unchanged, the placeholder could not
//! be pulled anyway.
//!
//! An admitted pod whose containers mount a cache image volume as it is
//! (read-only) with no `gkm view` of it is warned ([`read_only`]).

pub mod decide;
pub mod read_only;

use std::collections::BTreeMap;
use std::time::Duration;

use kube::Client;
use serde_json::{Value, json};

use self::decide::{CacheFacts, PLACEHOLDER_PREFIX, admit, requests};
use super::endpoint::{Endpoint, client_config};
use super::hook::{AdmissionHook, ReviewFuture};
use super::review::{Answer, log_answer, pod_review, response, response_warning};
use crate::report_index::ReportIndex;
use gkm_k8s_api::cache_object::{CacheKey, CacheObject, Scope};
use gkm_k8s_api::crd::{ClusterGKMCache, ClusterGKMCacheNode, GKMCache, GKMCacheNode};

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

/// How long a pod waits for the first list of the node reports.
const FIRST_LIST: Duration = Duration::from_secs(8);

/// The node reports of both scopes, each kept by a watch.
struct Reports {
    namespaced: ReportIndex,
    cluster: ReportIndex,
}

impl Reports {
    fn of(&self, scope: Scope) -> &ReportIndex {
        match scope {
            Scope::Namespaced => &self.namespaced,
            Scope::Cluster => &self.cluster,
        }
    }
}

/// What the apiserver holds of cache `name` of kind `K`, seen from
/// `namespace`, with the nodes `reports` say its digest fits.
async fn facts_of<K: CacheObject>(
    client: &Client,
    reports: &Reports,
    namespace: Option<&str>,
    name: &str,
    kind: &'static str,
) -> kube::Result<Option<CacheFacts>> {
    let Some(cache) = K::api(client.clone(), namespace).get_opt(name).await? else {
        return Ok(None);
    };
    let status = cache.cache_status().cloned();
    let digest = status.as_ref().and_then(|s| s.resolved_digest.clone());
    let key = CacheKey::named(namespace, name);
    let fit_nodes = digest
        .map(|d| reports.of(K::SCOPE).fitting_nodes(&key, &d))
        .unwrap_or_default();
    let spec = cache.cache_spec();
    Ok(Some(CacheFacts {
        kind,
        image: spec.image.clone(),
        workload_namespaces: match K::SCOPE {
            Scope::Cluster => spec
                .workload_namespaces
                .as_ref()
                .map(|n| n.iter().map(|n| n.0.clone()).collect()),
            Scope::Namespaced => None,
        },
        status,
        fit_nodes,
    }))
}

/// The webhook's answers, with what it reads from the apiserver.
pub struct ImageVolumeRoutes {
    client: Client,
    /// The node reports, watched from the first pod on.
    reports: tokio::sync::OnceCell<Reports>,
}

impl ImageVolumeRoutes {
    /// Answers with what `client` reads.
    pub fn new(client: Client) -> ImageVolumeRoutes {
        ImageVolumeRoutes {
            client,
            reports: tokio::sync::OnceCell::new(),
        }
    }

    /// The node reports, once listed (the watch starts on the first call).
    async fn reports(&self) -> Result<&Reports, String> {
        let reports = self
            .reports
            .get_or_init(|| async {
                Reports {
                    namespaced: ReportIndex::watched::<GKMCacheNode>(&self.client, |_| {}),
                    cluster: ReportIndex::watched::<ClusterGKMCacheNode>(&self.client, |_| {}),
                }
            })
            .await;
        let listed = async {
            reports.namespaced.wait_until_listed().await;
            reports.cluster.wait_until_listed().await;
        };
        tokio::time::timeout(FIRST_LIST, listed)
            .await
            .map_err(|_| {
                format!("gkm has not read the node reports yet (no list in {FIRST_LIST:?})")
            })?;
        Ok(reports)
    }

    /// The cache `name` a pod of `namespace` names: the namespace's
    /// `GKMCache`, else the `ClusterGKMCache`.
    async fn cache(
        &self,
        reports: &Reports,
        namespace: &str,
        name: &str,
    ) -> kube::Result<Option<CacheFacts>> {
        let client = &self.client;
        if let Some(facts) =
            facts_of::<GKMCache>(client, reports, Some(namespace), name, "GKMCache").await?
        {
            return Ok(Some(facts));
        }
        facts_of::<ClusterGKMCache>(client, reports, None, name, "ClusterGKMCache").await
    }

    /// The AdmissionReview answering `body`.
    async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let (uid, pod, namespace) = pod_review(body)?;
        let requested = requests(&pod);
        if requested.is_empty() {
            return Ok(response(&uid, &Answer::Untouched));
        }
        let reports = match self.reports().await {
            Ok(reports) => reports,
            Err(why) => {
                let answer = Answer::Refuse(why);
                log_answer(&namespace, &pod, &answer, "");
                return Ok(response(&uid, &answer));
            }
        };
        let mut caches = BTreeMap::new();
        let mut failed = None;
        for (_, name) in requested {
            if caches.contains_key(&name) {
                continue;
            }
            match self.cache(reports, &namespace, &name).await {
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
        let warnings = match answer {
            Answer::Refuse(_) => Vec::new(),
            _ => read_only::warnings(&pod),
        };
        Ok(response_warning(&uid, &answer, &warnings))
    }
}

impl AdmissionHook for ImageVolumeRoutes {
    fn path(&self) -> &'static str {
        IMAGE_VOLUME_PATH
    }

    fn review<'a>(&'a self, body: &'a [u8]) -> ReviewFuture<'a> {
        Box::pin(self.review(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        crate::admission::assert_chart_sends(IMAGE_VOLUME_WEBHOOK_NAME, &match_condition());
        let chart =
            include_str!("../../../../../deploy/helm/gkm/templates/manifests/operator.yaml");
        assert!(chart.contains(IMAGE_VOLUME_PATH));
    }
}
