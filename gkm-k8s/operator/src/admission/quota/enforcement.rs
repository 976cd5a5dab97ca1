//! Whether each `GKMGPUQuota` is enforced at admission, said in its status:
//! the quota webhooks judge only namespaces an administrator labelled
//! [`ENFORCED_LABEL`], so a quota elsewhere is held at bind by the
//! scheduler extender alone. Its condition `EnforcedAtAdmission` says
//! which, and how to enforce it.
//!
//! [`condition`] decides (pure); [`keep`] follows quotas and namespaces by
//! watches and writes the condition where it changed. Every replica runs
//! it: each writes the same condition, only when the status differs.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::{Client, ResourceExt};
use kube_runtime::watcher;
use tracing::warn;

use super::ENFORCED_LABEL;
use gkm_k8s_api::crd::GKMGPUQuota;

/// The condition's type.
pub const CONDITION_TYPE: &str = "EnforcedAtAdmission";

/// The `EnforcedAtAdmission` condition of a quota of generation
/// `generation` in `namespace`, whose labels are `labels`, with the
/// operator in `operator_namespace`; `previous` keeps its transition time
/// while its status stays.
pub fn condition(
    namespace: &str,
    labels: &BTreeMap<String, String>,
    operator_namespace: &str,
    generation: Option<i64>,
    previous: Option<&Condition>,
    now: Timestamp,
) -> Condition {
    let (key, value) = ENFORCED_LABEL;
    let labelled = labels.get(key).is_some_and(|v| v == value);
    let exempt = namespace == "kube-system" || namespace == operator_namespace;
    let (status, reason, message) = if exempt {
        (
            "False",
            "NamespaceExempt",
            format!(
                "namespace {namespace} is never sent to the GPU-quota webhooks (so the control \
                 plane and gkm can always be scheduled); gkm's scheduler extender enforces \
                 this quota at bind only"
            ),
        )
    } else if labelled {
        (
            "True",
            "NamespaceLabelled",
            format!(
                "pods of {namespace} created naming their node and binds by any scheduler are \
                 judged at admission ({key}={value})"
            ),
        )
    } else {
        (
            "False",
            "NamespaceNotLabelled",
            format!(
                "enforced at bind by gkm's scheduler extender only: pods created with \
                 spec.nodeName or bound by another scheduler are not checked. To enforce it at \
                 admission: kubectl label namespace {namespace} {key}={value}"
            ),
        )
    };
    let last_transition_time = previous
        .filter(|p| p.status == status)
        .map(|p| p.last_transition_time.clone())
        .unwrap_or(Time(now));
    Condition {
        type_: CONDITION_TYPE.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Writes every quota's condition where it differs; `Err` when the
/// apiserver could not be read.
async fn pass(client: &Client, operator_namespace: &str) -> kube::Result<()> {
    let quotas = Api::<GKMGPUQuota>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    if quotas.is_empty() {
        return Ok(());
    }
    let namespaces: BTreeMap<String, BTreeMap<String, String>> =
        Api::<Namespace>::all(client.clone())
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
            .collect();
    let now = Timestamp::now();
    for quota in quotas {
        let namespace = quota.namespace().unwrap_or_default();
        let current = quota
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_TYPE));
        let labels = namespaces.get(&namespace).cloned().unwrap_or_default();
        let wanted = condition(
            &namespace,
            &labels,
            operator_namespace,
            quota.metadata.generation,
            current,
            now,
        );
        if current == Some(&wanted) {
            continue;
        }
        let patch = serde_json::json!({"status": {"conditions": [wanted]}});
        let written = Api::<GKMGPUQuota>::namespaced(client.clone(), &namespace)
            .patch_status(
                &quota.name_any(),
                &PatchParams {
                    field_manager: Some(crate::names::FIELD_MANAGER.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(&patch),
            )
            .await;
        if let Err(e) = written {
            warn!(quota = %format!("{namespace}/{}", quota.name_any()), error = %e,
                  "writing whether a GPU quota is enforced at admission");
        }
    }
    Ok(())
}

/// Keeps every quota's condition current: a pass on every change of a
/// quota or a namespace (as the watches report them), and one at least
/// every `interval`.
pub async fn keep(client: Client, operator_namespace: String, interval: Duration) {
    let quotas = watcher(
        Api::<GKMGPUQuota>::all(client.clone()),
        watcher::Config::default(),
    )
    .map(|_| ())
    .boxed();
    let namespaces = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        watcher::Config::default(),
    )
    .map(|_| ())
    .boxed();
    let mut changes = futures::stream::select(quotas, namespaces);
    loop {
        if let Err(e) = pass(&client, &operator_namespace).await {
            warn!(error = %e, "reading GPU quotas and namespaces");
        }
        // Whatever else arrived meanwhile is covered by the next pass.
        let _ = tokio::time::timeout(interval, changes.next()).await;
        while let Some(Some(())) = changes.next().now_or_never() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_says_whether_its_namespace_is_judged_at_admission_and_how_to_make_it() {
        let now = Timestamp::now();
        let none = BTreeMap::new();
        let labelled = BTreeMap::from([("gkm.io/gpu-quota".into(), "enforced".into())]);
        let off = condition("team", &none, "gkm-system", Some(3), None, now);
        assert_eq!(
            (off.status.as_str(), off.reason.as_str()),
            ("False", "NamespaceNotLabelled")
        );
        assert!(
            off.message
                .contains("kubectl label namespace team gkm.io/gpu-quota=enforced"),
            "{}",
            off.message
        );
        assert_eq!(off.observed_generation, Some(3));
        let later = now
            .checked_add(jiff::SignedDuration::from_secs(60))
            .expect("a time");
        let on = condition("team", &labelled, "gkm-system", Some(3), Some(&off), later);
        assert_eq!(on.status, "True");
        assert_eq!(on.last_transition_time, Time(later));
        let again = condition("team", &labelled, "gkm-system", Some(4), Some(&on), now);
        assert_eq!(again.last_transition_time, Time(later), "no transition");
        let exempt = condition("gkm-system", &labelled, "gkm-system", None, None, now);
        assert_eq!(
            (exempt.status.as_str(), exempt.reason.as_str()),
            ("False", "NamespaceExempt")
        );
    }
}
