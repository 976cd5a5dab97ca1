//! A delta capture end to end on a real node (kubelet + containerd + runc
//! calling gkm's CSI driver, gkm's operator and agent, a real registry):
//! a signed base cache of real Triton 3.6 `cuda/75/32` kernels, built at the
//! fixture's path and missing one kernel, is delivered to a pod running real
//! Triton as uid 1000 through a writable view at another path that names a
//! capture. Triton reads every delivered kernel and compiles the missing
//! one; a second pod's plain writable view of the same base sees none of
//! it. The operator's capture Job pushes the base's layers plus one layer of
//! exactly the new kernel, and a third pod, at yet another path, reads every
//! kernel of the resulting cache and compiles nothing. Once all is over the
//! node keeps no upper, overlay or capture tree, and the store's base tree
//! is byte for byte the verified one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCache, GKMCacheCapture};
use gkm_local::{Stack, cosign, repo_root};
use gkm_oci::{Image, ImageRef, RegistryOptions, Repo};
use gkm_testenv::triton::{
    FleetTarget, TritonReport, VIRTUALENV_LINK, checker_dir, fleet_target_named, key_dir,
    virtualenv,
};
use gkm_testenv::{
    BUSYBOX_IMAGE, copy_tree, mounts_under, pod_log, settle, tree_files, until, wait_for_pod,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Real Triton in pods on a CPU shared with other work: room to spare.
const TIMEOUT: Duration = Duration::from_secs(600);
const NODE: &str = "real-delta";
const NS: &str = "team-a";
/// Where the pod's checker is mounted.
const CHECKER: &str = "/checks";
/// The Triton pods' own scratch space (`HOME`, `TMPDIR`).
const SCRATCH: &str = "/scratch";
/// What the host's Python needs from the host, read-only at the same paths
/// (a property of this test ground, not of gkm).
const HOST_SYSTEM_DIRS: [(&str, &str); 3] = [
    ("host-usr", "/usr"),
    ("host-lib", "/lib"),
    ("host-lib64", "/lib64"),
];

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// A writable cache volume `kernels` with `attributes`, mounted at `mount`.
fn cache_volume(attributes: &[(&str, &str)]) -> Value {
    let attributes: serde_json::Map<String, Value> = attributes
        .iter()
        .map(|(k, v)| ((*k).to_string(), Value::from(*v)))
        .collect();
    json!({"name": "kernels", "csi": {"driver": "csi.gkm.io", "volumeAttributes": attributes}})
}

/// A pod of uid 1000 (fsGroup 1000) running real Triton from the host's
/// virtualenv over its cache volume at `mount`: the fleet's checker compiles
/// `fixture`'s kernels and reports, for each, whether Triton compiled it.
fn triton_pod(
    name: &str,
    fixture: &FleetTarget,
    mount: &str,
    attributes: &[(&str, &str)],
) -> anyhow::Result<Pod> {
    let venv = virtualenv()?.display().to_string();
    let mut volumes = vec![
        cache_volume(attributes),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "checker", "hostPath": {
            "path": checker_dir().display().to_string(), "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "kernels", "mountPath": mount}),
        json!({"name": "venv", "mountPath": VIRTUALENV_LINK, "readOnly": true}),
        json!({"name": "checker", "mountPath": CHECKER, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    for (volume, path) in HOST_SYSTEM_DIRS {
        volumes.push(json!({"name": volume, "hostPath": {"path": path}}));
        mounts.push(json!({"name": volume, "mountPath": path, "readOnly": true}));
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                "runAsNonRoot": true},
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": [format!("{VIRTUALENV_LINK}/bin/python"),
                            format!("{CHECKER}/triton_fleet.py"), "check",
                            "--target", fixture.target, "--cache", mount],
                "env": [
                    {"name": "TRITON_CACHE_DIR", "value": mount},
                    {"name": "HOME", "value": SCRATCH},
                    {"name": "TMPDIR", "value": SCRATCH},
                    {"name": "PATH", "value": "/usr/bin:/bin"},
                ],
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    }))?)
}

