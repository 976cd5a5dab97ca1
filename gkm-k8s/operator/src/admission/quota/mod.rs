//! The `gpu-quota.gkm.io` validating webhook: the GPU-model quotas
//! ([`gkm_k8s_api::crd::GKMGPUQuota`]) at admission, for the pods that never
//! meet gkm's scheduler extender.
//!
//! The extender enforces a namespace's quotas when it binds a pod. A pod
//! created with `spec.nodeName`, or bound by another scheduler, is not
//! bound by it; this webhook judges those where they enter:
//!
//! - `pods` `CREATE` with `spec.nodeName` set (mirror pods of static pods
//!   excepted: the kubelet runs them whatever the apiserver says);
//! - `pods/binding` `CREATE`: a bind by any scheduler, the extender's
//!   included (the same decision, so it agrees with it), at its own path
//!   ([`QUOTA_BINDING_PATH`]).
//!
//! Only in namespaces an administrator labelled [`ENFORCED_LABEL`]: the
//! others never wait on the operator, and their quotas say so
//! ([`enforcement`]).
//!
//! The decision is [`gkm_k8s_api::quota::check`], the one the extender
//! makes; what a pod asks is read as the extender reads it
//! ([`GpuRequest`](gkm_k8s_api::gpu_request::GpuRequest)), and what the namespace holds is every pod of it bound
//! (and not finished) to a node of the same GPU model, as the apiserver
//! lists them now. Two pods admitted at the same instant can each see the
//! other not yet there: the webhook closes the bypass, the extender's
//! reservations keep its own binds exact.

pub mod decide;
pub mod enforcement;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Binding, Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use self::decide::{Refusal, Subject, bound, created, decide_with_claims, model_known};
use super::endpoint::{Endpoint, client_config};
use super::hook::{AdmissionHook, BINDING_REVIEW_MAX_BYTES, ReviewFuture};
use super::review::{Answer, Review, response};
use gkm_k8s_api::crd::{GKMGPUQuota, GpuModelLimit};
use gkm_k8s_api::gpu_request::GpuReading;

/// The configuration's name (the chart renders it; the operator writes
/// only its `caBundle`).
pub const QUOTA_CONFIGURATION_NAME: &str = "gkm-gpu-quota";
/// The name within it of the webhook judging pods created naming a node.
pub const QUOTA_WEBHOOK_NAME: &str = "gpu-quota.gkm.io";
/// The path that webhook serves.
pub const QUOTA_PATH: &str = "/validate-gpu-quota";
/// The name within it of the webhook judging binds (`pods/binding`).
pub const QUOTA_BINDING_WEBHOOK_NAME: &str = "gpu-quota-binding.gkm.io";
/// The path that webhook serves.
pub const QUOTA_BINDING_PATH: &str = "/validate-gpu-quota-binding";
/// The namespace label (set by an administrator) under which pods are
/// judged: only namespaces labelled `gkm.io/gpu-quota: enforced` are sent
/// to the webhook, so a namespace without it binds and creates pods
/// whether the operator is up or not.
pub const ENFORCED_LABEL: (&str, &str) = ("gkm.io/gpu-quota", "enforced");

/// What the webhook reads pods and nodes by: the scheduler extender's
/// settings, which must be the same.
pub type QuotaOptions = GpuReading;

/// The quota webhook's answers, with what it reads from the apiserver.
pub struct QuotaRoutes {
    client: Client,
    options: QuotaOptions,
}

impl QuotaRoutes {
    /// Answers with what `client` reads.
    pub fn new(client: Client, options: QuotaOptions) -> QuotaRoutes {
        QuotaRoutes { client, options }
    }

