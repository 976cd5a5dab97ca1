//! What a tenant's pods can do to the capture controller, against a real
//! kube-apiserver (no kubelet: the pods' statuses are written as a kubelet
//! would, through `pods/status`):
//!
//! - a pod carrying a capture Job's labels and a terminated container's
//!   message, but not made by that Job, does not set the capture's outcome
//!   nor the cache it points; the Job's own pod does; a Job made under the
//!   capture Job's name by someone else is not read at all, nor is one made
//!   before the operator's under that name with the capture as its
//!   controller (the operator reads only the Job whose uid it recorded);
//! - the workload captured is the one that succeeded, whatever the names of
//!   the pods that failed;
//! - a thousand finished pods with 250 KiB of annotations each, most in a
//!   namespace with no capture and the rest beside a capture under way, do
//!   not grow the operator (the gkm-operator process, its peak resident
//!   size), and that capture still sees its workload.

mod operator_support;

use std::process::Command;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCache, GKMCacheCapture};
use gkm_k8s_operator::OperatorConfig;
use gkm_k8s_operator::capture::CaptureControllerOptions;
use gkm_k8s_operator::capture::decide::Retry;
use gkm_k8s_operator::capture::job::JobOptions;
use gkm_k8s_operator::job_pod::ImagePullPolicy;
use gkm_testenv::{ControlPlane, Process, eventually, memory_mib, settle, workspace_binary};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use operator_support::{OPERATOR_NAMESPACE, WAIT, cache, registry_options, spawn_operator};
use serde_json::{Value, json};

/// The node the test's pods say they ran on (no kubelet runs them).
const NODE: &str = "elsewhere";

/// A capture of `ns` pointing the `GKMCache` of its own name.
fn capture(ns: &str, name: &str) -> anyhow::Result<GKMCacheCapture> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"targetImage": format!("registry.invalid/{ns}/{name}:v1"),
                 "signing": {"secretName": "signing"}, "cacheName": name},
    }))?)
}

/// A pod on [`NODE`]: a workload of the capture `capture` when named, with
/// `metadata` merged into its own.
fn pod(ns: &str, name: &str, capture: Option<&str>, metadata: Value) -> anyhow::Result<Pod> {
    let volumes = match capture {
        Some(capture) => json!([{"name": "cache", "csi": {"driver": "csi.gkm.io",
            "volumeAttributes": {"csi.gkm.io/GKMCacheCapture": capture}}}]),
        None => json!([]),
    };
    let mut value = json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": NODE, "restartPolicy": "Never",
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "main", "image": "busybox"}],
                 "volumes": volumes},
    });
    if let (Some(meta), Some(extra)) = (value["metadata"].as_object_mut(), metadata.as_object()) {
        meta.extend(extra.clone());
    }
    Ok(serde_json::from_value(value)?)
}

/// Writes `status` on the pod `name`, as its kubelet would.
async fn set_status(pods: &Api<Pod>, name: &str, status: Value) -> anyhow::Result<()> {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}

