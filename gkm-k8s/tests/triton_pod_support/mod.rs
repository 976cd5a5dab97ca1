//! One real node for the Triton-in-a-pod tests: a kubelet with its own
//! containerd and runc, gkm's CSI driver (`csi.gkm.io`, served by this
//! process, registered with the kubelet through its plugin registry as the
//! driver's own pod does), and a node store holding the fleet's real Triton
//! cache for `cuda/75/32`, built into an image and extracted as the agent
//! does, deliverable as `ml/vector-add`. It is started once per test binary
//! on a thread and runtime of its own (the driver must outlive every
//! test's runtime), and torn down at exit.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context as _;
use gkm_k8s_csi::{PLUGIN, RegistrationService, serve_registration};
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_k8s_node::usage::{UsageRecord, UsageRecords};
use gkm_oci::{BuildOptions, Digest, ExtractPolicy, ImageRef, RegistryOptions, Repo, Store, build};
use gkm_testenv::triton::{FleetTarget, fleet_target_named};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, RealNode, RealNodeOptions, eventually, repo_root, yaml_documents,
};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

use crate::csi_support::{gkmcache, start_driver};

pub mod cutedsl;
pub mod tilelang;
pub mod torch;
pub mod tvm_ffi;
pub mod vllm;

/// The namespace of the test pods, and of their cache.
pub const NS: &str = "ml";
/// The `GKMCache` the pods' volumes name.
pub const CACHE: &str = "vector-add";
/// The fleet fixture the cache is built from.
pub const FIXTURE: &str = "cuda-75-32";
/// How long a test waits for a pod to start, end or be gone.
pub const TIMEOUT: Duration = Duration::from_secs(300);
/// The pod's own scratch space: its `HOME` and `TMPDIR` (Triton's backend
/// and Inductor write their temporary files there).
pub const SCRATCH: &str = "/scratch";

/// What the host's Python (and Inductor's C++ compiler) need from the host,
/// mounted read-only at the same paths. A property of this test ground
/// (Triton's virtualenv there is Debian's `python3` with the wheels beside
/// it; `/lib` and `/lib64` are links into `/usr`), not of gkm: a real
/// workload brings its own image.
pub const HOST_SYSTEM_DIRS: [(&str, &str); 3] = [
    ("host-usr", "/usr"),
    ("host-lib", "/lib"),
    ("host-lib64", "/lib64"),
];

/// The phase of `pod`.
pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// Whether `pod` has ended (succeeded or failed).
pub fn ended(pod: &Pod) -> bool {
    matches!(phase(pod), Some("Succeeded" | "Failed"))
}

/// The exit code of `pod`'s (single) container, once it has ended.
pub fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

/// The pods of [`NS`] on the shared control plane.
pub async fn pods_api() -> anyhow::Result<Api<Pod>> {
    let plane = ControlPlane::shared().await?;
    Ok(Api::namespaced(plane.client().await?, NS))
}