    /// Whether the subject fits its namespace's quotas (it does when there
    /// is nothing to judge); `Err` when the apiserver could not be read.
    async fn judge(&self, namespace: &str, subject: Subject) -> kube::Result<Result<(), Refusal>> {
        let quotas = Api::<GKMGPUQuota>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await?;
        if quotas.items.is_empty() {
            return Ok(Ok(()));
        }
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await?
            .items;
        let (pod, node) = match subject {
            Subject::Nothing => return Ok(Ok(())),
            Subject::Created(pod) => {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                let mut pod = *pod;
                pod.metadata.namespace = Some(namespace.to_string());
                (pod, node)
            }
            Subject::Bound { name, node } => {
                match pods.iter().find(|p| p.name_any() == name) {
                    Some(pod) => (pod.clone(), node),
                    // The apiserver refuses a bind of a missing pod itself.
                    None => return Ok(Ok(())),
                }
            }
        };
        let found = Api::<Node>::all(self.client.clone()).get_opt(&node).await?;
        let label = &self.options.model_label;
        let labels = found.as_ref().map(|n| n.labels());
        if let Err(refusal) = model_known(&pod, &node, labels, label, &self.options.whole_resources)
        {
            return Ok(Err(refusal));
        }
        let Some(model) = labels.and_then(|l| l.get(label)).cloned() else {
            return Ok(Ok(()));
        };
        let model_nodes: HashSet<String> = Api::<Node>::all(self.client.clone())
            .list_metadata(&ListParams::default().labels(&format!("{label}={model}")))
            .await?
            .items
            .into_iter()
            .map(|n| n.name_any())
            .collect();
        let quotas: Vec<(String, Vec<GpuModelLimit>)> = quotas
            .items
            .into_iter()
            .map(|q| (q.name_any(), q.spec.limits))
            .collect();
        // GPUs allocated through DRA count too, whatever class asked for
        // them; a cluster that serves no DRA API has none.
        let claims = match Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(decide_with_claims(
            &pod,
            &model,
            &quotas,
            &pods,
            &claims,
            &model_nodes,
            &self.options.whole_resources,
        )
        .map_err(Refusal::from))
    }

    /// The answer to a pod created in `namespace` (already naming its
    /// node, or it is not judged).
    async fn review_pod(&self, body: &[u8]) -> Result<Value, String> {
        let request = Review::<Pod>::decode(body)?.request;
        let namespace = request.namespace.unwrap_or_default();
        let name = request
            .name
            .or(request.object.metadata.name.clone())
            .or(request.object.metadata.generate_name.clone())
            .unwrap_or_default();
        let subject = created(request.object);
        Ok(response(
            &request.uid,
            &self.answer(&namespace, &name, subject).await,
        ))
    }

    /// The answer to a bind (`pods/binding`) in `namespace`.
    async fn review_binding(&self, body: &[u8]) -> Result<Value, String> {
        let request = Review::<Binding>::decode(body)?.request;
        if request.sub_resource.as_deref() != Some("binding") {
            return Err(format!(
                "{QUOTA_BINDING_PATH} judges pods/binding, not subresource {:?}",
                request.sub_resource.unwrap_or_default()
            ));
        }
        let namespace = request.namespace.unwrap_or_default();
        let subject = bound(request.name, request.object);
        let name = match &subject {
            Subject::Bound { name, .. } => name.clone(),
            _ => String::new(),
        };
        Ok(response(
            &request.uid,
            &self.answer(&namespace, &name, subject).await,
        ))
    }

    /// The answer for `subject`, the pod `name` of `namespace`.
    async fn answer(&self, namespace: &str, name: &str, subject: Subject) -> Answer {
        match self.judge(namespace, subject).await {
            Ok(Ok(())) => Answer::Untouched,
            Ok(Err(why)) => {
                let why = why.to_string();
                info!(pod = %format!("{namespace}/{name}"), %why, "refused a pod over its GPU quota");
                Answer::Refuse(why)
            }
            Err(e) => {
                warn!(pod = %format!("{namespace}/{name}"), error = %e, "reading what the GPU quota needs");
                Answer::Refuse(format!(
                    "gkm could not check the GPU quotas of namespace {namespace}: {e}"
                ))
            }
        }
    }
}

/// The `gpu-quota.gkm.io` webhook: pods created naming their node.
pub(crate) struct PodQuota(pub(crate) Arc<QuotaRoutes>);

impl AdmissionHook for PodQuota {
    fn path(&self) -> &'static str {
        QUOTA_PATH
    }

    fn review<'a>(&'a self, body: &'a [u8]) -> ReviewFuture<'a> {
        Box::pin(self.0.review_pod(body))
    }
}

/// The `gpu-quota-binding.gkm.io` webhook: binds (`pods/binding`).
pub(crate) struct BindingQuota(pub(crate) Arc<QuotaRoutes>);

