//! Capture volumes on a real node (kubelet + containerd + runc calling
//! gkm's CSI driver): a busybox pod writes a real Triton 3.6 sm75 cache into
//! its capture volume and exits; the tree stays on the node, within its
//! bound; a pod of the same namespace naming it reads it read-only, a pod
//! of another namespace cannot mount it; the tree, captured with
//! `gkm_oci::capture` (what the capture Job runs), becomes an image in the
//! real registry that verifies with the capture's key; a tree holding a
//! symbolic link to /etc is refused and nothing is pushed; released, the
//! trees leave nothing on the node. Then the operator's capture controller,
//! in process, drives captures on its own: a workload ends, the controller
//! runs the capture Job (gkm's own image, on the real kubelet) and the
//! capture completes with a digest that verifies, its `GKMCache` pointed at
//! it; a link to /etc, a missing Secret and an unreachable registry (retried
//! once) end Failed with their reason and nothing pushed.

use std::path::Path;
use std::time::{Duration, Instant};

use gkm_core::policy::Policy;
use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCache, GKMCacheCapture};
use gkm_k8s_operator::capture::controller::{CaptureControllerOptions, run as capture_controller};
use gkm_k8s_operator::capture::decide::Retry;
use gkm_k8s_operator::capture::job::JobOptions;
use gkm_local::{SimulatedNode, Stack, cosign, repo_root};
use gkm_oci::capture::{CaptureOptions, FailureReason, capture};
use gkm_oci::sign::SigningKey;
use gkm_oci::{ImageRef, RegistryOptions};
use gkm_testenv::{BUSYBOX_IMAGE, mounts_under, pod_events, pod_log, wait_for_pod};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::CustomResourceExt;
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

/// Unmounts whatever capture trees are left under a store's `captures`
/// directory when dropped, so a failing test leaves no mount behind (the
/// node's teardown covers the kubelet's directory, not the store).
struct LeaveNoTrees(std::path::PathBuf);