/// A terminated container whose message is `message`.
fn terminated(message: &str) -> Value {
    json!({"phase": "Succeeded", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": false,
        "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "message": message}}}]})
}

/// The outcome `gkm capture` writes for `image` pinned to `digest`.
fn captured(image: &str, digest: &str) -> String {
    json!({"captured": true, "image": format!("{image}@{digest}"), "digest": digest}).to_string()
}

/// Waits until the capture `name` shows `phase`; its status.
async fn phase(
    captures: &Api<GKMCacheCapture>,
    name: &str,
    phase: CapturePhase,
) -> anyhow::Result<CaptureStatus> {
    eventually(&format!("the capture {name} {phase:?}"), WAIT, || async {
        let status = captures.get(name).await?.status.unwrap_or_default();
        Ok((status.phase == phase).then_some(status))
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_not_owned_by_the_capture_job_cannot_set_the_captures_outcome() -> anyhow::Result<()>
{
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    let ns = "capture-forgery";
    plane.ensure_pod_namespace(ns).await?;
    plane.ensure_namespace(OPERATOR_NAMESPACE).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), ns);
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), ns);
    let original = "registry.invalid/capture-forgery/warm:original";
    caches
        .create(
            &PostParams::default(),
            &cache(ns, "warm", json!({"image": original}))?,
        )
        .await?;

    // Workloads that ended before their captures were made: "warm"'s and
    // "squatted"'s succeeded; of "chosen"'s, the one that failed sorts
    // first by name.
    for (name, capture, phase) in [
        ("warm-workload", "warm", "Succeeded"),
        ("squatted-workload", "squatted", "Succeeded"),
        ("a-failed", "chosen", "Failed"),
        ("b-succeeded", "chosen", "Succeeded"),
    ] {
        pods.create(
            &PostParams::default(),
            &pod(ns, name, Some(capture), json!({}))?,
        )
        .await?;
        set_status(&pods, name, json!({ "phase": phase })).await?;
    }
    // A Job under the name "squatted"'s first capture Job will have, made
    // by someone else, and a pod it controls ending with an outcome.
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let squatter: Job = serde_json::from_value(json!({
        "metadata": {"name": "capture-squatted-1", "namespace": ns},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}]}}},
    }))?;
    let squatter = jobs.create(&PostParams::default(), &squatter).await?;
    let squatter_pod = json!({
        "labels": {"job-name": "capture-squatted-1"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
            "name": "capture-squatted-1", "uid": squatter.metadata.uid, "controller": true}]});
    pods.create(
        &PostParams::default(),
        &pod(ns, "squatter", None, squatter_pod)?,
    )
    .await?;
    let forged_digest = format!("sha256:{}", "e".repeat(64));
    set_status(
        &pods,
        "squatter",
        terminated(&captured("evil.invalid/squatted", &forged_digest)),
    )
    .await?;

    let options = CaptureControllerOptions {
        job: JobOptions {
            image: "gkm:test".into(),
            image_pull_policy: ImagePullPolicy::Never,
            host_network: false,
        },
        retry: Retry::default(),
        poll: Duration::from_secs(1),
    };
    let operator = spawn_operator(
        &client,
        OperatorConfig {
            registry: registry_options(),
            capture: Some(options),
            ..OperatorConfig::default()
        },
    );
    for name in ["warm", "chosen", "squatted"] {
        captures
            .create(&PostParams::default(), &capture(ns, name)?)
            .await?;
    }
    // "claimed": its workload still runs when someone who read the
    // capture's uid makes a Job under its first capture Job's name, with the
    // capture as controller, already Complete, and a pod it controls ended
    // with an outcome; then the workload ends.
    pods.create(
        &PostParams::default(),
        &pod(ns, "claimed-workload", Some("claimed"), json!({}))?,
    )
    .await?;
    let claimed = captures
        .create(&PostParams::default(), &capture(ns, "claimed")?)
        .await?;
    let claimer: Job = serde_json::from_value(json!({
        "metadata": {"name": "capture-claimed-1", "namespace": ns,
            "ownerReferences": [{"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
                "name": "claimed", "uid": claimed.metadata.uid, "controller": true}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox"}]}}},
    }))?;
    let claimer = jobs.create(&PostParams::default(), &claimer).await?;
    let claimer_uid = claimer.metadata.uid.clone().unwrap_or_default();
    let now = jiff::Timestamp::now().to_string();
    jobs.patch_status(
        "capture-claimed-1",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"succeeded": 1, "startTime": now, "completionTime": now,
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                {"type": "Complete", "status": "True", "lastTransitionTime": now}]}}),
        ),
    )
    .await?;
    let claimer_pod = json!({
        "labels": {"job-name": "capture-claimed-1"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
            "name": "capture-claimed-1", "uid": claimer_uid, "controller": true}]});
    pods.create(
        &PostParams::default(),
        &pod(ns, "claimer", None, claimer_pod)?,
    )
    .await?;
    set_status(
        &pods,
        "claimer",
        terminated(&captured("evil.invalid/claimed", &forged_digest)),
    )
    .await?;
    set_status(&pods, "claimed-workload", json!({"phase": "Succeeded"})).await?;

    // "warm" is being captured by its Job.
    let capturing = phase(&captures, "warm", CapturePhase::Capturing).await?;
    let job_name = capturing
        .job
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no Job: {capturing:?}"))?;
    let job = Api::<Job>::namespaced(client.clone(), ns)
        .get(&job_name)
        .await?;
    let job_uid = job.metadata.uid.clone().unwrap_or_default();

    // Another pod of the namespace, with the Job's labels and an outcome of
    // its own: not the Job's.
    let labels = json!({"labels": {
        "job-name": job_name, "batch.kubernetes.io/job-name": job_name,
        "controller-uid": job_uid, "batch.kubernetes.io/controller-uid": job_uid}});
    pods.create(
        &PostParams::default(),
        &pod(ns, "forged", None, labels.clone())?,
    )
    .await?;
    set_status(
        &pods,
        "forged",
        terminated(&captured("evil.invalid/warm", &forged_digest)),
    )
    .await?;
    // Several of the controller's looks at the Job's pod later, the capture
    // is still under way and the cache unchanged.
    let settled = settle(
        Duration::from_secs(8),
        || async { Ok(captures.get("warm").await?.status.unwrap_or_default()) },
        |status| status.phase.is_final(),
    )
    .await?;
    assert_eq!(settled.phase, CapturePhase::Capturing, "{settled:?}");
    assert_eq!(settled.digest, None, "{settled:?}");
    assert_eq!(caches.get("warm").await?.spec.cache.image, original);

    // The Job's own pod (its controller is the Job) sets the outcome.
    let honest_digest = format!("sha256:{}", "a".repeat(64));
    let mut owned = labels;
    owned["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "Job",
        "name": job_name, "uid": job_uid, "controller": true}]);
    pods.create(&PostParams::default(), &pod(ns, "honest", None, owned)?)
        .await?;
    let honest_image = "registry.invalid/capture-forgery/warm";
    set_status(
        &pods,
        "honest",
        terminated(&captured(honest_image, &honest_digest)),
    )
    .await?;
    let complete = phase(&captures, "warm", CapturePhase::Complete).await?;
    assert_eq!(complete.digest.as_deref(), Some(honest_digest.as_str()));
    assert_eq!(
        caches.get("warm").await?.spec.cache.image,
        format!("{honest_image}@{honest_digest}")
    );

    // "chosen" captures the workload that succeeded; the failed one does
    // not fail it.
    let chosen = settle(
        WAIT,
        || async { Ok(captures.get("chosen").await?.status.unwrap_or_default()) },
        |status| status.phase != CapturePhase::Pending,
    )
    .await?;
    assert_eq!(chosen.phase, CapturePhase::Capturing, "{chosen:?}");
    assert_eq!(chosen.pod.as_deref(), Some("b-succeeded"), "{chosen:?}");

    // "squatted" reads nothing of the Job it did not make: it waits, and
    // names why; no cache is pointed.
    let squatted = settle(
        Duration::from_secs(5),
        || async { Ok(captures.get("squatted").await?.status.unwrap_or_default()) },
        |status| status.phase.is_final(),
    )
    .await?;
    assert_eq!(squatted.phase, CapturePhase::Capturing, "{squatted:?}");
    assert_eq!(
        squatted.reason.as_deref(),
        Some("JobNotOwned"),
        "{squatted:?}"
    );
    assert_eq!(squatted.digest, None, "{squatted:?}");
    assert!(caches.get_opt("squatted").await?.is_none());

    // "claimed" takes nothing of the Job made before its own: that Job is
    // gone, and the one it reads is one it made, still running.
    let claimed = settle(
        Duration::from_secs(8),
        || async { Ok(captures.get("claimed").await?.status.unwrap_or_default()) },
        |status| status.phase.is_final(),
    )
    .await?;
    assert_eq!(claimed.phase, CapturePhase::Capturing, "{claimed:?}");
    assert_eq!(claimed.digest, None, "{claimed:?}");
    assert!(caches.get_opt("claimed").await?.is_none());
    let own = jobs.get("capture-claimed-1").await?;
    assert_ne!(own.metadata.uid.as_deref(), Some(claimer_uid.as_str()));
    assert_eq!(claimed.job_uid, own.metadata.uid, "{claimed:?}");
    operator.abort();
    Ok(())
}

