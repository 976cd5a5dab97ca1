//! What PVC delivery reads of the objects it watches, and the keys it finds
//! them by ([`gkm_k8s_runtime::watched_index`]): gkm's Jobs, claims and volumes by the cache
//! that owns them, pods by the claims they use. Pure: tests feed it objects.

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{Resource, ResourceExt};

use super::apply::{FILLED_ANNOTATION, REFILLED_AT_ANNOTATION};
use super::objects::owner_of;
use super::status::Fill;
use crate::names::MANAGED_BY;
use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_runtime::watched_index::Entry;

/// A claim in a namespace: (namespace, claim name).
pub type ClaimRef = (String, String);

/// What is read of a claim: the digest it holds and when it was last
/// refilled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimFacts {
    /// The digest its content was filled from.
    pub filled: Option<String>,
    /// When its content was last refilled (`None`: never refilled).
    pub refilled_at: Option<Timestamp>,
}

impl ClaimFacts {
    /// What `claim`'s annotations say.
    pub fn of(claim: &PersistentVolumeClaim) -> ClaimFacts {
        let annotations = claim.annotations();
        ClaimFacts {
            filled: annotations.get(FILLED_ANNOTATION).cloned(),
            refilled_at: annotations
                .get(REFILLED_AT_ANNOTATION)
                .and_then(|t| t.parse().ok()),
        }
    }
}

/// A workload pod using claims: when it was made and which claims (in its
/// namespace) it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimUser {
    /// When the pod was made.
    pub created: Option<Timestamp>,
    /// The claims its volumes name.
    pub claims: Vec<String>,
}

/// A fill Job, found by its cache: where its fill stands.
pub fn job(job: &Job) -> Option<Entry<CacheKey, Fill>> {
    Some(Entry::one(
        owner_of(job.meta())?,
        Fill::of(job.status.as_ref()),
    ))
}

/// A gkm-made claim, found by its cache.
pub fn claim(claim: &PersistentVolumeClaim) -> Option<Entry<CacheKey, ClaimFacts>> {
    Some(Entry::one(owner_of(claim.meta())?, ClaimFacts::of(claim)))
}

/// A gkm-made volume, found by its cache (only whether it exists is read).
pub fn volume(volume: &PersistentVolume) -> Option<Entry<CacheKey, ()>> {
    Some(Entry::one(owner_of(volume.meta())?, ()))
}

/// A pod, found by each claim it uses; `None` for a pod that uses none, has
/// finished, or is one of gkm's fill Jobs (no workload).
pub fn pod(pod: &Pod) -> Option<Entry<ClaimRef, ClaimUser>> {
    let ended = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let fill = pod.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1);
    if ended || fill {
        return None;
    }
    let claims: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect();
    if claims.is_empty() {
        return None;
    }
    let namespace = pod.namespace().unwrap_or_default();
    let keys: Vec<ClaimRef> = claims
        .iter()
        .map(|c| (namespace.clone(), c.clone()))
        .collect();
    Some(Entry::each(
        keys,
        ClaimUser {
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            claims,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::pvc::objects::owner_labels;
    use serde_json::json;

    fn pod_with(labels: serde_json::Value, phase: &str, claims: &[&str]) -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .chain([json!({"name": "scratch", "emptyDir": {}})])
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "team", "labels": labels,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [], "volumes": volumes},
            "status": {"phase": phase},
        }))
        .expect("a Pod")
    }

    #[test]
    fn a_workload_pod_is_found_by_each_claim_it_uses() {
        let entry = pod(&pod_with(json!({}), "Running", &["a", "b"])).expect("kept");
        let keys: Vec<&ClaimRef> = entry.under.keys().collect();
        assert_eq!(
            keys,
            [&("team".into(), "a".into()), &("team".into(), "b".into())]
        );
        for user in entry.under.values() {
            assert_eq!(user.claims, ["a", "b"]);
            assert_eq!(
                user.created,
                Some("2026-01-01T00:00:00Z".parse().expect("a time"))
            );
        }
        assert!(pod(&pod_with(json!({}), "Pending", &["a"])).is_some());
    }

    #[test]
    fn pods_without_claims_finished_ones_and_fill_pods_are_not_kept() {
        assert_eq!(pod(&pod_with(json!({}), "Running", &[])), None);
        assert_eq!(pod(&pod_with(json!({}), "Succeeded", &["a"])), None);
        assert_eq!(pod(&pod_with(json!({}), "Failed", &["a"])), None);
        let fill = json!({MANAGED_BY.0: MANAGED_BY.1});
        assert_eq!(pod(&pod_with(fill, "Running", &["a"])), None);
    }

    #[test]
    fn gkm_objects_are_found_by_their_cache_and_others_not_at_all() {
        let key = CacheKey::namespaced("team", "vector-add");
        let claim_object: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "vector-add", "namespace": "team",
                         "labels": owner_labels(&key),
                         "annotations": {FILLED_ANNOTATION: "sha256:aa",
                                         REFILLED_AT_ANNOTATION: "2026-01-02T00:00:00Z"}},
        }))
        .expect("a claim");
        let entry = claim(&claim_object).expect("gkm's");
        assert_eq!(entry.under.len(), 1);
        let facts = &entry.under[&key];
        assert_eq!(facts.filled.as_deref(), Some("sha256:aa"));
        assert!(facts.refilled_at.is_some());
        let job_object: Job = serde_json::from_value(json!({
            "metadata": {"name": "vector-add-0123", "namespace": "team",
                         "labels": owner_labels(&key)},
            "status": {"succeeded": 1},
        }))
        .expect("a Job");
        assert_eq!(
            job(&job_object).map(|e| e.under),
            Some([(key, Fill::Done)].into())
        );
        let foreign: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pv-1"}})).expect("a volume");
        assert_eq!(volume(&foreign), None);
    }
}
