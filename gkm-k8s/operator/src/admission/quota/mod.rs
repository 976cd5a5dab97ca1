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
//!   included (the same decision, so it agrees with it).
//!
//! The decision is [`gkm_k8s_api::quota::check`], the one the extender
//! makes; what a pod asks is read as the extender reads it
//! ([`GpuRequest`](gkm_k8s_api::gpu_request::GpuRequest)), and what the namespace holds is every pod of it bound
//! (and not finished) to a node of the same GPU model, as the apiserver
//! lists them now. Two pods admitted at the same instant can each see the
//! other not yet there: the webhook closes the bypass, the extender's
//! reservations keep its own binds exact.

pub mod decide;

use std::collections::{BTreeSet, HashSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use self::decide::{Subject, decide, subject};
use super::endpoint::{Endpoint, client_config};
use super::review::{Answer, response};
use gkm_k8s_api::crd::{GKMGPUQuota, GpuModelLimit};
use gkm_k8s_api::gpu_request::GpuReading;
use gkm_k8s_api::quota::QuotaExceeded;

/// The configuration's name (the chart renders it; the operator writes
/// only its `caBundle`).
pub const QUOTA_CONFIGURATION_NAME: &str = "gkm-gpu-quota";
/// The webhook's name within it.
pub const QUOTA_WEBHOOK_NAME: &str = "gpu-quota.gkm.io";
/// The path the webhook serves.
pub const QUOTA_PATH: &str = "/validate-gpu-quota";

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
    async fn judge(
        &self,
        namespace: &str,
        subject: Subject,
    ) -> kube::Result<Result<(), QuotaExceeded>> {
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
        let Some(node) = Api::<Node>::all(self.client.clone()).get_opt(&node).await? else {
            return Ok(Ok(()));
        };
        let label = &self.options.model_label;
        let Some(model) = node.labels().get(label).cloned() else {
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
        Ok(decide(
            &pod,
            &model,
            &quotas,
            &pods,
            &model_nodes,
            &self.options.whole_resources,
        ))
    }

    pub(super) async fn review(&self, body: &[u8]) -> Result<Value, String> {
        let review: Value =
            serde_json::from_slice(body).map_err(|e| format!("not an AdmissionReview: {e}"))?;
        let request = &review["request"];
        let namespace = request["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = request["name"]
            .as_str()
            .or(request["object"]["metadata"]["name"].as_str())
            .or(request["object"]["metadata"]["generateName"].as_str())
            .unwrap_or_default()
            .to_string();
        let answer = match self.judge(&namespace, subject(request)?).await {
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
        };
        Ok(response(&review, &answer))
    }
}

/// The configuration of the quota webhook, as the chart renders it
/// (`deploy/helm/gkm/templates/manifests/operator.yaml`), for an operator
/// reached at `endpoint` in `namespace`; `ca_bundle` is the PEM the
/// apiserver trusts for it.
///
/// - Only pods that name a node, ask for some extended resource and are
///   not mirror pods are sent (`matchConditions`), and every bind.
/// - `failurePolicy: Fail`: a quota that gives way whenever the operator
///   is away is no quota. An operator outage delays binds (the scheduler
///   retries them) and refuses `nodeName` GPU pods, but nothing exceeds a
///   quota. The operator's own namespace and `kube-system` are left out
///   (`namespaceSelector`), so the operator and the control plane can
///   always be scheduled, the webhook's own pods included.
pub fn quota_configuration(endpoint: &Endpoint, namespace: &str, ca_bundle: Option<&str>) -> Value {
    let client = client_config(endpoint, QUOTA_PATH, ca_bundle);
    let excluded: BTreeSet<&str> = ["kube-system", namespace].into_iter().collect();
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": QUOTA_CONFIGURATION_NAME,
                     "labels": {"app.kubernetes.io/name": "gkm-operator",
                                "app.kubernetes.io/part-of": "gkm"}},
        "webhooks": [{
            "name": QUOTA_WEBHOOK_NAME,
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods", "pods/binding"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                "values": excluded.into_iter().collect::<Vec<_>>()}]},
            "matchConditions": MATCH_CONDITIONS.iter()
                .map(|(name, expression)| json!({"name": name, "expression": expression}))
                .collect::<Vec<_>>(),
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    })
}

/// The CEL conditions a request must meet to be sent; a bind always is.
pub const MATCH_CONDITIONS: &[(&str, &str)] = &[
    (
        "binds-or-names-a-node",
        "(has(request.subResource) && request.subResource == 'binding') || (has(object.spec.nodeName) && object.spec.nodeName != '')",
    ),
    (
        "binds-or-asks-for-extended-resources",
        "(has(request.subResource) && request.subResource == 'binding') || object.spec.containers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('/'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('/'))))) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, r.contains('/'))) || (has(c.resources.requests) && c.resources.requests.exists(r, r.contains('/'))))))",
    ),
    (
        "binds-or-is-not-a-mirror-pod",
        "(has(request.subResource) && request.subResource == 'binding') || !has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)",
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
        let _: k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration =
            serde_json::from_value(body).expect("a valid object");
    }
}