/// The peak resident size the operator may reach while it lists: well
/// under the chart's 256 MiB limit, and under a fifth of what the finished
/// pods' annotations weigh.
const PEAK_MIB: f64 = 128.0;
/// Finished pods: one in [`BESIDE_CAPTURE`] in the capture's namespace,
/// the others in a namespace with no capture.
const FINISHED_PODS: usize = 1000;
/// One finished pod in this many is in the capture's namespace (listed by
/// the operator, in pages).
const BESIDE_CAPTURE: usize = 5;
/// Bytes of annotations on each (the apiserver allows 256 KiB in all).
const ANNOTATION_BYTES: usize = 250 * 1024;

#[tokio::test(flavor = "multi_thread")]
async fn finished_pods_with_huge_annotations_do_not_grow_the_operator() -> anyhow::Result<()> {
    // A control plane of its own: the pods weigh about 250 MB.
    let plane = ControlPlane::start().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    for ns in ["finished", "team"] {
        plane.ensure_pod_namespace(ns).await?;
    }
    plane.ensure_namespace(OPERATOR_NAMESPACE).await?;

    // Finished pods, each made small, ended, then annotated (one large
    // write each).
    let bulk = "x".repeat(ANNOTATION_BYTES);
    futures::stream::iter(0..FINISHED_PODS)
        .map(|i| {
            let ns = if i % BESIDE_CAPTURE == 0 {
                "team"
            } else {
                "finished"
            };
            let (pods, bulk) = (Api::<Pod>::namespaced(client.clone(), ns), &bulk);
            async move {
                let name = format!("done-{i}");
                pods.create(&PostParams::default(), &pod(ns, &name, None, json!({}))?)
                    .await?;
                set_status(&pods, &name, json!({"phase": "Succeeded"})).await?;
                pods.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"bulk": bulk}}})),
                )
                .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;

    // The operator, as users run it: capture on (its default).
    let dir = gkm_testenv::temp_dir()?;
    let mut cmd = Command::new(workspace_binary("gkm-operator")?);
    cmd.arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .arg("--metrics-addr=127.0.0.1:0")
        .arg("--insecure-registry")
        .env("GKM_LOG", "info,kube=warn");
    let mut operator = Process::spawn("gkm-operator", cmd, &dir.path().join("operator.log"))?;

    // The capture beside some of them still sees its workload end.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    pods.create(
        &PostParams::default(),
        &pod("team", "workload", Some("warm"), json!({}))?,
    )
    .await?;
    set_status(&pods, "workload", json!({"phase": "Succeeded"})).await?;
    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), "team");
    captures
        .create(&PostParams::default(), &capture("team", "warm")?)
        .await?;
    let capturing = phase(&captures, "warm", CapturePhase::Capturing)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", operator.log_tail(30)))?;
    assert_eq!(capturing.pod.as_deref(), Some("workload"), "{capturing:?}");

    operator.check_running()?;
    let (_, peak) = memory_mib(operator.pid())?;
    eprintln!("the operator peaked at {peak:.0} MiB");
    assert!(
        peak < PEAK_MIB,
        "the operator peaked at {peak:.0} MiB (bound {PEAK_MIB} MiB) with {FINISHED_PODS} \
         finished pods of {ANNOTATION_BYTES} bytes of annotations"
    );
    Ok(())
}