/// Deletes the pods `names` and waits until they are gone.
pub async fn delete_all(pods: &Api<Pod>, names: &[&str]) -> anyhow::Result<()> {
    for name in names {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    eventually("the pods are gone", TIMEOUT, || async move {
        for name in names {
            if pods.get_opt(name).await?.is_some() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    Ok(())
}

/// The running node, as the tests see it.
pub struct TritonNode {
    /// The Node's name.
    pub name: String,
    /// The kubelet's `--root-dir`.
    pub kubelet_dir: PathBuf,
    /// The node store's root.
    pub store: PathBuf,
    /// The delivered cache's verified tree in the store.
    pub entry: PathBuf,
    /// The Triton fixture the cache was built from.
    pub fixture: FleetTarget,
    /// The counts the node's CSI driver serves on `/metrics`.
    pub metrics: gkm_k8s_csi::CsiMetrics,
}

impl TritonNode {
    /// The host's path of the cache volume `volume` of the pod with uid
    /// `uid`: what that pod sees.
    pub fn view(&self, uid: &str, volume: &str) -> PathBuf {
        self.kubelet_dir
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~csi")
            .join(volume)
            .join("mount")
    }

    /// The writable views' uppers in the store.
    pub fn uppers(&self) -> PathBuf {
        self.store.join("csi/uppers")
    }

    /// The upper in the store of the writable cache volume `volume` of the
    /// pod with uid `uid` (the driver names it after its volume handle).
    pub fn upper(&self, uid: &str, volume: &str) -> PathBuf {
        let handle = Digest::of(format!("{uid}{volume}").as_bytes());
        self.uppers().join(format!("csi-{}", handle.hex()))
    }
}

/// Adds the volumes and read-only mounts of [`HOST_SYSTEM_DIRS`] to a pod's
/// `volumes` and a container's `mounts`.
pub fn mount_host_system_dirs(volumes: &mut Vec<Value>, mounts: &mut Vec<Value>) {
    for (volume, path) in HOST_SYSTEM_DIRS {
        volumes.push(json!({"name": volume, "hostPath": {"path": path}}));
        mounts.push(json!({"name": volume, "mountPath": path, "readOnly": true}));
    }
}

/// A non-root pod (uid 1000, fsGroup 1000) on the node `n` whose one
/// container, `container`, runs `command` from the busybox image, with
/// `HOME` and `TMPDIR` at its scratch space, the host's system
/// directories, `env` besides and the workload's `volumes` and `mounts`:
/// how each framework's test runs its workload.
pub fn workload_pod(
    n: &TritonNode,
    name: &str,
    container: &str,
    command: Value,
    env: &[(&str, &str)],
    mut volumes: Vec<Value>,
    mut mounts: Vec<Value>,
) -> anyhow::Result<Pod> {
    mount_host_system_dirs(&mut volumes, &mut mounts);
    let mut vars = vec![
        json!({"name": "HOME", "value": SCRATCH}),
        json!({"name": "TMPDIR", "value": SCRATCH}),
        json!({"name": "PATH", "value": "/usr/bin:/bin"}),
    ];
    vars.extend(env.iter().map(|(k, v)| json!({"name": k, "value": v})));
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": n.name,
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000, "runAsNonRoot": true},
            "containers": [{
                "name": container, "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": command,
                "env": vars,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    }))?)
}

/// Deletes the ended pod `done`, waits until the upper of its writable
/// cache volume `volume` is gone, and checks that the store's tree at
/// `entry` still lists `verified`: what a pod writes stays its own.
// The Triton tests check two pods' uppers at once, by hand.
#[allow(dead_code)]
pub async fn check_view_left_nothing(
    n: &TritonNode,
    pods: &Api<Pod>,
    done: &Pod,
    volume: &str,
    entry: &Path,
    verified: &[(PathBuf, Vec<u8>)],
) -> anyhow::Result<()> {
    let uid = done.metadata.uid.clone().unwrap_or_default();
    let name = done.metadata.name.clone().unwrap_or_default();
    let upper = n.upper(&uid, volume);
    delete_all(pods, &[name.as_str()]).await?;
    let upper = &upper;
    eventually("the pod's upper is removed", TIMEOUT, || async move {
        Ok((!upper.exists()).then_some(()))
    })
    .await?;
    anyhow::ensure!(
        gkm_testenv::tree_files(entry)? == verified,
        "the store changed under a writable cache volume"
    );
    Ok(())
}

/// The usage record the driver wrote as the writable view of the pod
/// named `pod` went (what the pod compiled into it): the latest of that
/// pod's.
// Not every test binary reads them.
#[allow(dead_code)]
pub fn usage_record(n: &TritonNode, pod: &str) -> anyhow::Result<UsageRecord> {
    let records = UsageRecords::new(&n.store).list()?;
    records
        .iter()
        .rev()
        .find(|r| r.mount.pod.name == pod)
        .cloned()
        .with_context(|| format!("no usage record of pod {pod} among {records:#?}"))
}

/// The node of this test binary with a cache `publish` puts in its store
/// (`what` names it in a failure), published once per test binary into
/// `cell`: the first caller publishes, the others wait for it.
pub async fn node_with<T, F, Fut>(
    cell: &'static tokio::sync::OnceCell<Result<T, String>>,
    what: &str,
    publish: F,
) -> (&'static TritonNode, &'static T)
where
    F: FnOnce(&'static TritonNode) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let n = tokio::task::spawn_blocking(node)
        .await
        .unwrap_or_else(|e| panic!("starting the node: {e}"));
    let published = cell
        .get_or_init(|| async { publish(n).await.map_err(|e| format!("{e:#}")) })
        .await;
    match published {
        Ok(cache) => (n, cache),
        Err(e) => panic!("the {what} cache was not published: {e}"),
    }
}

static NODE: OnceLock<Result<TritonNode, String>> = OnceLock::new();

/// The node of this test binary, started by the first caller (the others
/// wait for it).
pub fn node() -> &'static TritonNode {
    match NODE.get_or_init(start_in_background) {
        Ok(node) => node,
        Err(e) => panic!("the real node did not start: {e}"),
    }
}