impl Drop for LeaveNoTrees {
    fn drop(&mut self) {
        for mount in mounts_under(&self.0).iter().rev() {
            let _ = gkm_k8s_csi::mount::unmount_all(mount);
        }
    }
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
    let _cleanup = LeaveNoTrees(store.join("captures"));

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

/// Waits until the capture `name` is over (Complete or Failed).
async fn over(captures: &Api<GKMCacheCapture>, name: &str) -> anyhow::Result<CaptureStatus> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let status = captures.get(name).await?.status.unwrap_or_default();
        if status.phase.is_final() {
            return Ok(status);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the capture {name} is not over: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_capture_controller_captures_ended_workloads_on_the_real_node() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack =
        Stack::start_with_controllers(tmp.path(), Vec::new(), &["job-controller"]).await?;
    stack
        .add_real_node(SimulatedNode::new(NODE, "gpus:\n- profile: T4\n"))
        .await?;
    stack.start_csi(NODE)?;
    // The gkm command line's image, as hack/images.sh builds it, in the
    // node's containerd.
    let gkm = gkm_testenv::workspace_binary("gkm")?;
    let socket = stack
        .real_node(NODE)
        .ok_or_else(|| anyhow::anyhow!("no real node"))?
        .containerd_socket();
    let images = std::process::Command::new(repo_root().join("hack/images.sh"))
        .args(["--profile", "dev", "--bin-dir"])
        .arg(gkm.parent().unwrap_or(Path::new(".")))
        .arg("--out")
        .arg(tmp.path().join("images"))
        .arg("--import")
        .arg(&socket)
        .arg("gkm")
        .output()?;
    anyhow::ensure!(
        images.status.success(),
        "hack/images.sh gkm: {}",
        String::from_utf8_lossy(&images.stderr)
    );
    let store = stack.store_dir(NODE);
    let _cleanup = LeaveNoTrees(store.join("captures"));
    stack
        .plane
        .install_crds(&[GKMCacheCapture::crd(), GKMCache::crd()])
        .await?;
    stack.plane.ensure_namespace("team-a").await?;
    let client = stack.plane.client().await?;

    // The tenant's signing Secret, in its namespace.
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "signing", "namespace": "team-a"},
        "stringData": {"cosign.key": std::fs::read_to_string(&key.private_key)?,
                       "cosign.password": cosign::PASSWORD},
    }))?;
    Api::<Secret>::namespaced(client.clone(), "team-a")
        .create(&PostParams::default(), &secret)
        .await?;

    // The operator's capture controller, in process.
    let options = CaptureControllerOptions {
        job: JobOptions {
            image: "ghcr.io/gkm-rs/gkm:v0.1.0".into(),
            image_pull_policy: "Never".into(),
            // The registry listens on the host's loopback.
            host_network: true,
        },
        retry: Retry {
            max_attempts: 2,
            base: Duration::from_secs(1),
            cap: Duration::from_secs(1),
        },
        poll: Duration::from_millis(500),
    };
    let controller = tokio::spawn(capture_controller(client.clone(), options));

    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), "team-a");
    let registry_addr = stack.registry.addr().to_string();
    let make = |name: &str, registry: &str, secret: &str| {
        serde_json::from_value::<GKMCacheCapture>(json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"targetImage": format!("{registry}/team-a/{name}:v1"),
                     "signing": {"secretName": secret},
                     "insecureRegistry": true, "maxBytes": "8MiB", "cacheName": name},
        }))
    };
    // A closed port: the registry cannot be reached.
    let unreachable = "127.0.0.1:9";
    for (name, registry, secret) in [
        ("warm", registry_addr.as_str(), "signing"),
        ("evil", registry_addr.as_str(), "signing"),
        ("nokey", registry_addr.as_str(), "missing"),
        ("down", unreachable, "signing"),
    ] {
        captures
            .create(&PostParams::default(), &make(name, registry, secret)?)
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    for (name, extra) in [
        ("warm", ""),
        ("evil", "ln -s /etc /capture/etc &&"),
        ("nokey", ""),
        ("down", ""),
    ] {
        run(&pods, &workload("team-a", name, name, extra)?).await?;
    }

    // The workload ended: captured on its own, the digest verifies, the tag
    // names it, and the named GKMCache points at it.
    let warm = over(&captures, "warm").await?;
    assert_eq!(warm.phase, CapturePhase::Complete, "{warm:?}");
    let digest: gkm_oci::Digest = warm
        .digest
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no digest"))?
        .parse()?;
    let pinned: ImageRef = warm.image.clone().unwrap_or_default().parse()?;
    let registry = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let public = gkm_core::policy::PublicKey::from_pem(&key.public_pem)?;
    gkm_oci::verify::verify(&pinned, &registry, &digest, &Policy::keys(vec![public])?).await?;
    let target: ImageRef = format!("{registry_addr}/team-a/warm:v1").parse()?;
    let tagged = gkm_oci::Repo::open(&target, &registry)?
        .fetch_manifest()
        .await?;
    assert_eq!(tagged.digest, digest, "the tag names the captured digest");
    let cache = Api::<GKMCache>::namespaced(client.clone(), "team-a")
        .get("warm")
        .await?;
    assert_eq!(Some(cache.spec.cache.image), warm.image);

    // A link to /etc: Failed with the Job's reason, nothing pushed.
    let evil = over(&captures, "evil").await?;
    assert_eq!(evil.phase, CapturePhase::Failed, "{evil:?}");
    assert_eq!(evil.reason.as_deref(), Some("UnsafeTree"), "{evil:?}");
    assert!(
        evil.message.as_deref().unwrap_or_default().contains("/etc"),
        "{evil:?}"
    );
    assert!(
        !stack
            .registry
            .root()
            .join("docker/registry/v2/repositories/team-a/evil")
            .exists(),
        "nothing pushed for the refused tree"
    );

    // A Secret the namespace lacks: Failed, the blocked Job deleted.
    let nokey = over(&captures, "nokey").await?;
    assert_eq!(nokey.phase, CapturePhase::Failed, "{nokey:?}");
    assert_eq!(nokey.reason.as_deref(), Some("SecretNotFound"), "{nokey:?}");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "team-a");
    let job = nokey.job.clone().unwrap_or_default();
    let deadline = Instant::now() + TIMEOUT;
    while jobs.get_opt(&job).await?.is_some() {
        anyhow::ensure!(Instant::now() < deadline, "the blocked Job {job} stays");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // An unreachable registry: retried, then Failed.
    let down = over(&captures, "down").await?;
    assert_eq!(down.phase, CapturePhase::Failed, "{down:?}");
    assert_eq!(down.reason.as_deref(), Some("RegistryError"), "{down:?}");
    assert_eq!(down.attempts, 2, "{down:?}");

    // Every capture is over, so its tree may go. Nothing on the node
    // releases trees yet: the test does what the node will, for the
    // captures the controller ended, and nothing is left.
    let driver = gkm_k8s_csi::Driver::new(&gkm_k8s_csi::DriverConfig {
        node_name: NODE.into(),
        store_root: store.clone(),
    })?;
    for name in ["warm", "evil", "nokey", "down"] {
        assert!(over(&captures, name).await?.phase.is_final());
        let uid = pods.get(name).await?.metadata.uid.unwrap_or_default();
        driver.node.release_capture("team-a", name, &uid)?;
    }
    let captured = store.join("captures");
    assert!(
        mounts_under(&captured).is_empty(),
        "{:?}",
        mounts_under(&captured)
    );
    controller.abort();
    Ok(())
}
