//! What a write does on the delivery paths without a writable view of their
//! own (PVC ReadOnlyMany, PVC ReadWriteOnce, image volume), on a real node
//! (kubelet, containerd, runc) with the operator, its fill Jobs and its
//! webhooks, and real Triton in a non-root pod:
//!
//! - the claim volumes reach the node read-only whatever the pod asked for
//!   (the webhooks mark them `readOnly`), and the image volume is read-only
//!   as the kubelet mounts it: a write into any of them is refused with
//!   `EROFS`;
//! - an init container running `gkm view` in gkm's image (as
//!   `hack/images/build.sh` builds it; uid 1000, Pod Security `restricted`) lays a
//!   writable view of each into an `emptyDir` that Triton uses as its cache
//!   at a path the cache was not built at: every delivered kernel hits, every
//!   new one compiles into the view, the pod exits 0;
//! - a pod the webhooks leave out (labelled as gkm's own) mounts a claim
//!   writable, but as another user than the fill's it cannot write the
//!   tree (`EACCES`);
//! - the claims' trees are byte for byte what the fill Jobs wrote;
//! - a pod mounting the image volume with no view is admitted with a
//!   warning steering it to `gkm view` or a CSI volume.
//!
//! The cluster has no provisioner: the operator makes hostPath volumes
//! (`--pvc-volume-dir`).

use std::path::Path;
use std::time::Duration;

use gkm_local::cosign;
use gkm_local::{SimulatedNode, Stack, repo_root};
use gkm_testenv::triton::{
    FleetTarget, TritonReport, VIRTUALENV_LINK, checker_dir, fleet_target_named, virtualenv,
};
use gkm_testenv::{
    Component, Scheduler, TestImage, find_binary, pod_log, tree_files, wait_for_pod,
    workspace_binary,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(300);
const NODE: &str = "real-t4";
const NS: &str = "ml";
const CLASS: &str = "gkm-local";
/// The operator's image, for its fill Jobs.
const OPERATOR_IMAGE: &str = "gkm.test/gkm-operator:views";
/// gkm's own image, as `hack/images/build.sh` builds it (entrypoint `gkm`,
/// a non-root user), for the view's init container.
const GKM_IMAGE: &str = concat!("ghcr.io/gkm-rs/gkm:v", env!("CARGO_PKG_VERSION"));
/// The fleet target the caches hold (a T4's).
const FIXTURE: &str = "cuda-75-32";
/// A target the caches hold no kernel for.
const NEW_TARGET: &str = "cuda/80/32";
/// Where the pods see their view: not where the cache was built.
const VIEW: &str = "/models/kernels/triton";
/// Where the pods mount the delivered (read-only) tree.
const SOURCE: &str = "/source";
const CHECKER: &str = "/checks";
const SCRATCH: &str = "/scratch";
/// What the host's Python needs from the host (a property of this test
/// ground: a real workload brings its own image).
const HOST_SYSTEM_DIRS: [(&str, &str); 3] = [
    ("host-usr", "/usr"),
    ("host-lib", "/lib"),
    ("host-lib64", "/lib64"),
];

/// Pod Security `restricted`'s container settings.
fn restricted() -> Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
           "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
}