/// A busybox pod of uid 1000 holding a plain writable view of `cache` at
/// `mount` until deleted.
fn idle_pod(name: &str, cache: &str, mount: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                "runAsNonRoot": true},
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "sleep 3600"],
                "volumeMounts": [{"name": "kernels", "mountPath": mount}],
            }],
            "volumes": [cache_volume(&[("csi.gkm.io/GKMCache", cache)])],
        }
    }))?)
}

/// Runs `pod` to its end; its uid and Triton's report (its log).
async fn run_triton(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<(String, TritonReport)> {
    pods.create(&PostParams::default(), pod).await?;
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let done = wait_for_pod(pods, name, TIMEOUT, |p| {
        matches!(phase(p), Some("Succeeded" | "Failed"))
    })
    .await?;
    let log = pod_log(pods, name, "main").await?;
    anyhow::ensure!(
        phase(&done) == Some("Succeeded"),
        "pod {name} did not exit 0:\n{log}"
    );
    let report = serde_json::from_str(log.trim()).map_err(|e| anyhow::anyhow!("{e}: {log}"))?;
    Ok((done.metadata.uid.clone().unwrap_or_default(), report))
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

/// Names `key` the signer of the `GKMCache` `name` delivering `image`.
async fn signed_cache(
    caches: &Api<GKMCache>,
    name: &str,
    image: Option<&str>,
    public_pem: &str,
) -> anyhow::Result<()> {
    let mut spec = json!({"signature": {"signers": [{"key": {"publicKey": public_pem}}]}});
    if let Some(image) = image {
        spec["image"] = image.into();
    }
    caches
        .patch(
            name,
            &PatchParams::apply("real-delta-capture").force(),
            &Patch::Apply(json!({
                "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                "metadata": {"name": name, "namespace": NS},
                "spec": spec,
            })),
        )
        .await?;
    Ok(())
}

/// The regular files of a gzip layer blob, by path (the host's `tar`).
fn layer_files(blob: &Path) -> anyhow::Result<Vec<String>> {
    let listed = std::process::Command::new("tar")
        .args(["-tvzf"])
        .arg(blob)
        .output()?;
    anyhow::ensure!(
        listed.status.success(),
        "tar -tvzf {}: {}",
        blob.display(),
        String::from_utf8_lossy(&listed.stderr)
    );
    let mut out: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split_whitespace().last().map(String::from))
        .collect();
    out.sort();
    Ok(out)
}

/// The files of `root`, relative, with the SHA-256 of their bytes, sorted.
fn relative_files(root: &Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    use sha2::Digest as _;
    let mut files: Vec<_> = tree_files(root)?
        .into_iter()
        .map(|(path, bytes)| {
            (
                path.strip_prefix(root)
                    .map(Path::to_path_buf)
                    .unwrap_or(path),
                hex::encode(sha2::Sha256::digest(&bytes)),
            )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Unmounts whatever is left under a store directory when dropped, so a
/// failing test leaves no mount behind.
struct LeaveNoMounts(Vec<PathBuf>);

impl Drop for LeaveNoMounts {
    fn drop(&mut self) {
        for dir in &self.0 {
            for mount in mounts_under(dir).iter().rev() {
                let _ = gkm_k8s_csi::unmount_all(mount);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_capture_of_a_pod_holds_exactly_its_new_kernel_and_a_third_pod_hits_every_kernel()
-> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let mut stack = Stack::start_with_real_t4(tmp.path(), NODE).await?;
    stack.start_csi(NODE)?;
    // The gkm command line's image for the capture Job, in the node's
    // containerd, as hack/images/build.sh builds it.
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
    let kubelet_dir = stack
        .real_node(NODE)
        .ok_or_else(|| anyhow::anyhow!("no real node"))?
        .kubelet_dir();
    let store = stack.store_dir(NODE);
    let _cleanup = LeaveNoMounts(vec![store.join("captures"), store.join("csi")]);
    stack.plane.ensure_namespace(NS).await?;
    let client = stack.plane.client().await?;

    // The tenant's signing Secret.
    let key = cosign::generate_key_pair(&tmp.path().join("keys"))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "signing", "namespace": NS},
        "stringData": {"cosign.key": std::fs::read_to_string(&key.private_key)?,
                       "cosign.password": cosign::PASSWORD},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await?;
    stack.set_args(
        [
            "--resolve-interval=2s",
            "--tenant-signer-namespaces=team-a",
            "--job-host-network",
            "--job-image-pull-policy=Never",
        ]
        .into_iter()
        .map(String::from)
        .collect(),
        vec!["--resync=2s".to_string(), "--gc-grace=0s".to_string()],
    );
    stack.start_operator()?;
    stack.start_agent(NODE)?;

    // 1. The base: the real sm75 fixture but one kernel, built at the
    // fixture's path, signed.
    let fixture = fleet_target_named("cuda-75-32")?;
    let base_tree = tmp.path().join("base");
    copy_tree(&fixture.fixture, &base_tree)?;
    let mut kernels: Vec<String> = std::fs::read_dir(&base_tree)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    kernels.sort();
    let new = kernels[0].clone();
    std::fs::remove_dir_all(base_tree.join(&new))?;
    let (base_image, base_digest) = stack
        .push_signed_cache(&base_tree, "team-a/base", "v1", &key)
        .await?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    signed_cache(&caches, "base", Some(&base_image), &key.public_pem).await?;

    // 2. The capture, pointing the cache `grown` at what it pushes.
    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), NS);
    let capture: GKMCacheCapture = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "metadata": {"name": "delta", "namespace": NS},
        "spec": {"targetImage": format!("{}/team-a/grown:v1", stack.registry.addr()),
                 "signing": {"secretName": "signing"},
                 "insecureRegistry": true, "maxBytes": "64MiB", "cacheName": "grown"},
    }))?;
    captures.create(&PostParams::default(), &capture).await?;

    // 3. A plain writable view of the base, held open; then real Triton
    // through a view of the base naming the capture, at another path.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let plain_mount = fixture.compiled_at.display().to_string();
    pods.create(
        &PostParams::default(),
        &idle_pod("plain", "base", &plain_mount)?,
    )
    .await?;
    let plain = wait_for_pod(&pods, "plain", TIMEOUT, |p| phase(p) == Some("Running")).await?;
    let plain_view = kubelet_dir
        .join("pods")
        .join(plain.metadata.uid.clone().unwrap_or_default())
        .join("volumes/kubernetes.io~csi/kernels/mount");
    let pod1_mount = "/workspace/triton-cache";
    let (pod1_uid, report) = run_triton(
        &pods,
        &triton_pod(
            "compiler",
            &fixture,
            pod1_mount,
            &[
                ("csi.gkm.io/GKMCache", "base"),
                ("csi.gkm.io/GKMCacheCapture", "delta"),
                ("csi.gkm.io/mountPath", pod1_mount),
            ],
        )?,
    )
    .await?;
    assert_eq!(report.triton, "3.6.0", "{report:#?}");
    assert_eq!(report.kernels.len(), fixture.kernels, "{report:#?}");
    for kernel in &report.kernels {
        // Triton's key, as the cache's directory names it.
        if key_dir(&kernel.hash)? == new {
            assert!(
                kernel.compiled,
                "the missing kernel is compiled: {report:#?}"
            );
        } else {
            assert!(
                !kernel.compiled && kernel.read_from == [PathBuf::from(pod1_mount)],
                "every delivered kernel is read from the cache: {report:#?}"
            );
        }
    }
    assert_eq!(report.compiled, 1, "{report:#?}");
    // The plain view, open all along, saw none of it.
    assert!(
        plain_view.is_dir() && !plain_view.join(&new).exists(),
        "the plain view at {} shows the other pod's kernel",
        plain_view.display()
    );
    let plain_files = relative_files(&plain_view)?;
    assert_eq!(
        plain_files,
        relative_files(&base_tree)?,
        "the plain view is the base, untouched"
    );
    pods.delete("plain", &DeleteParams::default().grace_period(0))
        .await?;

    // 4. The capture: the base's layers plus one layer of exactly the new
    // kernel's files.
    let done = over(&captures, "delta").await?;
    assert_eq!(done.phase, CapturePhase::Complete, "{done:?}");
    let base_repository = base_image
        .rsplit_once(':')
        .map_or(base_image.as_str(), |(r, _)| r);
    assert_eq!(
        done.base.as_deref(),
        Some(format!("{base_repository}@{base_digest}").as_str()),
        "{done:?}"
    );
    let registry = RegistryOptions {
        insecure: true,
        ..RegistryOptions::default()
    };
    let fetch = |image: &str| {
        let image: anyhow::Result<ImageRef> = image.parse().map_err(anyhow::Error::from);
        let registry = registry.clone();
        async move { anyhow::Ok(Image::fetch(&Repo::open(&image?, &registry)?).await?) }
    };
    let base = fetch(&format!("{base_repository}@{base_digest}")).await?;
    let grown = fetch(done.image.as_deref().unwrap_or_default()).await?;
    let layers = base.manifest.layers.len();
    assert_eq!(grown.manifest.layers.len(), layers + 1, "{done:?}");
    assert_eq!(grown.manifest.layers[..layers], base.manifest.layers[..]);
    let delta = grown
        .manifest
        .layers
        .last()
        .ok_or_else(|| anyhow::anyhow!("no delta layer"))?;
    let mut expected: Vec<String> = relative_files(&fixture.fixture.join(&new))?
        .into_iter()
        .map(|(path, _)| format!("io.triton.cache/{new}/{}", path.display()))
        .collect();
    expected.sort();
    assert_eq!(
        layer_files(&stack.registry.blob_data_path(delta.digest.as_str()))?,
        expected,
        "the delta layer holds exactly the new kernel"
    );
    let cache = caches.get("grown").await?;
    assert_eq!(Some(cache.spec.cache.image), done.image);

    // 5. The resulting cache, its signer named, at yet another path: every
    // kernel is a hit.
    signed_cache(&caches, "grown", None, &key.public_pem).await?;
    let pod3_mount = "/home/user/.triton/cache";
    let (_, report) = run_triton(
        &pods,
        &triton_pod(
            "reader",
            &fixture,
            pod3_mount,
            &[
                ("csi.gkm.io/GKMCache", "grown"),
                ("csi.gkm.io/mountPath", pod3_mount),
            ],
        )?,
    )
    .await?;
    assert!(
        report.reused_whole() && report.kernels.len() == fixture.kernels,
        "real Triton did not hit every kernel of the grown cache: {report:#?}"
    );

    // 6. Everything over: no upper, no overlay, no capture tree; the base's
    // tree in the store is the verified one.
    pods.delete("compiler", &DeleteParams::default().grace_period(0))
        .await?;
    pods.delete("reader", &DeleteParams::default().grace_period(0))
        .await?;
    let uppers = store.join("csi/uppers");
    let tree = store
        .join("captures")
        .join(NS)
        .join("delta")
        .join(&pod1_uid);
    until(
        "no upper, overlay or capture tree left on the node",
        TIMEOUT,
        || {
            let no_uppers = std::fs::read_dir(&uppers).map_or(true, |mut d| d.next().is_none());
            no_uppers
                && !tree.exists()
                && mounts_under(&store).is_empty()
                && mounts_under(&kubelet_dir.join("pods")).is_empty()
        },
    )
    .await?;
    let entry = store.join("sha256").join(
        base_digest
            .strip_prefix("sha256:")
            .unwrap_or(base_digest.as_str()),
    );
    // The store keeps the cache's files under the image's cache directory,
    // beside its seal.
    assert_eq!(
        relative_files(&entry.join("io.triton.cache"))?,
        relative_files(&base_tree)?,
        "the store's base tree is byte for byte the verified one"
    );
    Ok(())
}
