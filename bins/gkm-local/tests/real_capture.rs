//! Capture volumes on a real node (kubelet + containerd + runc calling
//! gkm's CSI driver): a busybox pod writes a real Triton 3.6 sm75 cache into
//! its capture volume and exits; the tree stays on the node, within its
//! bound; a pod of the same namespace naming it reads it read-only, a pod
//! of another namespace cannot mount it; the tree, captured with
//! `gkm_oci::capture` (what the capture Job runs), becomes an image in the
//! real registry that verifies with the capture's key; a tree holding a
//! symbolic link to /etc is refused and nothing is pushed; the tag is
//! written last, after the manifest by digest is pushed, signed and
//! verified. The node's CSI driver removes each tree once its capture is
//! over, or deleted, and nothing is left on the node. Then the operator
//! (the gkm-operator binary, with the RBAC deploy/ ships) drives captures
//! on its own: a workload ends, the operator runs the capture Job (gkm's own
//! image, on the real kubelet) and the capture completes with a digest that
//! verifies, its `GKMCache` pointed at it; a link to /etc, a tree over the
//! size limit, a tree that is not a cache, a Secret of another namespace
//! and an unreachable registry (retried once) end Failed with their reason
//! and nothing pushed; an operator restarted while a capture Job runs
//! carries on with that Job, and a capture Job whose pod is killed fails
//! the capture with nothing tagged. The node releases every tree.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use gkm_core::policy::Policy;
use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCache, GKMCacheCapture};
use gkm_local::{SimulatedNode, Stack, cosign, repo_root};
use gkm_oci::capture::{CaptureOptions, FailureReason, capture};
use gkm_oci::sign::SigningKey;
use gkm_oci::{ImageRef, RegistryOptions};
use gkm_testenv::{eventually, mounts_under, pod_events, pod_log, settle, until, wait_for_pod};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "real-capture";
/// The capture volume's bound in the test: 8 MiB.
const BOUND: &str = "8388608";

/// A pod on the real node running `script` with `volumes` mounted as
/// `mounts`, once (`restartPolicy: Never`).
fn pod(ns: &str, name: &str, script: &str, mounts: Value, volumes: Value) -> anyhow::Result<Pod> {
    pod_running(ns, name, json!(["/bin/sh", "-c", script]), mounts, volumes)
}

/// A pod on the real node running `command` with `volumes` mounted as
/// `mounts`, once, with `HOME=/tmp`.
fn pod_running(
    ns: &str,
    name: &str,
    command: Value,
    mounts: Value,
    volumes: Value,
) -> anyhow::Result<Pod> {
    gkm_local::once_pod(ns, name, NODE, command, mounts, volumes)
}

/// A workload writing into its capture volume of the capture `capture`:
/// the real Triton fixture (from a read-only hostPath), then `extra`.
fn workload(ns: &str, name: &str, capture: &str, extra: &str) -> anyhow::Result<Pod> {
    writer(
        ns,
        name,
        capture,
        &format!("cp -r /fixture/. /capture/ && {extra} echo WROTE"),
    )
}

/// A workload running `script` with its capture volume of the capture
/// `capture` at /capture (and the real Triton fixture at /fixture).
fn writer(ns: &str, name: &str, capture: &str, script: &str) -> anyhow::Result<Pod> {
    let fixture = repo_root()
        .join("fixtures/triton/cuda-75-32")
        .canonicalize()?;
    pod(
        ns,
        name,
        script,
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
            let _ = gkm_k8s_csi::unmount_all(mount);
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

/// A capture of `ns` pushing `name` to `registry`, signed with the Secret
/// `secret`, at most `max_bytes`.
fn capture_object(
    ns: &str,
    name: &str,
    registry: &str,
    secret: &str,
    max_bytes: &str,
) -> anyhow::Result<GKMCacheCapture> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"targetImage": format!("{registry}/{ns}/{name}:v1"),
                 "signing": {"secretName": secret},
                 "insecureRegistry": true, "maxBytes": max_bytes, "cacheName": name},
    }))?)
}

