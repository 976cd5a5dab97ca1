//! Reading the cluster into [`decide`](super::decide)'s terms, pure: which
//! captures a pod's volumes name, what the controller keeps of an ended
//! workload pod, which namespaces' pods it watches, which Job is the
//! capture's own, which pod is a capture Job's own and what it shows, and when a status changed enough to stamp
//! its transition time.

use std::collections::{BTreeMap, BTreeSet};

use gkm_k8s_api::crd::{CaptureStatus, GKMCacheCapture};
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CAPTURE, ATTR_CAPTURED_POD, ATTR_CLUSTER_CACHE, DRIVER_NAME,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::decide::{JobState, Outcome, Unvouched, Workload, WorkloadState};

/// The captures a pod's writable cache volumes name (`csi.gkm.io` volumes
/// naming a cache and [`ATTR_CAPTURE`]): the trees of these are uppers over
/// the cache, captured as deltas on it.
pub fn delta_captures_named(pod: &Pod) -> Vec<String> {
    captures_in_volumes(pod, |attrs| {
        attrs.contains_key(ATTR_CACHE) || attrs.contains_key(ATTR_CLUSTER_CACHE)
    })
}

/// The captures a pod's own capture volumes name (`csi.gkm.io` volumes
/// with [`ATTR_CAPTURE`] and no [`ATTR_CAPTURED_POD`]: a workload, not a
/// capture Job reading a tree back).
pub fn captures_named(pod: &Pod) -> Vec<String> {
    captures_in_volumes(pod, |attrs| !attrs.contains_key(ATTR_CAPTURED_POD))
}

/// The [`ATTR_CAPTURE`] values, sorted and without repeats, of a pod's
/// `csi.gkm.io` volumes whose attributes `keep` accepts.
fn captures_in_volumes(pod: &Pod, keep: impl Fn(&BTreeMap<String, String>) -> bool) -> Vec<String> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut names: Vec<String> = volumes
        .into_iter()
        .flatten()
        .filter_map(|v| v.csi.as_ref())
        .filter(|csi| csi.driver == DRIVER_NAME)
        .filter_map(|csi| csi.volume_attributes.as_ref())
        .filter(|attrs| keep(attrs))
        .filter_map(|attrs| attrs.get(ATTR_CAPTURE).cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A workload pod as [`decide`](super::decide::decide) sees it; `None`
/// without a name or uid.
pub fn workload(pod: &Pod) -> Option<Workload> {
    let state = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Succeeded") => WorkloadState::Succeeded,
        Some("Failed") => WorkloadState::Failed,
        _ => WorkloadState::Running,
    };
    Some(Workload {
        name: pod.metadata.name.clone()?,
        uid: pod.metadata.uid.clone()?,
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        state,
        delta: false,
    })
}

/// What the controller keeps of an ended pod whose volumes name a capture:
/// what [`decide`](super::decide::decide) needs and the tolerations its
/// capture Job copies. The pod itself (its annotations, its status) is
/// dropped once read, so what the controller holds does not grow with the
/// size of the pods it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedPod {
    /// The pod, as `decide` sees it.
    pub workload: Workload,
    /// The captures its volumes name (see [`captures_named`]).
    pub captures: Vec<String>,
    /// Those of them a writable cache volume names (see
    /// [`delta_captures_named`]).
    pub delta_captures: Vec<String>,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
}

/// What the controller keeps of `pod`; `None` when it names no capture or
/// has no name or uid.
pub fn ended_pod(pod: &Pod) -> Option<EndedPod> {
    let captures = captures_named(pod);
    if captures.is_empty() {
        return None;
    }
    Some(EndedPod {
        workload: workload(pod)?,
        delta_captures: delta_captures_named(pod),
        captures,
        tolerations: pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default(),
    })
}

/// The namespaces whose ended pods the controller watches: those holding a
/// capture that is not over (a workload to wait for, or a Job to make again
/// from its workload's tolerations).
pub fn namespaces_under_way<'a>(
    captures: impl IntoIterator<Item = &'a GKMCacheCapture>,
) -> BTreeSet<String> {
    captures
        .into_iter()
        .filter(|c| !c.status.as_ref().is_some_and(|s| s.phase.is_final()))
        .filter_map(|c| c.metadata.namespace.clone())
        .collect()
}

