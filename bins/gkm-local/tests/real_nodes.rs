//! gkm on real nodes: kubelets with containerd and runc call gkm's CSI
//! driver for pods' `csi.gkm.io` volumes, and real containers read the cache.
//!
//! Two real nodes whose agents read simulated inventories: `real-sm75` (an
//! NVIDIA T4, which the Triton CUDA fixture fits, then one GPU of every
//! other target of the Triton fleet) and `real-gfx90a` (an AMD MI210, which
//! the fixture does not fit), and a kwok node beside them. One test walks
//! the story in order: a pod reads the cache at its volume root, a pod on
//! the wrong GPU never mounts, the namespace rules refuse other namespaces,
//! every fleet target's real Triton cache mounted into a container is reused
//! by real Triton with nothing compiled, the kubelet and the driver restart
//! under a running pod, and deleting the pod unmounts and lets a deleted
//! cache go.

use std::cell::RefCell;
use std::path::Path;
use std::time::Duration;

use gkm_k8s_api::crd::GKMCache;
use gkm_local::{SimulatedNode, Stack, cosign, fixture};
use gkm_testenv::{eventually, mounts_under, pod_events, pod_log, settle, until, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest as _, Sha256};

mod support;

const TIMEOUT: Duration = Duration::from_secs(120);
const SM75: &str = "real-sm75";
const GFX90A: &str = "real-gfx90a";
/// The fixture's kernel directory and binary.
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// A pod on `node` mounting the cache named by `attributes` at `/cache`,
/// listing the volume root, printing the kernel's sha256 and whether the
/// volume takes a write, then waiting.
fn cache_pod(
    ns: &str,
    name: &str,
    node: &str,
    attributes: serde_json::Value,
) -> anyhow::Result<Pod> {
    gkm_local::cache_pod(
        ns,
        name,
        node,
        "/cache",
        attributes,
        "ls -1 \"$TRITON_CACHE_DIR\"; sha256sum \"$TRITON_CACHE_DIR\"/*/add_kernel.cubin; \
         if touch \"$TRITON_CACHE_DIR\"/written 2>/dev/null; then echo WRITABLE; else echo READ-ONLY; fi; \
         exec sleep 100000",
    )
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits for a `FailedMount` event of pod `name` containing `needle`.
async fn wait_for_failed_mount(
    client: &kube::Client,
    ns: &str,
    name: &str,
    needle: &str,
) -> anyhow::Result<String> {
    let seen = RefCell::new(Vec::new());
    eventually(
        &format!("a FailedMount event of {ns}/{name} containing {needle:?}"),
        TIMEOUT,
        || async {
            let events = pod_events(client, ns, name).await?;
            let found = events
                .iter()
                .find(|e| e.starts_with("FailedMount") && e.contains(needle))
                .cloned();
            *seen.borrow_mut() = events;
            Ok(found)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}; events:\n{}", seen.borrow().join("\n")))
}

/// The pod's volume mounts on its node (under the kubelet's pods directory).
#[allow(
    clippy::expect_used,
    reason = "a test helper: callers pass a real node"
)]
fn pod_mounts(stack: &Stack, node: &str, pod: &Pod) -> Vec<std::path::PathBuf> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let real = stack.real_node(node).expect("real node");
    mounts_under(&real.pods_dir().join(uid))
}

async fn delete_pod_and_wait(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await?;
    eventually(&format!("pod {name} gone"), TIMEOUT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// Whether the kubelet of `node` has registered `csi.gkm.io` (its CSINode
/// lists the driver).
async fn driver_registered(client: &kube::Client, node: &str) -> anyhow::Result<bool> {
    let csinode = Api::<CSINode>::all(client.clone()).get_opt(node).await?;
    Ok(csinode.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == "csi.gkm.io")))
}

async fn wait_registered(client: &kube::Client, node: &str) -> anyhow::Result<()> {
    eventually(
        &format!("csi.gkm.io registered on {node}"),
        TIMEOUT,
        || async { Ok(driver_registered(client, node).await?.then_some(())) },
    )
    .await
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    Ok(hex::encode(Sha256::digest(std::fs::read(path)?)))
}