/// Writes a capture's status as the operator would.
async fn set_status(
    captures: &Api<GKMCacheCapture>,
    name: &str,
    status: Value,
) -> anyhow::Result<()> {
    captures
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    Ok(())
}

/// Waits until the node's CSI driver removed `tree`, its mount, and its
/// capture's directory once empty (the driver removes that one just after
/// the tree; a directory holding another pod's tree stays).
async fn released(tree: &Path) -> anyhow::Result<()> {
    let capture_dir_done = || {
        tree.parent().is_none_or(|dir| {
            std::fs::read_dir(dir).map_or(true, |mut entries| entries.next().is_some())
        })
    };
    until(
        &format!("the captured tree {} gone from the node", tree.display()),
        TIMEOUT,
        || !tree.exists() && mounts_under(tree).is_empty() && capture_dir_done(),
    )
    .await
}

/// Whether the registry holds the repository `repo` at all.
fn pushed(stack: &Stack, repo: &str) -> bool {
    stack.registry.repository_dir(repo).exists()
}

/// Records, at each step of a capture, whether the target's tag and its
/// manifest by digest were in the registry then.
struct TagWatch {
    repository: std::path::PathBuf,
    tag: String,
    seen: Mutex<Vec<(String, bool, usize)>>,
}

impl gkm_oci::Report for TagWatch {
    fn step(&self, name: &str, _total: Option<u64>) {
        let tagged = self
            .repository
            .join("_manifests/tags")
            .join(&self.tag)
            .exists();
        let manifests = std::fs::read_dir(self.repository.join("_manifests/revisions/sha256"))
            .map(|d| d.count())
            .unwrap_or(0);
        if let Ok(mut seen) = self.seen.lock() {
            seen.push((name.to_string(), tagged, manifests));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_pods_capture_volume_is_kept_bounded_private_and_captured() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start(tmp.path(), Vec::new()).await?;
    stack
        .add_real_node(SimulatedNode::new(NODE, "gpus:\n- profile: T4\n"))
        .await?;
    // The CSI driver, and the agent that tells it which captured trees may
    // go: capture volumes need nothing else of gkm.
    stack.start_csi(NODE)?;
    stack.start_agent(NODE)?;
    let client = stack.plane.client().await?;
    for ns in ["team-a", "team-b"] {
        stack.plane.ensure_namespace(ns).await?;
    }
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), "team-b");
    let store = stack.store_dir(NODE);
    let _cleanup = LeaveNoTrees(store.join("captures"));
    // The captures exist, not started: the node keeps their trees.
    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), "team-a");
    for name in ["warm", "evil"] {
        let made = capture_object("team-a", name, stack.registry.addr(), "signing", "8MiB")?;
        captures.create(&PostParams::default(), &made).await?;
    }

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
    let events = settle(
        TIMEOUT,
        || pod_events(&client, "team-b", "thief"),
        |events| events.iter().any(|e| e.contains("no captured tree")),
    )
    .await?;
    let refused = events
        .iter()
        .find(|e| e.contains("no captured tree"))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no FailedMount for the thief: {events:?}"))?;
    assert!(refused.starts_with("FailedMount"), "{refused}");
    assert_eq!(phase(&pods_b.get("thief").await?), Some("Pending"));

    // Captured (as the capture Job would): signed, verified, tagged; the
    // tag written last, once the manifest is in the registry by digest.
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
    let watch = Arc::new(TagWatch {
        repository: stack.registry.repository_dir("team-a/warm"),
        tag: "v1".into(),
        seen: Mutex::new(Vec::new()),
    });
    let captured = capture(
        &tree,
        &target,
        &signing,
        &CaptureOptions::default(),
        &registry,
        Some(watch.clone()),
    )
    .await?;
    assert_eq!(captured.cache.summary().to_string(), "cuda/75/32");
    let steps = watch
        .seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let at = |prefix: &str| {
        steps
            .iter()
            .find(|(name, _, _)| name.starts_with(prefix))
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no step {prefix}: {steps:?}"))
    };
    for step in ["signing", "verifying", "tagging"] {
        let (_, tagged, manifests) = at(step)?;
        assert!(!tagged, "tagged before {step} finished: {steps:?}");
        assert!(manifests > 0, "no manifest by digest at {step}: {steps:?}");
    }
    assert!(
        steps.iter().all(|(_, tagged, _)| !tagged),
        "the tag came before the last step: {steps:?}"
    );
    let public = gkm_core::policy::PublicKey::from_pem(&key.public_pem)?;
    let verified = gkm_oci::verify::verify(
        &captured.pinned,
        &registry,
        &captured.digest,
        &Policy::keys(vec![public])?,
    )
    .await?;
    assert_eq!(verified.digest, captured.digest.to_string());
    let tagged = gkm_oci::Repo::open(&target, &registry)?
        .fetch_manifest()
        .await?;
    assert_eq!(tagged.digest, captured.digest);

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
        !pushed(&stack, "team-a/evil"),
        "nothing pushed for the refused tree"
    );

    // The node keeps both trees while their captures are open, removes the
    // one whose capture is over, and the one whose capture was deleted.
    let node = json!({"phase": "Capturing", "node": NODE});
    set_status(&captures, "warm", node.clone()).await?;
    set_status(&captures, "evil", node).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        tree.is_dir() && evil_tree.is_dir(),
        "open captures' trees stay"
    );
    set_status(&captures, "warm", json!({"phase": "Complete"})).await?;
    released(&tree).await?;
    assert!(evil_tree.is_dir(), "an open capture's tree stays");
    captures.delete("evil", &DeleteParams::default()).await?;
    released(&evil_tree).await?;
    let captured_dir = store.join("captures");
    assert!(
        mounts_under(&captured_dir).is_empty(),
        "{:?}",
        mounts_under(&captured_dir)
    );
    assert!(
        !captured_dir.join("team-a/warm").exists() && !captured_dir.join("team-a/evil").exists(),
        "empty capture directories go too"
    );
    Ok(())
}