/// Whether `job` is the capture Job of the capture of uid `capture_uid`:
/// its controller owner reference is that `GKMCacheCapture`, as on every
/// Job the operator makes. A Job of the same name made by anyone who may
/// create Jobs in the namespace is not.
pub fn is_capture_job(job: &Job, capture_uid: &str) -> bool {
    controlled_by(
        &job.metadata.owner_references,
        "gkm.io/v1alpha1",
        "GKMCacheCapture",
        capture_uid,
    )
}

/// Whether the operator can vouch for `job`, found under the capture Job's
/// name: `None` when it can (the capture of uid `capture_uid` controls it
/// and its uid is `recorded`, the one the operator's create was answered
/// with), else why not. Anyone who may create Jobs in the namespace and
/// read the capture's uid can make a Job the capture controls, before the
/// operator makes its own; only the uid tells them apart.
pub fn unvouched(job: &Job, capture_uid: &str, recorded: Option<&str>) -> Option<Unvouched> {
    if !is_capture_job(job, capture_uid) {
        return Some(Unvouched::NotControlled);
    }
    match recorded {
        None => Some(Unvouched::NotRecorded),
        Some(uid) if job.metadata.uid.as_deref() != Some(uid) => Some(Unvouched::OtherUid),
        Some(_) => None,
    }
}

/// Whether `owners` name `api_version` `kind` of uid `uid` as controller.
fn controlled_by(
    owners: &Option<Vec<OwnerReference>>,
    api_version: &str,
    kind: &str,
    uid: &str,
) -> bool {
    owners.iter().flatten().any(|o| {
        o.controller == Some(true) && o.api_version == api_version && o.kind == kind && o.uid == uid
    })
}

/// The capture Job's own pod among `pods` (listed by the Job's label): one
/// whose controller owner reference is the Job of uid `job_uid` (as the Job
/// controller sets on the pods it makes), the first by name. Anyone who
/// may create pods in the namespace can give a pod the Job's labels and
/// have it end with a message of its choosing; labels say nothing of who
/// made a pod.
pub fn job_pod<'a>(pods: &'a [Pod], job_uid: &str) -> Option<&'a Pod> {
    let owned =
        |pod: &&Pod| controlled_by(&pod.metadata.owner_references, "batch/v1", "Job", job_uid);
    pods.iter()
        .filter(owned)
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

/// What the capture Job's pod shows: its outcome once its container ended
/// (the termination message), blocked when an event says a volume it needs
/// cannot exist (a Secret, a key in it, or the captured tree missing),
/// else running. `events` are `(reason, message)` of the pod's events.
pub fn job_state(pod: &Pod, events: &[(String, String)]) -> JobState {
    let terminated = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    if let Some(t) = terminated {
        return JobState::Finished(t.message.as_deref().and_then(Outcome::parse));
    }
    events
        .iter()
        .filter(|(reason, _)| reason == "FailedMount")
        .find_map(|(_, message)| {
            let reason = if message.contains("no captured tree") {
                "TreeNotFound"
            } else if message.contains("couldn't find key") {
                "SecretKeyNotFound"
            } else if message.contains("secret \"") && message.contains("not found") {
                "SecretNotFound"
            } else {
                return None;
            };
            Some(JobState::Blocked {
                reason: reason.into(),
                message: message.clone(),
            })
        })
        .unwrap_or(JobState::Running)
}