impl AdmissionHook for BindingQuota {
    fn path(&self) -> &'static str {
        QUOTA_BINDING_PATH
    }

    fn max_body_bytes(&self) -> usize {
        BINDING_REVIEW_MAX_BYTES
    }

    fn review<'a>(&'a self, body: &'a [u8]) -> ReviewFuture<'a> {
        Box::pin(self.0.review_binding(body))
    }
}

/// The configuration of the quota webhooks, as the chart renders it
/// (`deploy/helm/gkm/templates/manifests/operator.yaml`), for an operator
/// reached at `endpoint` in `namespace`; `ca_bundle` is the PEM the
/// apiserver trusts for it. Two webhooks, one per request kind, so each
/// path takes only bodies of its size ([`QUOTA_PATH`]: pods,
/// [`QUOTA_BINDING_PATH`]: Bindings).
///
/// - Only namespaces labelled [`ENFORCED_LABEL`] are sent
///   (`namespaceSelector`): the label is the administrator's, never the
///   operator's; elsewhere pods are created and bound without gkm, even
///   while it is down. The operator's own namespace and `kube-system` are
///   left out even when labelled, so the operator and the control plane
///   can always be scheduled.
/// - Of pods, only those that name a node, ask for some extended resource
///   and are not mirror pods (`matchConditions`); every bind.
/// - `failurePolicy: Fail`: a quota that gives way whenever the operator
///   is away is no quota. An operator outage delays binds in the enforced
///   namespaces (the scheduler retries them) and refuses their `nodeName`
///   GPU pods, but nothing exceeds a quota.
pub fn quota_configuration(endpoint: &Endpoint, namespace: &str, ca_bundle: Option<&str>) -> Value {
    let excluded: BTreeSet<&str> = ["kube-system", namespace].into_iter().collect();
    let selector = json!({
        "matchLabels": {ENFORCED_LABEL.0: ENFORCED_LABEL.1},
        "matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": excluded.into_iter().collect::<Vec<_>>()}]});
    let hook = |name: &str, path: &str, resource: &str| {
        json!({
            "name": name,
            "clientConfig": client_config(endpoint, path, ca_bundle),
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": [resource], "scope": "Namespaced"}],
            "namespaceSelector": selector,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        })
    };
    let mut pods = hook(QUOTA_WEBHOOK_NAME, QUOTA_PATH, "pods");
    pods["matchConditions"] = MATCH_CONDITIONS
        .iter()
        .map(|(name, expression)| json!({"name": name, "expression": expression}))
        .collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": QUOTA_CONFIGURATION_NAME,
                     "labels": {"app.kubernetes.io/name": "gkm-operator",
                                "app.kubernetes.io/part-of": "gkm"}},
        "webhooks": [pods, hook(QUOTA_BINDING_WEBHOOK_NAME, QUOTA_BINDING_PATH, "pods/binding")],
    })
}

/// The CEL conditions a created pod must meet to be sent.
pub const MATCH_CONDITIONS: &[(&str, &str)] = &[
    (
        "names-a-node",
        "has(object.spec.nodeName) && object.spec.nodeName != ''",
    ),
    (
        "asks-for-extended-resources",
        "object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('/'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('/'))))) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('/'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('/'))))))",
    ),
    (
        "is-not-a-mirror-pod",
        "!has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_a_valid_object_that_spares_the_operators_namespace() {
        let body = quota_configuration(
            &Endpoint::Url("https://127.0.0.1:9443".into()),
            "gkm-system",
            Some("PEM"),
        );
        let hook = &body["webhooks"][0];
        assert_eq!(
            hook["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate-gpu-quota"
        );
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(
            hook["namespaceSelector"]["matchExpressions"][0]["values"],
            json!(["gkm-system", "kube-system"])
        );
        assert_eq!(
            hook["namespaceSelector"]["matchLabels"],
            json!({"gkm.io/gpu-quota": "enforced"})
        );
        let binds = &body["webhooks"][1];
        assert_eq!(binds["rules"][0]["resources"], json!(["pods/binding"]));
        assert_eq!(
            binds["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate-gpu-quota-binding"
        );
        assert_eq!(binds["namespaceSelector"], hook["namespaceSelector"]);
        let _: k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration =
            serde_json::from_value(body).expect("a valid object");
    }
}
