//! Capture volumes on a real node (kubelet + containerd + runc calling
//! gkm's CSI driver): a busybox pod writes a real Triton 3.6 sm75 cache into
//! its capture volume and exits; the tree stays on the node, within its
//! bound; a pod of the same namespace naming it reads it read-only, a pod
//! of another namespace cannot mount it; the tree, captured with
//! `gkm_oci::capture` (what the capture Job runs), becomes an image in the
//! real registry that verifies with the capture's key; a tree holding a
//! symbolic link to /etc is refused and nothing is pushed; released, the
//! trees leave nothing on the node.

use std::time::{Duration, Instant};

use gkm_core::policy::Policy;
use gkm_local::{SimulatedNode, Stack, cosign, repo_root};
use gkm_oci::capture::{CaptureOptions, FailureReason, capture};
use gkm_oci::sign::SigningKey;
use gkm_oci::{ImageRef, RegistryOptions};
use gkm_testenv::{BUSYBOX_IMAGE, mounts_under, pod_events, pod_log, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "real-capture";
/// The capture volume's bound in the test: 8 MiB.
const BOUND: &str = "8388608";

/// A pod on the real node running `script` with `volumes` mounted as
/// `mounts`, once (`restartPolicy: Never`).
fn pod(ns: &str, name: &str, script: &str, mounts: Value, volumes: Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    }))?)
}

/// A workload writing into its capture volume of the capture `capture`:
/// the real Triton fixture (from a read-only hostPath), then `extra`.
fn workload(ns: &str, name: &str, capture: &str, extra: &str) -> anyhow::Result<Pod> {
    let fixture = repo_root()
        .join("fixtures/triton/cuda-75-32")
        .canonicalize()?;
    pod(
        ns,
        name,
        &format!("cp -r /fixture/. /capture/ && {extra} echo WROTE"),
        json!([{"name": "capture", "mountPath": "/capture"},
               {"name": "fixture", "mountPath": "/fixture", "readOnly": true}]),
        json!([{"name": "capture", "csi": {"driver": "csi.gkm.io", "volumeAttributes": {
                    "csi.gkm.io/GKMCacheCapture": capture,
                    "csi.gkm.io/captureMaxBytes": BOUND}}},
               {"name": "fixture", "hostPath": {"path": fixture.display().to_string(),
                                                 "type": "Directory"}}]),
    )
}