/// Whether going from `old` to `new` is a transition (its time is
/// stamped): the phase, the Job or the attempt changed. A retry's backoff
/// counts from the transition that dropped the failed Job.
pub fn is_transition(old: &CaptureStatus, new: &CaptureStatus) -> bool {
    old.phase != new.phase || old.job != new.job || old.attempts != new.attempts
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::CapturePhase;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    #[test]
    fn a_workload_names_its_captures_and_a_capture_job_names_none() {
        let workload = pod(json!({
            "metadata": {"name": "w", "uid": "u1"},
            "spec": {"nodeName": "n", "containers": [], "volumes": [
                {"name": "a", "csi": {"driver": "csi.gkm.io",
                    "volumeAttributes": {ATTR_CAPTURE: "warm"}}},
                {"name": "b", "csi": {"driver": "other.io",
                    "volumeAttributes": {ATTR_CAPTURE: "elsewhere"}}},
                {"name": "c", "emptyDir": {}}]},
            "status": {"phase": "Succeeded"},
        }));
        assert_eq!(captures_named(&workload), vec!["warm".to_string()]);
        let w = super::workload(&workload).expect("a workload");
        assert_eq!(w.state, WorkloadState::Succeeded);
        assert_eq!(w.node.as_deref(), Some("n"));
        let reader = pod(json!({
            "metadata": {"name": "j"},
            "spec": {"containers": [], "volumes": [
                {"name": "tree", "csi": {"driver": "csi.gkm.io", "readOnly": true,
                    "volumeAttributes": {ATTR_CAPTURE: "warm", ATTR_CAPTURED_POD: "u1"}}}]},
        }));
        assert!(captures_named(&reader).is_empty());
    }

    #[test]
    fn a_writable_cache_volume_naming_a_capture_makes_it_a_delta_capture() {
        let workload = pod(json!({
            "metadata": {"name": "w", "uid": "u1"},
            "spec": {"nodeName": "n", "containers": [], "volumes": [
                {"name": "kernels", "csi": {"driver": "csi.gkm.io",
                    "volumeAttributes": {ATTR_CACHE: "base", ATTR_CAPTURE: "warm"}}},
                {"name": "shared", "csi": {"driver": "csi.gkm.io",
                    "volumeAttributes": {ATTR_CLUSTER_CACHE: "base", ATTR_CAPTURE: "hot"}}},
                {"name": "plain", "csi": {"driver": "csi.gkm.io",
                    "volumeAttributes": {ATTR_CAPTURE: "cold"}}}]},
            "status": {"phase": "Succeeded"},
        }));
        let kept = ended_pod(&workload).expect("kept");
        assert_eq!(kept.captures, ["cold", "hot", "warm"]);
        assert_eq!(kept.delta_captures, ["hot", "warm"]);
    }

    #[test]
    fn only_an_ended_pod_naming_a_capture_is_kept_and_without_its_bulk() {
        let named = pod(json!({
            "metadata": {"name": "w", "uid": "u1", "namespace": "ns",
                         "annotations": {"big": "x".repeat(1024)}},
            "spec": {"nodeName": "n", "containers": [],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "volumes": [{"name": "a", "csi": {"driver": "csi.gkm.io",
                    "volumeAttributes": {ATTR_CAPTURE: "warm"}}}]},
            "status": {"phase": "Succeeded"},
        }));
        let kept = ended_pod(&named).expect("kept");
        assert_eq!(kept.captures, vec!["warm".to_string()]);
        assert_eq!(kept.workload.uid, "u1");
        assert_eq!(kept.tolerations.len(), 1);
        let other = pod(json!({
            "metadata": {"name": "o", "uid": "u2"},
            "spec": {"containers": []},
            "status": {"phase": "Succeeded"},
        }));
        assert_eq!(ended_pod(&other), None);
    }

    #[test]
    fn only_namespaces_with_a_capture_under_way_are_watched() {
        let capture = |ns: &str, phase: Option<&str>| -> GKMCacheCapture {
            let mut value = json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
                "metadata": {"name": "c", "namespace": ns},
                "spec": {"targetImage": "r/i:v1", "signing": {"secretName": "s"}},
            });
            if let Some(phase) = phase {
                value["status"] = json!({"phase": phase});
            }
            serde_json::from_value(value).expect("a capture")
        };
        let captures = [
            capture("new", None),
            capture("pending", Some("Pending")),
            capture("capturing", Some("Capturing")),
            capture("done", Some("Complete")),
            capture("failed", Some("Failed")),
        ];
        let watched: Vec<String> = namespaces_under_way(&captures).into_iter().collect();
        assert_eq!(watched, ["capturing", "new", "pending"]);
    }

    #[test]
    fn only_a_job_the_capture_controls_is_its_job() {
        let job = |owner_uid: &str, controller: bool| -> Job {
            serde_json::from_value(json!({
                "metadata": {"name": "capture-warm-1", "ownerReferences": [{
                    "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
                    "name": "warm", "uid": owner_uid, "controller": controller}]},
            }))
            .expect("a Job")
        };
        assert!(is_capture_job(&job("capture-uid", true), "capture-uid"));
        assert!(!is_capture_job(&job("capture-uid", false), "capture-uid"));
        assert!(!is_capture_job(&job("other-uid", true), "capture-uid"));
        let squatted: Job =
            serde_json::from_value(json!({"metadata": {"name": "capture-warm-1"}})).expect("a Job");
        assert!(!is_capture_job(&squatted, "capture-uid"));
    }

    #[test]
    fn only_the_job_of_the_recorded_uid_is_vouched_for() {
        let job = |uid: &str| -> Job {
            serde_json::from_value(json!({
                "metadata": {"name": "capture-warm-1", "uid": uid, "ownerReferences": [{
                    "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
                    "name": "warm", "uid": "capture-uid", "controller": true}]},
            }))
            .expect("a Job")
        };
        assert_eq!(unvouched(&job("made"), "capture-uid", Some("made")), None);
        assert_eq!(
            unvouched(&job("squatter"), "capture-uid", Some("made")),
            Some(Unvouched::OtherUid)
        );
        assert_eq!(
            unvouched(&job("squatter"), "capture-uid", None),
            Some(Unvouched::NotRecorded)
        );
        assert_eq!(
            unvouched(&job("made"), "other-capture", Some("made")),
            Some(Unvouched::NotControlled)
        );
    }

    #[test]
    fn only_a_pod_the_job_controls_is_the_jobs_pod() {
        let owned_by = |name: &str, uid: &str, controller: bool| {
            pod(json!({
                "metadata": {"name": name, "labels": {"job-name": "capture-warm-1"},
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                        "name": "capture-warm-1", "uid": uid, "controller": controller}]},
            }))
        };
        let unowned = pod(json!({
            "metadata": {"name": "a-forged", "labels": {"job-name": "capture-warm-1"}},
        }));
        let other_job = owned_by("b-other", "other-uid", true);
        let not_controller = owned_by("c-shared", "job-uid", false);
        let own = owned_by("d-own", "job-uid", true);
        let pods = [unowned, other_job, not_controller, own];
        let found = job_pod(&pods, "job-uid").expect("the Job's pod");
        assert_eq!(found.metadata.name.as_deref(), Some("d-own"));
        assert!(job_pod(&pods[..3], "job-uid").is_none());
    }

    #[test]
    fn a_job_pod_reads_as_its_outcome_or_what_blocks_it() {
        let ended = pod(json!({
            "metadata": {"name": "j"},
            "status": {"containerStatuses": [{"name": "capture", "image": "i", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0,
                    "message": "{\"captured\":true,\"digest\":\"sha256:ab\"}"}}}]},
        }));
        let JobState::Finished(Some(outcome)) = job_state(&ended, &[]) else {
            panic!("finished");
        };
        assert_eq!(outcome.digest.as_deref(), Some("sha256:ab"));
        let waiting = pod(json!({"metadata": {"name": "j"}}));
        assert_eq!(job_state(&waiting, &[]), JobState::Running);
        let event = |m: &str| vec![("FailedMount".to_string(), m.to_string())];
        let missing =
            event(r#"MountVolume.SetUp failed for volume "signing" : secret "missing" not found"#);
        assert!(matches!(
            job_state(&waiting, &missing),
            JobState::Blocked { reason, .. } if reason == "SecretNotFound"
        ));
        let passing = event("MountVolume.SetUp failed: timed out waiting for the condition");
        assert_eq!(job_state(&waiting, &passing), JobState::Running);
    }

    #[test]
    fn a_new_job_or_phase_is_a_transition_a_message_is_not() {
        let old = CaptureStatus::default();
        let mut new = old.clone();
        new.message = Some("m".into());
        assert!(!is_transition(&old, &new));
        new.phase = CapturePhase::Capturing;
        assert!(is_transition(&old, &new));
    }
}