/// A pod on [`NODE`], as uid 1000, whose init container lays a `gkm view`
/// of `source` (mounted at [`SOURCE`], the tree at `SOURCE/from`) into an
/// emptyDir, and whose container first tries to write into the source,
/// then runs real Triton with the view at [`VIEW`] as its cache: the
/// delivered target's kernels, then [`NEW_TARGET`]'s.
fn view_pod(
    name: &str,
    labels: Value,
    source: Value,
    from: &str,
    target: &FleetTarget,
) -> anyhow::Result<Pod> {
    let venv = virtualenv()?.display().to_string();
    let mut volumes = vec![
        source,
        json!({"name": "view", "emptyDir": {}}),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "checker", "hostPath": {
            "path": checker_dir().display().to_string(), "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "source", "mountPath": SOURCE}),
        json!({"name": "view", "mountPath": VIEW}),
        json!({"name": "venv", "mountPath": VIRTUALENV_LINK, "readOnly": true}),
        json!({"name": "checker", "mountPath": CHECKER, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    for (volume, path) in HOST_SYSTEM_DIRS {
        volumes.push(json!({"name": volume, "hostPath": {"path": path}}));
        mounts.push(json!({"name": volume, "mountPath": path, "readOnly": true}));
    }
    let script = format!(
        "touch {SOURCE}/{from}/written 2>&1 || true; \
         exec {VIRTUALENV_LINK}/bin/python {CHECKER}/triton_fleet.py check \
         --target {} --cache {VIEW} --target {NEW_TARGET} --cache {VIEW}",
        target.target
    );
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                "runAsNonRoot": true},
            "initContainers": [{
                "name": "view", "image": GKM_IMAGE, "imagePullPolicy": "Never",
                "args": ["view", format!("{SOURCE}/{from}"), VIEW, "--mount-path", VIEW],
                "securityContext": restricted(),
                "volumeMounts": [{"name": "source", "mountPath": SOURCE, "readOnly": true},
                                 {"name": "view", "mountPath": VIEW}],
            }],
            "containers": [{
                "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "env": [
                    {"name": "TRITON_CACHE_DIR", "value": VIEW},
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

fn ended(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The exit code of `pod`'s container `triton`.
fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "triton")?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// The claim volume `source` of the admitted `pod`: its claim and whether
/// it is read-only.
fn claim_of(pod: &Pod) -> (String, Option<bool>) {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find(|v| v.name == "source")
        .and_then(|v| v.persistent_volume_claim.clone())
        .map(|c| (c.claim_name, c.read_only))
        .unwrap_or_default()
}

/// Creates `pod`, waits until it ends, and checks what it did: the write
/// into the source refused as read-only, every delivered kernel a hit from
/// the view, every new one compiled into it, exit 0. Returns the admitted
/// pod.
async fn hits_from_its_view(
    pods: &Api<Pod>,
    pod: &Pod,
    target: &FleetTarget,
) -> anyhow::Result<Pod> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let admitted = pods.create(&PostParams::default(), pod).await?;
    let done = wait_for_pod(pods, &name, TIMEOUT, ended).await?;
    let view_log = pod_log(pods, &name, "view").await.unwrap_or_default();
    let log = pod_log(pods, &name, "triton").await.unwrap_or_default();
    eprintln!("{name}: view: {view_log}\n{log}");
    assert_eq!(exit_code(&done), Some(0), "{name}: {view_log}\n{log}");
    assert!(
        log.contains("Read-only file system"),
        "{name} wrote into its source:\n{log}"
    );
    let reports: Vec<TritonReport> = log
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(reports.len(), 2, "{log}");
    let (delivered, new) = (&reports[0], &reports[1]);
    assert_eq!(delivered.cache, Path::new(VIEW));
    assert_eq!(delivered.kernels.len(), target.kernels, "{delivered:#?}");
    assert!(
        delivered.reused_whole(),
        "{name}: Triton compiled a delivered kernel:\n{delivered:#?}"
    );
    assert_eq!(new.compiled, target.kernels, "{name}: {new:#?}");
    Ok(admitted)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gkm_view_lets_real_triton_write_beside_read_only_claims_and_image_volumes()
-> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    let controllers = [
        "job-controller",
        "persistentvolume-binder-controller",
        "persistentvolumeclaim-protection-controller",
        "persistentvolume-protection-controller",
        "node-lifecycle-controller",
    ];
    let mut stack = Stack::start_with_controllers(tmp.path(), Vec::new(), &controllers).await?;
    let image = TestImage::busybox(&[OPERATOR_IMAGE])?
        .with_binary("/usr/bin/gkm-operator", &workspace_binary("gkm-operator")?)?
        .with_entrypoint(&["/usr/bin/gkm-operator"])
        .with_file(
            "/etc/ssl/certs/ca-certificates.crt",
            Path::new("/etc/ssl/certs/ca-certificates.crt"),
        )?;
    stack
        .add_real_node(SimulatedNode::new(NODE, "gpus:\n- profile: T4\n"))
        .await?;
    let node = stack
        .real_node(NODE)
        .ok_or_else(|| anyhow::anyhow!("no real node {NODE}"))?;
    node.import_image(&image)?;
    node.trust_plain_http_registry(stack.registry.addr())?;
    let gkm = workspace_binary("gkm")?;
    let built = std::process::Command::new(repo_root().join("hack/images/build.sh"))
        .args(["--profile", "dev", "--bin-dir"])
        .arg(gkm.parent().unwrap_or(Path::new(".")))
        .arg("--out")
        .arg(tmp.path().join("images"))
        .arg("--import")
        .arg(node.containerd_socket())
        .arg("gkm")
        .output()?;
    anyhow::ensure!(
        built.status.success(),
        "hack/images/build.sh gkm: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let _scheduler = Scheduler::start(
        &stack.plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;
    let client = stack.plane.client().await?;
    stack.plane.ensure_namespace(NS).await?;
    stack
        .plane
        .apply_object(
            &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": CLASS}, "provisioner": "kubernetes.io/no-provisioner",
                    "volumeBindingMode": "Immediate"}),
            false,
        )
        .await?;
    let target = fleet_target_named(FIXTURE)?;
    let key = cosign::generate_key_pair(&tmp.path().join("keys/release"))?;
    let (image_ref, _) = stack
        .push_signed_cache(&target.fixture, "gkm/fleet", &target.name, &key)
        .await?;
    let volumes = tmp.path().join("volumes");
    std::fs::create_dir_all(&volumes)?;
    let webhook_port = gkm_testenv::free_port()?;
    let policy = tmp.path().join("default-policy.yaml");
    std::fs::write(
        &policy,
        serde_yaml::to_string(&json!({"signers": [{"key": {"publicKey": key.public_pem}}]}))?,
    )?;
    stack.set_args(
        vec![
            "--resolve-interval=2s".into(),
            format!("--default-policy={}", policy.display()),
            format!("--job-image={OPERATOR_IMAGE}"),
            "--job-image-pull-policy=Never".into(),
            "--job-host-network".into(),
            format!("--pvc-volume-dir={}", volumes.display()),
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            format!("--webhook-url=https://127.0.0.1:{webhook_port}"),
        ],
        vec!["--resync=2s".into()],
    );
    stack.start_gkm()?;

    // A cache per delivery path: a ReadOnlyMany claim, a claim per node,
    // and (no storage class) the node store, which image volumes name.
    for (name, modes) in [
        ("rox", Some(json!(["ReadOnlyMany"]))),
        ("rwo", Some(json!(["ReadWriteOnce"]))),
        ("image", None),
    ] {
        let mut spec = json!({"image": image_ref});
        if let Some(modes) = modes {
            spec["storageClassName"] = json!(CLASS);
            spec["accessModes"] = modes;
        }
        stack
            .plane
            .apply_object(
                &json!({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                        "metadata": {"name": name, "namespace": NS}, "spec": spec}),
                false,
            )
            .await?;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    stack
        .eventually("both fill Jobs succeed", TIMEOUT, || {
            let jobs = jobs.clone();
            async move {
                let done = jobs
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|j| j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0)
                    .count();
                Ok((done >= 2).then_some(()))
            }
        })
        .await?;
    let filled = tree_files(&volumes)?;
    assert!(!filled.is_empty(), "no claim was filled");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // --- PVC ReadOnlyMany: the claim named like the cache, mounted
    // read-only by the claim-read-only webhook though the pod did not ask.
    let rox = view_pod(
        "rox",
        json!({}),
        json!({"name": "source", "persistentVolumeClaim": {"claimName": "rox"}}),
        "",
        &target,
    )?;
    let admitted = hits_from_its_view(&pods, &rox, &target).await?;
    assert_eq!(claim_of(&admitted), ("rox".to_string(), Some(true)));

    // --- PVC ReadWriteOnce: a labelled pod gets its node's claim, read-only.
    let rwo = view_pod(
        "rwo",
        json!({"gkm.io/pvc-mutation": "true"}),
        json!({"name": "source", "persistentVolumeClaim": {"claimName": "rwo"}}),
        "",
        &target,
    )?;
    let admitted = hits_from_its_view(&pods, &rwo, &target).await?;
    assert_eq!(
        claim_of(&admitted),
        (gkm_k8s_operator::names::node_claim("rwo", NODE), Some(true))
    );
    // A pod past the webhooks (labelled as gkm's own, which they leave
    // out) mounts the claim writable, but as another user than the fill's
    // it cannot write the tree.
    let past = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "past-the-webhooks", "namespace": NS,
                     "labels": {"app.kubernetes.io/managed-by": "gkm-operator"}},
        "spec": {"nodeName": NODE, "restartPolicy": "Never", "automountServiceAccountToken": false,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": true},
            "containers": [{
                "name": "triton", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    "for d in /source /source/.gkm/current /source/.gkm/current/*; do \
                        touch $d/written 2>&1; done; echo DONE"],
                "volumeMounts": [{"name": "source", "mountPath": "/source"}]}],
            "volumes": [{"name": "source", "persistentVolumeClaim": {"claimName": "rox"}}]},
    });
    let past: Pod = serde_json::from_value(past)?;
    let admitted = pods.create(&PostParams::default(), &past).await?;
    assert_eq!(claim_of(&admitted), ("rox".to_string(), None));
    wait_for_pod(&pods, "past-the-webhooks", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "past-the-webhooks", "triton").await?;
    eprintln!("past-the-webhooks:\n{log}");
    // The claim's root, its tree's and the tree's kernel directories.
    assert_eq!(
        log.matches("Permission denied").count(),
        2 + target.kernels,
        "{log}"
    );
    assert!(!log.contains("Read-only"), "{log}");

    // No pod changed what the fill Jobs wrote.
    assert!(
        tree_files(&volumes)? == filled,
        "a pod wrote into a claim's tree"
    );

    // --- Image volume: read-only as the kubelet mounts it; the tree is
    // under io.triton.cache. Once the node's agent reports the digest fitting.
    let placeholder = json!({"name": "source", "image": {
        "reference": "gkm.invalid/cache/image", "pullPolicy": "IfNotPresent"}});
    let image_pod = view_pod(
        "image",
        json!({}),
        placeholder.clone(),
        "io.triton.cache",
        &target,
    )?;
    let admitted = stack
        .eventually("the image-volume pod is admitted", TIMEOUT, || {
            let (pods, pod) = (pods.clone(), image_pod.clone());
            async move {
                let dry_run = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                match pods.create(&dry_run, &pod).await {
                    Ok(_) => Ok(Some(())),
                    // The operator has not resolved, verified or seen the
                    // digest on the node yet.
                    Err(kube::Error::Api(e))
                        if ["not resolved yet", "not verified", "fitting its GPUs"]
                            .iter()
                            .any(|m| e.message.contains(m)) =>
                    {
                        Ok(None)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        })
        .await;
    admitted?;
    hits_from_its_view(&pods, &image_pod, &target).await?;

    // A pod reading the image volume as it is: admitted, with a warning.
    let reader = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "reader", "namespace": NS},
        "spec": {"nodeName": NODE, "containers": [{
            "name": "server", "image": gkm_testenv::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sleep", "1"],
            "volumeMounts": [{"name": "source", "mountPath": "/cache"}]}],
            "volumes": [placeholder]},
    });
    let file = tmp.path().join("reader.json");
    std::fs::write(&file, reader.to_string())?;
    let out = std::process::Command::new(find_binary(Component::Kubectl)?)
        .arg("--kubeconfig")
        .arg(stack.plane.kubeconfig())
        .args(["create", "--dry-run=server", "-f"])
        .arg(&file)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("Warning: container \"server\" mounts gkm cache image")
            && stderr.contains("gkm view"),
        "{stderr}"
    );
    Ok(())
}