#[tokio::test(flavor = "multi_thread")]
async fn caches_mount_into_real_containers() -> anyhow::Result<()> {
    let tmp = gkm_testenv::temp_dir()?;
    // A kwok node beside the real ones: both kinds share one cluster.
    let mut stack = Stack::start(
        tmp.path(),
        vec![SimulatedNode::new("kwok-cpu", "gpus: []\n")],
    )
    .await?;
    stack
        .add_real_node(SimulatedNode::new(SM75, &support::fleet_inventory()))
        .await?;
    stack
        .add_real_node(SimulatedNode::new(GFX90A, "gpus:\n- profile: MI210\n"))
        .await?;
    let client = stack.plane.client().await?;
    for ns in ["team-a", "team-b"] {
        stack.plane.ensure_namespace(ns).await?;
    }

    let key = cosign::generate_key_pair(&tmp.path().join("keys/release"))?;
    let (image, _digest) = stack
        .push_signed_cache(
            &fixture("triton-vector-add-cuda-sm75"),
            "gkm/vector-add",
            "cuda",
            &key,
        )
        .await?;
    stack.start_gkm()?;
    for node in [SM75, GFX90A] {
        wait_registered(&client, node).await?;
    }

    let signature = json!({"signers": [{"key": {"publicKey": key.public_pem}}]});
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": "team-a"},
        "spec": {"image": image, "signature": signature, "resolveInterval": "10s"},
    });
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), "team-a");
    caches
        .patch(
            "vector-add",
            &PatchParams::apply("real-nodes").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    let cluster_cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
        "metadata": {"name": "shared-add"},
        "spec": {"image": image, "signature": signature, "resolveInterval": "10s",
                 "workloadNamespaces": ["team-a"]},
    });
    Api::<gkm_k8s_api::crd::ClusterGKMCache>::all(client.clone())
        .patch(
            "shared-add",
            &PatchParams::apply("real-nodes").force(),
            &Patch::Apply(&cluster_cache),
        )
        .await?;

    // --- A pod on the sm75 node reads the cache at its volume root.
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), "team-a");
    let own = json!({"csi.gkm.io/GKMCache": "vector-add"});
    pods_a
        .create(
            &PostParams::default(),
            &cache_pod("team-a", "reader", SM75, own.clone())?,
        )
        .await?;
    let reader = wait_for_pod(&pods_a, "reader", TIMEOUT, running).await?;
    let log = settle(
        TIMEOUT,
        || pod_log(&pods_a, "reader", "triton"),
        |log| log.contains("READ-ONLY") || log.contains("WRITABLE"),
    )
    .await?;
    let fixture_dir = fixture("triton-vector-add-cuda-sm75");
    let mut expected: Vec<String> = std::fs::read_dir(&fixture_dir)?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    expected.sort();
    let listed: Vec<&str> = log.lines().take(expected.len()).collect();
    assert_eq!(
        listed, expected,
        "the hash directories at the volume root; log:\n{log}"
    );
    let kernel_sha = sha256_of(&fixture_dir.join(KERNEL_DIR).join("add_kernel.cubin"))?;
    assert!(
        log.contains(&format!(
            "{kernel_sha}  /cache/{KERNEL_DIR}/add_kernel.cubin"
        )),
        "the container reads the fixture's kernel (sha256 {kernel_sha}); log:\n{log}"
    );
    assert!(
        log.contains("READ-ONLY"),
        "the volume is read-only; log:\n{log}"
    );
    assert!(
        !log.contains("io.triton"),
        "the image layout stays out of the volume; log:\n{log}"
    );
    assert_eq!(
        pod_mounts(&stack, SM75, &reader).len(),
        1,
        "one mount for the pod's volume"
    );

    // --- The same pod on the gfx90a node never mounts: FailedMount names the mismatch.
    pods_a
        .create(
            &PostParams::default(),
            &cache_pod("team-a", "wrong-gpu", GFX90A, own.clone())?,
        )
        .await?;
    let event = wait_for_failed_mount(
        &client,
        "team-a",
        "wrong-gpu",
        "not compatible with any GPU",
    )
    .await?;
    assert!(event.contains("backend mismatch"), "{event}");
    let wrong = pods_a.get("wrong-gpu").await?;
    assert_eq!(
        wrong.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let waiting = wrong
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone());
    assert_eq!(waiting.as_deref(), Some("ContainerCreating"));
    assert!(
        pod_mounts(&stack, GFX90A, &wrong).is_empty(),
        "nothing is mounted"
    );

    // --- Namespace rules: team-b may not mount team-a's GKMCache, nor the
    // ClusterGKMCache limited to team-a; team-a may mount the latter.
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), "team-b");
    let foreign = json!({"csi.gkm.io/GKMCache": "vector-add", "csi.gkm.io/namespace": "team-a"});
    pods_b
        .create(
            &PostParams::default(),
            &cache_pod("team-b", "borrower", SM75, foreign)?,
        )
        .await?;
    wait_for_failed_mount(
        &client,
        "team-b",
        "borrower",
        "only by pods in its own namespace",
    )
    .await?;
    let cluster = json!({"csi.gkm.io/ClusterGKMCache": "shared-add"});
    pods_b
        .create(
            &PostParams::default(),
            &cache_pod("team-b", "outsider", SM75, cluster.clone())?,
        )
        .await?;
    wait_for_failed_mount(
        &client,
        "team-b",
        "outsider",
        "workloadNamespaces (team-a) do not include namespace team-b",
    )
    .await?;
    pods_a
        .create(
            &PostParams::default(),
            &cache_pod("team-a", "insider", SM75, cluster)?,
        )
        .await?;
    wait_for_pod(&pods_a, "insider", TIMEOUT, running).await?;
    for (pods, name) in [
        (&pods_b, "borrower"),
        (&pods_b, "outsider"),
        (&pods_a, "insider"),
        (&pods_a, "wrong-gpu"),
    ] {
        delete_pod_and_wait(pods, name).await?;
    }

    // --- Every fleet target through CSI: a container mounts each real
    // Triton cache where its kernels were compiled, copies it out, and real
    // Triton reuses every copy whole, compiling nothing.
    let fleet_began = std::time::Instant::now();
    let fleet = support::push_signed_fleet(&stack, &key).await?;
    support::apply_fleet_caches(
        &client,
        "team-a",
        &fleet,
        &json!({"signature": signature, "resolveInterval": "10s"}),
    )
    .await?;
    support::wait_on_node(&stack, &client, "team-a", SM75, &fleet, TIMEOUT).await?;
    let volumes: Vec<_> = fleet
        .iter()
        .map(|p| {
            let attributes = json!({"csi.gkm.io/GKMCache": support::cache_name(&p.target)});
            (
                &p.target,
                json!({"csi": {"driver": "csi.gkm.io", "readOnly": true,
                                      "volumeAttributes": attributes}}),
            )
        })
        .collect();
    let out = tmp.path().join("fleet-copied");
    let reader_pod = support::fleet_reader("team-a", "fleet", Some(SM75), &out, &volumes, None)?;
    let targets: Vec<_> = fleet.iter().map(|p| &p.target).collect();
    let reports =
        support::triton_reuses_what_the_pod_read(&pods_a, &reader_pod, &out, &targets, TIMEOUT)
            .await?;
    assert_eq!(reports.len(), 11, "{reports:#?}");
    eprintln!(
        "the fleet through CSI: {:.1}s",
        fleet_began.elapsed().as_secs_f64()
    );
    delete_pod_and_wait(&pods_a, "fleet").await?;

    // --- Restarting the kubelet: the driver registers again, the running pod
    // keeps its mount, and a new pod mounts.
    let mounted = pod_mounts(&stack, SM75, &reader);
    stack
        .real_node_mut(SM75)
        .expect("real node")
        .restart_kubelet()
        .await?;
    wait_registered(&client, SM75).await?;
    assert_eq!(
        pod_mounts(&stack, SM75, &reader),
        mounted,
        "the mount survives the kubelet restart"
    );
    assert!(running(&pods_a.get("reader").await?));
    pods_a
        .create(
            &PostParams::default(),
            &cache_pod("team-a", "after-kubelet", SM75, own.clone())?,
        )
        .await?;
    wait_for_pod(&pods_a, "after-kubelet", TIMEOUT, running).await?;

    // --- Restarting gkm-csi: the same.
    stack.kill_csi(SM75);
    stack.start_csi(SM75)?;
    wait_registered(&client, SM75).await?;
    assert_eq!(
        pod_mounts(&stack, SM75, &reader),
        mounted,
        "the mount survives the driver restart"
    );
    pods_a
        .create(
            &PostParams::default(),
            &cache_pod("team-a", "after-driver", SM75, own)?,
        )
        .await?;
    wait_for_pod(&pods_a, "after-driver", TIMEOUT, running).await?;
    for name in ["after-kubelet", "after-driver"] {
        delete_pod_and_wait(&pods_a, name).await?;
    }

    // --- Deleting the cache while the pod runs waits for it; deleting the
    // pod unmounts and lets the cache go.
    caches
        .delete("vector-add", &DeleteParams::default())
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        caches.get_opt("vector-add").await?.is_some(),
        "held while a pod uses it"
    );
    delete_pod_and_wait(&pods_a, "reader").await?;
    // The kubelet unmounts once the pod is gone.
    until("the reader's volumes unmounted", TIMEOUT, || {
        pod_mounts(&stack, SM75, &reader).is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let real = stack.real_node(SM75).expect("real node");
    assert!(
        mounts_under(&real.pods_dir()).is_empty(),
        "no volume mount left under the kubelet's pods: {:?}",
        mounts_under(&real.pods_dir())
    );
    eventually("the deleted cache gone", TIMEOUT, || {
        let running = stack.check_running();
        let caches = &caches;
        async move {
            running?;
            Ok(caches.get_opt("vector-add").await?.is_none().then_some(()))
        }
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}; operator log:\n{}",
            stack.log_tail("operator", None, 30)
        )
    })?;
    let seconds: Vec<String> = [SM75, GFX90A]
        .iter()
        .filter_map(|n| stack.real_node(n))
        .map(|n| format!("{}: {:.1}s", n.name(), n.started_in().as_secs_f64()))
        .collect();
    eprintln!("real node start times: {}", seconds.join(", "));
    Ok(())
}
