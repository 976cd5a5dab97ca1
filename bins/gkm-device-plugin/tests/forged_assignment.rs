//! A pod that forges its own device assignment, on a real node (kubelet,
//! containerd, runc) with `gkm-device-plugin --gpu-shares` over a
//! sysfs/dev tree the test makes (two AMD GPUs of 1 GiB).
//!
//! A pod created with `spec.nodeName` never meets the scheduler extender,
//! and where the admission policy that keeps `gkm.io/gpu-assignment` to the
//! extender is not installed, it can write the annotation itself. The
//! plugin must still never hand it a GPU another pod holds: the container
//! gets exactly the units the kubelet allocated, which the kubelet's
//! pod-resources API reports, whatever the annotation names.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use gkm_core::assignment::{ANNOTATION, Assignment, unit_gpu};
use gkm_k8s_device_plugin::node_tree::{NodeTree, Pci};
use gkm_testenv::{BUSYBOX_IMAGE, ControlPlane, RealNode, RealNodeOptions, pod_log, wait_for_pod};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "forged-node";
const NS: &str = "forged-assignment";
const CORES: &str = "gkm.io/gpu-cores";
const MEMORY: &str = "gkm.io/gpu-memory";
const GPUS: [&str; 2] = ["0000:40:00.0", "0000:41:00.0"];
const GPU_MIB: u64 = 1024;

/// Both GPUs on `amdgpu` with `GPU_MIB` of VRAM, and `/dev/kfd`.
fn gpu_tree(dir: &Path) -> anyhow::Result<NodeTree> {
    let tree = NodeTree::new(dir)?.with_char_devices()?;
    for address in GPUS {
        tree.pci(&Pci::gpu(address, 0x1002, 0x74a1).driver("amdgpu"))?;
        std::fs::write(
            tree.paths()
                .sysfs_root
                .join("bus/pci/devices")
                .join(address)
                .join("mem_info_vram_total"),
            format!("{}\n", GPU_MIB << 20),
        )?;
    }
    tree.dev_node("kfd")?;
    Ok(tree)
}

/// A pod on the node asking for a whole GPU in units, with `annotation` as
/// its `gkm.io/gpu-assignment`, printing its GKM_GPU_* variables.
fn whole_gpu_pod(name: &str, assigned: &str) -> anyhow::Result<Pod> {
    let assignment = Assignment::new()
        .with(CORES, vec![assigned.to_string()])
        .with(MEMORY, vec![assigned.to_string()])
        .format();
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS, "annotations": {ANNOTATION: assignment}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env | grep '^GKM_GPU_' | sort; echo DONE; exec sleep 100000"],
                "resources": {"limits": {CORES: "100", MEMORY: GPU_MIB.to_string()}},
            }],
        }
    }))?)
}

/// The pod's GKM_GPU_* lines once it printed DONE.
async fn gpu_env(pods: &Api<Pod>, name: &str) -> anyhow::Result<Vec<String>> {
    wait_for_pod(pods, name, TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    let began = Instant::now();
    loop {
        let log = pod_log(pods, name, "main").await.unwrap_or_default();
        if log.contains("DONE") {
            return Ok(log
                .lines()
                .filter(|l| l.starts_with("GKM_GPU_"))
                .map(String::from)
                .collect());
        }
        anyhow::ensure!(
            began.elapsed() < TIMEOUT,
            "pod {name} printed no DONE: {log}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The GPUs whose units the kubelet's pod-resources API says `pod` holds.
async fn held_gpus(socket: &Path, pod: &str) -> anyhow::Result<Vec<String>> {
    let list = gkm_k8s_kubelet::podresources::list(socket, Duration::from_secs(10)).await?;
    let found = list
        .pod_resources
        .into_iter()
        .find(|p| p.namespace == NS && p.name == pod)
        .ok_or_else(|| anyhow::anyhow!("pod-resources does not list {NS}/{pod}"))?;
    let mut gpus: Vec<String> = found
        .containers
        .iter()
        .flat_map(|c| &c.devices)
        .flat_map(|d| &d.device_ids)
        .filter_map(|id| unit_gpu(id).map(String::from))
        .collect();
    gpus.sort();
    gpus.dedup();
    Ok(gpus)
}

/// The variables a container given the whole of `gpu` in units has.
fn whole_gpu_env(gpu: &str) -> Vec<String> {
    vec![
        format!("GKM_GPU_CORES={gpu}=100"),
        format!("GKM_GPU_MEMORY_MIB={gpu}={GPU_MIB}"),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_assignment_never_gets_a_gpu_another_pod_holds() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    let node = RealNode::start(
        plane,
        RealNodeOptions {
            name: NODE.to_string(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    plane.ensure_pod_namespace(NS).await?;
    let client = plane.client().await?;
    let deploy = gkm_testenv::repo_root().join("deploy");
    for file in ["namespace.yaml", "rbac/device-plugin.yaml"] {
        plane.apply_file(&deploy.join(file)).await?;
    }
    let plugin_kubeconfig =
        plane.kubeconfig_for_service_account("gkm-system", "gkm-device-plugin")?;
    let work = gkm_testenv::temp_dir()?;
    let tree = gpu_tree(&work.path().join("node"))?;
    let mut plugin = support::start_plugin(
        &node,
        &tree,
        &plugin_kubeconfig,
        &["--gpu-shares".to_string()],
        &work.path().join("plugin.log"),
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    let began = Instant::now();
    loop {
        let node = nodes.get(NODE).await?;
        let all = node.status.and_then(|s| s.allocatable).unwrap_or_default();
        if all.get(CORES).map(|q| q.0.as_str()) == Some("200") {
            break;
        }
        anyhow::ensure!(began.elapsed() < TIMEOUT, "no GPU units offered: {all:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let socket = node.pod_resources_socket();

    // The first pod holds the whole first GPU.
    pods.create(&PostParams::default(), &whole_gpu_pod("holder", GPUS[0])?)
        .await?;
    assert_eq!(gpu_env(&pods, "holder").await?, whole_gpu_env(GPUS[0]));
    assert_eq!(held_gpus(&socket, "holder").await?, [GPUS[0]]);

    // The second names the first GPU too. The kubelet has only the second
    // GPU's units left and allocates those; the container gets them, not the
    // GPU the other pod holds.
    pods.create(&PostParams::default(), &whole_gpu_pod("forger", GPUS[0])?)
        .await?;
    let env = gpu_env(&pods, "forger").await?;
    let held = held_gpus(&socket, "forger").await?;
    eprintln!("forger: the kubelet allocated units of {held:?}; its container has {env:?}");
    assert_eq!(held, [GPUS[1]]);
    assert_eq!(
        env,
        whole_gpu_env(GPUS[1]),
        "the forged assignment got the GPU another pod holds"
    );
    plugin.check_running()?;
    drop(plugin);
    drop(node);
    Ok(())
}
