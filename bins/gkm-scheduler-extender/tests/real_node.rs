//! The extender with gkm's device plugin on a real node (kubelet, containerd
//! and runc): a real kube-scheduler calls the extender, which writes the
//! device assignment at bind; the device plugin, registered with the node's
//! kubelet over a sysfs/dev tree the test makes (three AMD GPUs of 1 GiB), has
//! published the node's GPUs and hands the container the GPU assigned. The
//! GPU the extender wrote, the units the kubelet's pod-resources API reports
//! and the variables in the container's environment must be the same.

#[path = "../../gkm-device-plugin/tests/support/mod.rs"]
mod plugin;
mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gkm_core::assignment::{
    ANNOTATION, Assignment, GpuDevice, NODE_GPUS_ANNOTATION, parse_node_gpus, unit_gpu,
};
use gkm_k8s_device_plugin::node_tree::{NodeTree, Pci};
use gkm_testenv::{BUSYBOX_IMAGE, RealNode, RealNodeOptions, eventually, running_pod_log};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use support::{Cluster, scheduler_config};

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "gpu-node";
const NS: &str = "shared-gpus";
const CORES: &str = "gkm.io/gpu-cores";
const MEMORY: &str = "gkm.io/gpu-memory";
/// The GPUs of the node: AMD GPUs, whose memory size the plugin reads from
/// sysfs, so both compute and memory units are offered.
const GPUS: [&str; 3] = ["0000:40:00.0", "0000:41:00.0", "0000:42:00.0"];
const GPU_MIB: u64 = 1024;

/// The node tree: both GPUs on `amdgpu` with `GPU_MIB` of VRAM, and
/// `/dev/kfd` (a character device with `/dev/null`'s numbers).
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

/// A pod asking for `cores` and `memory` units, printing its GKM_GPU_*
/// variables (`env`) and waiting; the scheduler places it.
fn shared_pod(name: &str, cores: u64, memory: u64) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            // No node lifecycle controller lifts the taint of a new node.
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "env | grep '^GKM_GPU_' | sort; echo DONE; exec sleep 100000"],
                "resources": {"limits": {CORES: cores.to_string(), MEMORY: memory.to_string()}},
            }],
        }
    }))?)
}

/// The node's published GPUs once the annotation is there.
async fn published_gpus(nodes: &Api<Node>) -> anyhow::Result<Vec<GpuDevice>> {
    let value = eventually(
        &format!("node {NODE}'s {NODE_GPUS_ANNOTATION}"),
        TIMEOUT,
        || async {
            let node = nodes.get(NODE).await?;
            Ok(node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_GPUS_ANNOTATION))
                .cloned())
        },
    )
    .await?;
    Ok(parse_node_gpus(&value)?)
}