/// Starts the node on a thread that keeps it (and the driver) running until
/// the test binary exits.
fn start_in_background() -> Result<TritonNode, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("triton-node".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(format!("runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                match start().await {
                    Ok((node, kept)) => {
                        let _ = tx.send(Ok(node));
                        let _kept = kept;
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("{e:#}")));
                    }
                }
            });
        })
        .map_err(|e| format!("spawning the node's thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the node's thread ended".to_string())?
}

/// What must live as long as the node.
type Kept = (RealNode, crate::csi_support::RunningDriver);

async fn start() -> anyhow::Result<(TritonNode, Kept)> {
    let plane = ControlPlane::shared().await?;
    // The CSIDriver object, as deploy/ ships it (the kubelet reads it).
    for doc in yaml_documents(&repo_root().join("deploy/manifests/csi.yaml"))? {
        if doc["kind"] == "CSIDriver" {
            plane.apply_object(&doc, false).await?;
        }
    }
    plane.ensure_pod_namespace(NS).await?;
    let name = "triton-node".to_string();
    let real = RealNode::start(
        plane,
        RealNodeOptions {
            name: name.clone(),
            ..RealNodeOptions::default()
        },
    )
    .await?;

    // The store lives in the node's directory, removed with it at exit.
    let store = real.paths().dir.join("gkm-store");
    let fixture = fleet_target_named(FIXTURE)?;
    let digest = store_tree(&real.paths().dir, &store, &fixture.fixture).await?;
    DeliveryIndex::new(&store)
        .publish(&gkmcache(NS, CACHE), &Delivery::deliverable(digest.clone()))
        .context("publishing the delivery")?;

    // The driver, where the kubelet's CSI client dials it, and its
    // registration socket in the kubelet's plugin registry.
    let socket = real.plugins_dir().join("csi.gkm.io/csi.sock");
    let driver = start_driver(&socket, &name, &store).await;
    let registration = RegistrationService::new(PLUGIN, socket.clone());
    let registry_socket = real.plugins_registry_dir().join(PLUGIN.socket_name());
    tokio::spawn({
        let service = registration.clone();
        async move {
            if let Err(e) =
                serve_registration(&registry_socket, service, std::future::pending()).await
            {
                eprintln!("serve_registration: {e}");
            }
        }
    });
    let registration = &registration;
    eventually(
        "the kubelet registers csi.gkm.io",
        Duration::from_secs(120),
        || async move { Ok(registration.is_registered().then_some(())) },
    )
    .await?;

    let node = TritonNode {
        kubelet_dir: real.kubelet_dir(),
        entry: store.join("sha256").join(digest.hex()),
        store,
        fixture,
        name,
        metrics: driver.metrics.clone(),
    };
    Ok((node, (real, driver)))
}

/// Builds the cache tree `source` into an OCI layout under `work` and
/// extracts it into the store at `store_root`, as the agent does; its digest.
async fn store_tree(work: &Path, store_root: &Path, source: &Path) -> anyhow::Result<Digest> {
    let dest: ImageRef = format!("oci:{}/layout:{CACHE}", work.display()).parse()?;
    let opts = RegistryOptions::default();
    let built = build(source, &dest, &BuildOptions::default(), &opts)
        .await
        .with_context(|| format!("building {}", source.display()))?;
    let store = Store::open(store_root)?.with_durability(false);
    let repo = Repo::open(&dest, &opts)?;
    let stored = store.ensure(&repo, &ExtractPolicy::default(), None).await?;
    anyhow::ensure!(stored.digest == built.digest, "extracted another image");
    Ok(stored.digest)
}

/// The first JSON document starting a line of `log` that has the member
/// `key`: a workload script's report (which of its kernels or modules hit).
pub fn json_report(log: &str, key: &str) -> anyhow::Result<serde_json::Value> {
    let starts = std::iter::once(0).chain(log.match_indices('\n').map(|(i, _)| i + 1));
    starts
        .filter(|&at| log[at..].starts_with('{'))
        .find_map(|at| {
            let value = serde_json::Deserializer::from_str(&log[at..])
                .into_iter::<serde_json::Value>()
                .next()?
                .ok()?;
            value.get(key).is_some().then_some(value)
        })
        .with_context(|| format!("the pod printed no report of its {key}"))
}