/// A pod reading the tree of the workload `uid` read-only.
fn reader(ns: &str, name: &str, capture: &str, uid: &str) -> anyhow::Result<Pod> {
    pod(
        ns,
        name,
        "ls -1 /captured; if touch /captured/x 2>/dev/null; then echo WRITABLE; else echo READ-ONLY; fi",
        json!([{"name": "captured", "mountPath": "/captured", "readOnly": true}]),
        json!([{"name": "captured", "csi": {"driver": "csi.gkm.io", "readOnly": true,
                "volumeAttributes": {"csi.gkm.io/GKMCacheCapture": capture,
                                     "csi.gkm.io/capturedPodUID": uid}}}]),
    )
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn succeeded(pod: &Pod) -> bool {
    phase(pod) == Some("Succeeded")
}

/// Runs `pod` to completion; its uid and log.
async fn run(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<(String, String)> {
    pods.create(&PostParams::default(), pod).await?;
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let done = wait_for_pod(pods, name, TIMEOUT, |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await?;
    let log = pod_log(pods, name, "main").await?;
    anyhow::ensure!(succeeded(&done), "pod {name} failed:\n{log}");
    Ok((done.metadata.uid.clone().unwrap_or_default(), log))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_pods_capture_volume_is_kept_bounded_private_and_captured() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start(tmp.path(), Vec::new()).await?;
    stack
        .add_real_node(SimulatedNode::new(NODE, "gpus:\n- profile: T4\n"))
        .await?;
    // Only the CSI driver: capture volumes need nothing else of gkm.
    stack.start_csi(NODE)?;
    let client = stack.plane.client().await?;
    for ns in ["team-a", "team-b"] {
        stack.plane.ensure_namespace(ns).await?;
    }
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), "team-b");
    let store = stack.store_dir(NODE);

    // The workload writes the real cache, and cannot write past the bound.
    let overflow = "if dd if=/dev/zero of=/capture/pad bs=1048576 count=16 2>/dev/null; \
                    then echo UNBOUNDED; else echo BOUNDED; fi; rm -f /capture/pad;";
    let (uid, log) = run(&pods_a, &workload("team-a", "warm", "warm", overflow)?).await?;
    assert!(log.contains("BOUNDED") && log.contains("WROTE"), "{log}");
    assert!(!log.contains("UNBOUNDED"), "{log}");
    let tree = store.join("captures/team-a/warm").join(&uid);
    assert!(
        tree.join("LAMOZNIA4HG7EPNHEH7QL6ALYSMD7OM2ALAKCJHO2JP33QD6LRZQ")
            .is_dir(),
        "the tree outlives the pod at {}",
        tree.display()
    );

    // Its namespace reads it read-only; another namespace cannot mount it.
    let (_, log) = run(&pods_a, &reader("team-a", "job", "warm", &uid)?).await?;
    assert!(
        log.contains("LAMOZNIA4HG7EPNHEH7QL6ALYSMD7OM2ALAKCJHO2JP33QD6LRZQ"),
        "{log}"
    );
    assert!(log.contains("READ-ONLY"), "{log}");
    pods_b
        .create(
            &PostParams::default(),
            &reader("team-b", "thief", "warm", &uid)?,
        )
        .await?;
    let deadline = Instant::now() + TIMEOUT;
    let refused = loop {
        let events = pod_events(&client, "team-b", "thief").await?;
        if let Some(e) = events.iter().find(|e| e.contains("no captured tree")) {
            break e.clone();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no FailedMount for the thief: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(refused.starts_with("FailedMount"), "{refused}");
    assert_eq!(phase(&pods_b.get("thief").await?), Some("Pending"));

    // Captured (as the capture Job would): signed, verified, tagged.
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    let signing = SigningKey::from_pem(
        &std::fs::read_to_string(&key.private_key)?,
        cosign::PASSWORD.as_bytes(),
    )?;
    let registry = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let target: ImageRef = format!("{}/team-a/warm:v1", stack.registry.addr()).parse()?;
    let captured = capture(
        &tree,
        &target,
        &signing,
        &CaptureOptions::default(),
        &registry,
        None,
    )
    .await?;
    assert_eq!(captured.cache.summary().to_string(), "cuda/75/32");
    let public = gkm_core::policy::PublicKey::from_pem(&key.public_pem)?;
    let verified = gkm_oci::verify::verify(
        &captured.pinned,
        &registry,
        &captured.digest,
        &Policy::keys(vec![public])?,
    )
    .await?;
    assert_eq!(verified.digest, captured.digest.to_string());

    // A workload that leaves a link to /etc: refused, nothing pushed.
    let (evil_uid, _) = run(
        &pods_a,
        &workload("team-a", "evil", "evil", "ln -s /etc /capture/etc &&")?,
    )
    .await?;
    let evil_tree = store.join("captures/team-a/evil").join(&evil_uid);
    let evil: ImageRef = format!("{}/team-a/evil:v1", stack.registry.addr()).parse()?;
    let err = capture(
        &evil_tree,
        &evil,
        &signing,
        &CaptureOptions::default(),
        &registry,
        None,
    )
    .await
    .expect_err("refused");
    assert_eq!(err.reason(), FailureReason::UnsafeTree, "{err}");
    assert!(err.to_string().contains("symbolic link to /etc"), "{err}");
    assert!(
        !stack
            .registry
            .root()
            .join("docker/registry/v2/repositories/team-a/evil")
            .exists(),
        "nothing pushed for the refused tree"
    );

    // Released: nothing left on the node.
    let driver = gkm_k8s_csi::Driver::new(&gkm_k8s_csi::DriverConfig {
        node_name: NODE.into(),
        store_root: store.clone(),
    })?;
    driver.node.release_capture("team-a", "warm", &uid)?;
    driver.node.release_capture("team-a", "evil", &evil_uid)?;
    let captures = store.join("captures");
    assert!(
        mounts_under(&captures).is_empty(),
        "{:?}",
        mounts_under(&captures)
    );
    assert!(!tree.exists() && !evil_tree.exists());
    Ok(())
}