/// Waits until the Node's allocatable shows every unit.
async fn wait_allocatable(nodes: &Api<Node>) -> anyhow::Result<()> {
    let want = [(CORES, 300), (MEMORY, 3 * GPU_MIB)];
    let seen = RefCell::new(Vec::new());
    eventually(&format!("allocatable {want:?}"), TIMEOUT, || async {
        let node = nodes.get(NODE).await?;
        let all = node.status.and_then(|s| s.allocatable).unwrap_or_default();
        let now: Vec<(&str, u64)> = want
            .iter()
            .map(|(r, _)| (*r, all.get(*r).and_then(|q| q.0.parse().ok()).unwrap_or(0)))
            .collect();
        let done = now == want;
        *seen.borrow_mut() = now;
        Ok(done.then_some(()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it is {:?}", seen.borrow()))
}

/// The pod's log once it printed DONE, and the pod.
async fn run_to_done(
    pods: &Api<Pod>,
    name: &str,
    cluster: &Cluster,
) -> anyhow::Result<(Pod, String)> {
    let log = running_pod_log(pods, name, "main", "DONE", TIMEOUT)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cluster.logs()))?;
    Ok((pods.get(name).await?, log))
}

/// What the pod holds per GPU, per resource: resource → GPU → units, from
/// the kubelet's pod-resources API.
async fn held(socket: &Path, pod: &str) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
    let list = gkm_k8s_kubelet::podresources::list(socket, Duration::from_secs(10)).await?;
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let found = list
        .pod_resources
        .into_iter()
        .find(|p| p.namespace == NS && p.name == pod)
        .ok_or_else(|| anyhow::anyhow!("pod-resources does not list {NS}/{pod}"))?;
    for device in found.containers.into_iter().flat_map(|c| c.devices) {
        for id in device.device_ids {
            let gpu = unit_gpu(&id)
                .ok_or_else(|| anyhow::anyhow!("{id} is not a GPU unit ID"))?
                .to_string();
            *out.entry(device.resource_name.clone())
                .or_default()
                .entry(gpu)
                .or_default() += 1;
        }
    }
    Ok(out)
}

/// Schedules `name` asking `cores` and `memory`, and checks that the GPU the
/// extender assigned is the one pod-resources and the container's
/// environment show. Returns that GPU.
async fn check_pod(
    cluster: &Cluster,
    socket: &Path,
    name: &str,
    cores: u64,
    memory: u64,
) -> anyhow::Result<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), NS);
    pods.create(&PostParams::default(), &shared_pod(name, cores, memory)?)
        .await?;
    let (pod, log) = run_to_done(&pods, name, cluster).await?;
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(NODE)
    );
    let written = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .ok_or_else(|| anyhow::anyhow!("{name} has no {ANNOTATION}"))?;
    let assignment = Assignment::parse(written)?;
    let gpu = match assignment.devices(CORES) {
        [gpu] => gpu.clone(),
        other => anyhow::bail!("{name}: the extender assigned {other:?}, not one GPU"),
    };
    assert_eq!(
        assignment.devices(MEMORY),
        std::slice::from_ref(&gpu),
        "{written}"
    );
    eprintln!("{name}: the extender assigned {gpu}");

    // The kubelet's pod-resources API: every unit of the assigned GPU.
    let want = BTreeMap::from([
        (CORES.to_string(), BTreeMap::from([(gpu.clone(), cores)])),
        (MEMORY.to_string(), BTreeMap::from([(gpu.clone(), memory)])),
    ]);
    assert_eq!(held(socket, name).await?, want, "{name}");

    // The container's environment names the same GPU and amounts.
    let env: Vec<&str> = log.lines().filter(|l| l.starts_with("GKM_GPU_")).collect();
    assert_eq!(
        env,
        [
            format!("GKM_GPU_CORES={gpu}={cores}"),
            format!("GKM_GPU_MEMORY_MIB={gpu}={memory}"),
        ],
        "{log}"
    );
    Ok(gpu)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_gpu_the_extender_assigns_is_the_one_the_container_gets() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.namespace(NS).await?;
    let deploy = support::workspace_root().join("deploy");
    cluster
        .plane
        .apply_file(&deploy.join("rbac/device-plugin.yaml"))
        .await?;
    let node = RealNode::start(
        &cluster.plane,
        RealNodeOptions {
            name: NODE.to_string(),
            labels: BTreeMap::from([("gkm.io/gpu.product".to_string(), "AMD-MI300X".to_string())]),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    let work = gkm_testenv::temp_dir()?;
    let tree = gpu_tree(&work.path().join("node"))?;
    let plugin_kubeconfig = cluster
        .plane
        .kubeconfig_for_service_account("gkm-system", "gkm-device-plugin")?;
    let mut plugin = plugin::start_plugin(
        &node,
        &tree,
        &plugin_kubeconfig,
        &["--gpu-shares".to_string()],
        &work.path().join("plugin.log"),
    )?;

    // The plugin publishes the node's GPUs under the IDs its units carry.
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let gpus = published_gpus(&nodes).await?;
    let memory = i64::try_from(GPU_MIB)?;
    assert_eq!(
        gpus,
        GPUS.map(|id| GpuDevice {
            id: id.to_string(),
            cores: 100,
            memory
        })
    );
    wait_allocatable(&nodes).await?;

    cluster.start_extender().await?;
    let config = scheduler_config(&cluster.extender_addr)?;
    cluster.start_scheduler(&config)?;
    let socket = node.pod_resources_socket();

    // Shares: the first goes to the first GPU; the second does not fit
    // there (40% cores left) and goes to the second.
    let first = check_pod(&cluster, &socket, "first", 60, 100).await?;
    assert_eq!(first, GPUS[0]);
    let second = check_pod(&cluster, &socket, "second", 50, 900).await?;
    assert_eq!(second, GPUS[1]);
    // The third packs onto the GPU with the fewest cores left over (the
    // first: 30% stranded, against 40% on the second). The second GPU has
    // the least memory free, so the kubelet and the plugin, left to
    // themselves, would take its memory units: only the assignment makes the
    // memory come from the first GPU.
    let third = check_pod(&cluster, &socket, "third", 10, 50).await?;
    assert_eq!(third, GPUS[0]);
    // A whole GPU: every unit of the one still idle.
    let whole = check_pod(&cluster, &socket, "whole", 100, GPU_MIB).await?;
    assert_eq!(whole, GPUS[2]);

    plugin.check_running()?;
    drop(plugin);
    drop(node);
    Ok(())
}