/// Waits until the capture `name` is over (Complete or Failed).
async fn over(captures: &Api<GKMCacheCapture>, name: &str) -> anyhow::Result<CaptureStatus> {
    let status = settle(
        TIMEOUT,
        || async { Ok(captures.get(name).await?.status.unwrap_or_default()) },
        |status| status.phase.is_final(),
    )
    .await?;
    anyhow::ensure!(
        status.phase.is_final(),
        "the capture {name} is not over: {status:?}"
    );
    Ok(status)
}

/// A TCP proxy to `upstream` that holds every connection until its gate
/// opens (a registry that does not answer yet).
struct GatedRegistry {
    addr: String,
    gate: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl GatedRegistry {
    async fn start(upstream: &str) -> anyhow::Result<GatedRegistry> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (gate, opened) = tokio::sync::watch::channel(false);
        let upstream = upstream.to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut opened = opened.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if opened.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(GatedRegistry { addr, gate, task })
    }

    fn open(&self) {
        let _ = self.gate.send(true);
    }
}

impl Drop for GatedRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the capture `name`'s Job has a running pod; its name.
async fn job_pod_running(
    captures: &Api<GKMCacheCapture>,
    pods: &Api<Pod>,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let seen = RefCell::new(CaptureStatus::default());
    eventually(
        &format!("a running Job pod of the capture {name}"),
        TIMEOUT,
        || async {
            let status = captures.get(name).await?.status.unwrap_or_default();
            let mut running = None;
            if let Some(job) = &status.job {
                let listed = pods
                    .list(&ListParams::default().labels(&format!("job-name={job}")))
                    .await?;
                running = listed
                    .items
                    .iter()
                    .find(|p| phase(p) == Some("Running"))
                    .map(|pod| (job.clone(), pod.metadata.name.clone().unwrap_or_default()));
            }
            *seen.borrow_mut() = status;
            Ok(running)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {:?}", seen.borrow()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_captures_ended_workloads_on_the_real_node() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start_with_real_t4(tmp.path(), NODE).await?;
    stack.start_csi(NODE)?;
    // Its agent writes the capture index, without which the driver
    // publishes no capture volume.
    stack.start_agent(NODE)?;
    // The gkm command line's image, as hack/images/build.sh builds it, in the
    // node's containerd.
    let gkm = gkm_testenv::workspace_binary("gkm")?;
    let socket = stack
        .real_node(NODE)
        .ok_or_else(|| anyhow::anyhow!("no real node"))?
        .containerd_socket();
    let images = std::process::Command::new(repo_root().join("hack/images/build.sh"))
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
        "hack/images/build.sh gkm: {}",
        String::from_utf8_lossy(&images.stderr)
    );
    let store = stack.store_dir(NODE);
    let _cleanup = LeaveNoTrees(store.join("captures"));
    for ns in ["team-a", "team-b"] {
        stack.plane.ensure_namespace(ns).await?;
    }
    let client = stack.plane.client().await?;

    // The tenant's signing Secret, in its namespace; another tenant's, in
    // theirs.
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    for (ns, name) in [("team-a", "signing"), ("team-b", "team-b-signing")] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "stringData": {"cosign.key": std::fs::read_to_string(&key.private_key)?,
                           "cosign.password": cosign::PASSWORD},
        }))?;
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await?;
    }

    // The operator, as its ServiceAccount: capture Jobs in the node's
    // network (the registry listens on the host's loopback), from the
    // imported image; a registry failure retried once.
    let capture_args = [
        "--job-host-network",
        "--job-image-pull-policy=Never",
        "--capture-attempts=2",
    ];
    let operator_args: Vec<String> = [
        "--resolve-interval=2s",
        "--tenant-signer-namespaces=team-a,team-b,team-c",
    ]
    .into_iter()
    .chain(capture_args)
    .map(String::from)
    .collect();
    let agent_args = vec!["--resync=2s".to_string(), "--gc-grace=0s".to_string()];
    stack.set_args(operator_args, agent_args);
    stack.start_operator()?;

    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), "team-a");
    let registry_addr = stack.registry.addr().to_string();
    // A closed port: the registry cannot be reached.
    let unreachable = "127.0.0.1:9";
    // Registries that answer only once told to.
    let held = GatedRegistry::start(&registry_addr).await?;
    let stuck = GatedRegistry::start(&registry_addr).await?;
    let cases = [
        ("warm", registry_addr.as_str(), "signing", "8MiB"),
        ("evil", registry_addr.as_str(), "signing", "8MiB"),
        ("big", registry_addr.as_str(), "signing", "64KiB"),
        ("notes", registry_addr.as_str(), "signing", "8MiB"),
        ("foreign", registry_addr.as_str(), "team-b-signing", "8MiB"),
        ("down", unreachable, "signing", "8MiB"),
        ("held", held.addr.as_str(), "signing", "8MiB"),
        ("killed", stuck.addr.as_str(), "signing", "8MiB"),
    ];
    for (name, registry, secret, max_bytes) in cases {
        captures
            .create(
                &PostParams::default(),
                &capture_object("team-a", name, registry, secret, max_bytes)?,
            )
            .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let mut uids = BTreeMap::new();
    for (name, _, _, _) in cases {
        let made = match name {
            "evil" => workload("team-a", name, name, "ln -s /etc /capture/etc &&")?,
            "notes" => writer(
                "team-a",
                name,
                name,
                "mkdir /capture/notes && echo hello > /capture/notes/readme.txt",
            )?,
            _ => workload("team-a", name, name, "")?,
        };
        let (uid, _) = run(&pods, &made).await?;
        uids.insert(name, uid);
    }

    // The operator restarts while the capture Job of "held" waits on its
    // registry: the new one carries on with the same Job.
    let (held_job, _) = job_pod_running(&captures, &pods, "held").await?;
    stack.start_operator()?;
    held.open();
    let resumed = over(&captures, "held").await?;
    assert_eq!(resumed.phase, CapturePhase::Complete, "{resumed:?}");
    assert_eq!(resumed.attempts, 1, "{resumed:?}");
    assert_eq!(resumed.job.as_deref(), Some(held_job.as_str()));

    // The capture Job of "killed" loses its pod mid-way: the capture fails,
    // nothing is tagged.
    let (_, killed_pod) = job_pod_running(&captures, &pods, "killed").await?;
    pods.delete(&killed_pod, &DeleteParams::default().grace_period(0))
        .await?;
    let killed = over(&captures, "killed").await?;
    assert_eq!(killed.phase, CapturePhase::Failed, "{killed:?}");
    assert_eq!(killed.reason.as_deref(), Some("NoOutcome"), "{killed:?}");
    assert!(
        !pushed(&stack, "team-a/killed"),
        "nothing pushed for killed"
    );

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

    // Refused trees and Secrets: Failed with their reason, nothing pushed.
    for (name, reason, says) in [
        ("evil", "UnsafeTree", "/etc"),
        ("big", "UnsafeTree", "total-too-large"),
        ("notes", "NotACache", "cache"),
        ("foreign", "SecretNotFound", "team-b-signing"),
    ] {
        let status = over(&captures, name).await?;
        assert_eq!(status.phase, CapturePhase::Failed, "{name}: {status:?}");
        assert_eq!(status.reason.as_deref(), Some(reason), "{name}: {status:?}");
        assert!(
            status.message.as_deref().unwrap_or_default().contains(says),
            "{name}: {status:?}"
        );
        assert!(
            !pushed(&stack, &format!("team-a/{name}")),
            "nothing pushed for {name}"
        );
    }
    // The blocked Job is deleted.
    let foreign = over(&captures, "foreign").await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "team-a");
    let job = foreign.job.clone().unwrap_or_default();
    eventually(&format!("the blocked Job {job} gone"), TIMEOUT, || async {
        Ok(jobs.get_opt(&job).await?.is_none().then_some(()))
    })
    .await?;

    // An unreachable registry: retried, then Failed.
    let down = over(&captures, "down").await?;
    assert_eq!(down.phase, CapturePhase::Failed, "{down:?}");
    assert_eq!(down.reason.as_deref(), Some("RegistryError"), "{down:?}");
    assert_eq!(down.attempts, 2, "{down:?}");

    // Every capture is over: the node (its agent telling its CSI driver)
    // removed every tree on its own.
    stack.start_agent(NODE)?;
    for (name, uid) in &uids {
        released(&store.join("captures/team-a").join(name).join(uid)).await?;
    }
    let captured = store.join("captures");
    assert!(
        mounts_under(&captured).is_empty(),
        "{:?}",
        mounts_under(&captured)
    );

    // The GKMCache the capture made, once its signer is named, is delivered
    // to another pod through the CSI volume, and real Triton reuses the
    // captured tree there: it compiles nothing.
    let signature = json!({"signers": [{"key": {"publicKey": key.public_pem}}]});
    Api::<GKMCache>::namespaced(client.clone(), "team-a")
        .patch(
            "warm",
            &PatchParams::apply("real-capture").force(),
            &Patch::Apply(json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                "metadata": {"name": "warm", "namespace": "team-a"},
                "spec": {"signature": signature},
            })),
        )
        .await?;
    stack.start_agent(NODE)?;
    let fixture = gkm_testenv::triton::fleet()?
        .into_iter()
        .find(|t| t.name == "cuda-75-32")
        .ok_or_else(|| anyhow::anyhow!("no cuda-75-32 fixture"))?;
    let (_, log) = run(
        &pods,
        &gkm_local::real_triton_pod(
            "team-a",
            "reuse",
            NODE,
            (&fixture, &fixture.target),
            (
                json!({"name": "kernels", "csi": {"driver": "csi.gkm.io", "readOnly": true,
                    "volumeAttributes": {"csi.gkm.io/GKMCache": "warm"}}}),
                true,
            ),
        )?,
    )
    .await?;
    let report: gkm_testenv::triton::TritonReport =
        serde_json::from_str(log.trim()).map_err(|e| anyhow::anyhow!("{e}: {log}"))?;
    assert_eq!(report.triton, "3.6.0", "{report:#?}");
    assert_eq!(report.target, fixture.target, "{report:#?}");
    assert!(
        report.reused_whole() && report.kernels.len() == fixture.kernels,
        "real Triton did not reuse the delivered capture whole: {report:#?}"
    );
    Ok(())
}
