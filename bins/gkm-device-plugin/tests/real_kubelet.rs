//! `gkm-device-plugin` with a real kubelet, containerd and runc, against a
//! sysfs, /dev and /proc tree the test makes: two H100s and an A100 on
//! `vfio-pci`, an H100 whose IOMMU group is not viable, two `GRID T4-2Q`
//! vGPUs, and an H100 on the `nvidia` driver.
//!
//! The tree's device nodes are character devices with the numbers of
//! `/dev/null` (1:3), made with mknod: containerd copies a device's type and
//! numbers into the container, so the containers really get
//! `/dev/vfio/<group>` and `/dev/nvidia0`, and those nodes are harmless.
//!
//! One test walks the story: the Node's allocatable, pods that get a
//! passthrough GPU (the one the pod's `gkm.io/gpu-assignment` names), a vGPU
//! and an `nvidia.com/gpu` and print what they got, the kubelet's
//! pod-resources API agreeing, a group node removed and restored, a request
//! larger than what is free refused whole, and a kubelet restart.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_core::assignment::{ANNOTATION, Assignment};
use gkm_k8s_device_plugin::node_tree::{EXAMPLE_VGPU_PARENT, NodeTree, Pci};
use gkm_k8s_kubelet::proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use gkm_k8s_kubelet::proto::podresources::{AllocatableResourcesRequest, ListPodResourcesRequest};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, Process, RealNode, RealNodeOptions, running_pod_log, wait_for_pod,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const NODE: &str = "real-gpu";
const NS: &str = "device-plugin";
const H100: &str = "nvidia.com/GH100_H100_SXM5_80GB";
const A100: &str = "nvidia.com/GA100_A100_PCIE_80GB";
const T4_2Q: &str = "nvidia.com/GRID_T4-2Q";
const GPU: &str = "nvidia.com/gpu";
const GPU_UUID: &str = "GPU-6e000000-1111-2222-3333-444444444444";

/// A busybox pod on the node asking for `count` of `resource`, printing its
/// device variables and whether `check` is a character device, then waiting.
/// The variables are read from the container process's environment
/// (`/proc/1/environ`): a shell drops names it cannot hold, such as
/// `MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q`, which KubeVirt reads directly.
fn device_pod(name: &str, resource: &str, count: u32, check: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!(
                    "tr '\\0' '\\n' < /proc/1/environ | grep -E '^(MDEV_)?PCI_RESOURCE_|^NVIDIA_VISIBLE_DEVICES=' | sort; \
                     if [ -c {check} ]; then echo 'CHAR-DEVICE {check}'; fi; \
                     echo DONE; exec sleep 100000")],
                "resources": {"limits": {resource: count.to_string()}},
            }],
        }
    }))?)
}

/// The Node's allocatable count of each resource (0 when absent).
async fn allocatable(nodes: &Api<Node>) -> anyhow::Result<BTreeMap<String, String>> {
    let node = nodes.get(NODE).await?;
    let all = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    Ok([H100, A100, T4_2Q, GPU]
        .into_iter()
        .map(|r| {
            (
                r.to_string(),
                all.get(r).map_or_else(|| "0".to_string(), |q| q.0.clone()),
            )
        })
        .collect())
}

fn counts(items: &[(&str, &str)]) -> BTreeMap<String, String> {
    items
        .iter()
        .map(|(r, n)| (r.to_string(), n.to_string()))
        .collect()
}

/// Waits until the Node's allocatable is `want`.
async fn wait_allocatable(
    nodes: &Api<Node>,
    want: &BTreeMap<String, String>,
) -> anyhow::Result<Duration> {
    let began = Instant::now();
    loop {
        let now = allocatable(nodes).await?;
        if &now == want {
            return Ok(began.elapsed());
        }
        if began.elapsed() > TIMEOUT {
            anyhow::bail!("allocatable is {now:?}, not {want:?}, after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the kubelet's pod-resources API says each pod of the test holds:
/// pod → resource → device IDs.
async fn pod_resources(
    socket: &Path,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, Vec<String>>>> {
    let channel = gkm_k8s_kubelet::socket::connect(socket, Duration::from_secs(10)).await?;
    let list = PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await?
        .into_inner();
    let mut out = BTreeMap::new();
    for pod in list.pod_resources.into_iter().filter(|p| p.namespace == NS) {
        let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for device in pod.containers.into_iter().flat_map(|c| c.devices) {
            held.entry(device.resource_name)
                .or_default()
                .extend(device.device_ids);
        }
        out.insert(pod.name, held);
    }
    Ok(out)
}

/// What the kubelet itself can allocate now (pod-resources
/// `GetAllocatableResources`): resource → device count.
async fn kubelet_devices(socket: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let channel = gkm_k8s_kubelet::socket::connect(socket, Duration::from_secs(10)).await?;
    let all = PodResourcesListerClient::new(channel)
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await?
        .into_inner();
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for devices in all.devices {
        *per.entry(devices.resource_name).or_default() += devices.device_ids.len();
    }
    Ok(per.into_iter().map(|(r, n)| (r, n.to_string())).collect())
}

fn held(resource: &str, ids: &[&str]) -> BTreeMap<String, Vec<String>> {
    BTreeMap::from([(
        resource.to_string(),
        ids.iter().map(|s| s.to_string()).collect(),
    )])
}

/// kube-scheduler against the control plane, as its admin.
fn start_scheduler(plane: &ControlPlane, dir: &Path) -> anyhow::Result<Process> {
    let bin = gkm_testenv::find_binary(gkm_testenv::Component::KubeScheduler)?;
    let kubeconfig = plane.kubeconfig().display().to_string();
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--kubeconfig={kubeconfig}"))
        .arg(format!("--authentication-kubeconfig={kubeconfig}"))
        .arg(format!("--authorization-kubeconfig={kubeconfig}"))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg("--secure-port=0");
    Process::spawn("kube-scheduler", cmd, &dir.join("scheduler.log"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_kubelet_hands_out_passthrough_gpus_vgpus_and_container_gpus() -> anyhow::Result<()>
{
    let plane = ControlPlane::shared().await?;
    let mut node = RealNode::start(
        plane,
        RealNodeOptions {
            name: NODE.to_string(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    plane.ensure_pod_namespace(NS).await?;
    let client = plane.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    // The plugin reads pods with the RBAC deploy/ ships, as its account.
    let deploy = gkm_testenv::repo_root().join("deploy");
    for file in ["namespace.yaml", "rbac/device-plugin.yaml"] {
        plane.apply_file(&deploy.join(file)).await?;
    }
    let plugin_kubeconfig =
        plane.kubeconfig_for_service_account("gkm-system", "gkm-device-plugin")?;

    let work = gkm_testenv::temp_dir()?;
    let tree = NodeTree::new(&work.path().join("node"))?.with_char_devices()?;
    tree.example()?;
    tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))?;
    tree.nvidia_gpu("0000:6e:00.0", GPU_UUID, 0)?;
    let pci_ids = work.path().join("pci.ids");
    std::fs::write(
        &pci_ids,
        "10de  NVIDIA Corporation\n\t20b5  GA100 [A100 PCIe 80GB]\n\t2330  GH100 [H100 SXM5 80GB]\n",
    )?;
    let status_file = work.path().join("status.json");
    let mut plugin = support::start_plugin(
        &node,
        &tree,
        &plugin_kubeconfig,
        &[
            format!("--pci-ids={}", pci_ids.display()),
            format!("--status-file={}", status_file.display()),
        ],
        &work.path().join("plugin.log"),
    )?;

    // Allocatable: each resource with its count; the H100 in the group that
    // is not viable is left out, with its reason in the status file.
    let full = counts(&[(H100, "2"), (A100, "1"), (T4_2Q, "2"), (GPU, "1")]);
    let took = wait_allocatable(&nodes, &full).await?;
    eprintln!("allocatable after {took:?}");
    let status: serde_json::Value = serde_json::from_slice(&std::fs::read(&status_file)?)?;
    let reasons: Vec<String> = status["excluded"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["device"] == "0000:4c:00.0")
        .filter_map(|e| e["reason"].as_str().map(String::from))
        .collect();
    assert_eq!(reasons.len(), 1, "{status}");
    assert!(
        reasons[0].contains("IOMMU group 13 is not viable"),
        "{}",
        reasons[0]
    );

    // A VM-style pod with one H100: the scheduler's assignment names the
    // second H100, and the kubelet allocates exactly that one.
    let mut vm = device_pod("vm-h100", H100, 1, "/dev/vfio/11")?;
    vm.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION.to_string(),
        Assignment::new()
            .with(H100, vec!["0000:2a:00.0".into()])
            .format(),
    )]));
    pods.create(&PostParams::default(), &vm).await?;
    let log = running_pod_log(&pods, "vm-h100", "main", "DONE", TIMEOUT).await?;
    assert!(
        log.contains("PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB=0000:2a:00.0\n"),
        "{log}"
    );
    assert!(log.contains("CHAR-DEVICE /dev/vfio/11\n"), "{log}");

    pods.create(
        &PostParams::default(),
        &device_pod("vm-vgpu", T4_2Q, 1, "/dev/vfio/vfio")?,
    )
    .await?;
    let log = running_pod_log(&pods, "vm-vgpu", "main", "DONE", TIMEOUT).await?;
    let vgpu = log
        .lines()
        .find_map(|l| l.strip_prefix("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q="))
        .map(String::from)
        .ok_or_else(|| anyhow::anyhow!("no vGPU variable: {log}"))?;
    assert!(log.contains("CHAR-DEVICE /dev/vfio/vfio\n"), "{log}");

    pods.create(
        &PostParams::default(),
        &device_pod("cuda", GPU, 1, "/dev/nvidia0")?,
    )
    .await?;
    let log = running_pod_log(&pods, "cuda", "main", "DONE", TIMEOUT).await?;
    assert!(
        log.contains(&format!("NVIDIA_VISIBLE_DEVICES={GPU_UUID}\n")),
        "{log}"
    );
    assert!(log.contains("CHAR-DEVICE /dev/nvidia0\n"), "{log}");

    // The kubelet's pod-resources API reports the same devices.
    let socket = node.pod_resources_socket();
    assert_eq!(
        pod_resources(&socket).await?,
        BTreeMap::from([
            ("cuda".to_string(), held(GPU, &[GPU_UUID])),
            ("vm-h100".to_string(), held(H100, &["0000:2a:00.0"])),
            ("vm-vgpu".to_string(), held(T4_2Q, &[&vgpu])),
        ])
    );

    // A group's device node goes away: allocatable drops; it comes back.
    tree.remove_group_node(10)?;
    let took = wait_allocatable(
        &nodes,
        &counts(&[(H100, "1"), (A100, "1"), (T4_2Q, "2"), (GPU, "1")]),
    )
    .await?;
    eprintln!("allocatable dropped {took:?} after the group node went");
    tree.group_node(10)?;
    let took = wait_allocatable(&nodes, &full).await?;
    eprintln!("allocatable restored {took:?} after the group node came back");

    // A vGPU created while the plugin runs is offered; removed, it is gone.
    let third = "0b1c5e8a-1111-4d2e-9c3a-000000000003";
    tree.mdev(third, EXAMPLE_VGPU_PARENT, "nvidia-222", "GRID T4-2Q", 32)?;
    let took = wait_allocatable(
        &nodes,
        &counts(&[(H100, "2"), (A100, "1"), (T4_2Q, "3"), (GPU, "1")]),
    )
    .await?;
    eprintln!("a new vGPU offered {took:?} after it was created");
    tree.remove_mdev(third)?;
    wait_allocatable(&nodes, &full).await?;

    // Two H100s asked while one is free: the kubelet's device manager
    // refuses the pod at admission, whole (it holds no device).
    pods.create(
        &PostParams::default(),
        &device_pod("too-big", H100, 2, "/dev/vfio/10")?,
    )
    .await?;
    let refused = wait_for_pod(&pods, "too-big", TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
    })
    .await?;
    let status = refused.status.unwrap_or_default();
    let reason = status.reason.unwrap_or_default();
    let message = status.message.unwrap_or_default();
    eprintln!("refused: {reason}: {message}");
    assert_eq!(reason, "UnexpectedAdmissionError", "{message}");
    assert!(
        message.contains(&format!(
            "requested number of devices unavailable for {H100}. Requested: 2, Available: 1"
        )),
        "{message}"
    );
    let after = pod_resources(&socket).await?;
    assert!(!after.contains_key("too-big"), "{after:?}");
    assert_eq!(after["vm-h100"], held(H100, &["0000:2a:00.0"]));

    // Through the scheduler, the same request stays Pending with the reason.
    let mut scheduler = start_scheduler(plane, work.path())?;
    let mut waiting = device_pod("waits", H100, 2, "/dev/vfio/10")?;
    if let Some(spec) = waiting.spec.as_mut() {
        spec.node_name = None;
        // No node lifecycle controller runs to lift the node's not-ready
        // taint; the fit on GPUs is what is looked at.
        spec.tolerations = Some(vec![serde_json::from_value(json!({"operator": "Exists"}))?]);
    }
    pods.create(&PostParams::default(), &waiting).await?;
    let pending = wait_for_pod(&pods, "waits", TIMEOUT, |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "PodScheduled" && c.status == "False")
            })
    })
    .await?;
    scheduler.check_running()?;
    let status = pending.status.unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    let unscheduled = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .and_then(|c| c.message)
        .unwrap_or_default();
    eprintln!("pending: {unscheduled}");
    assert!(
        unscheduled.contains(&format!("Insufficient {H100}")),
        "{unscheduled}"
    );
    assert!(!pod_resources(&socket).await?.contains_key("waits"));
    drop(scheduler);

    // The kubelet restarts: the plugin registers again by itself. The
    // restarted kubelet knows devices only from plugins registered with it
    // (the Node object may still show the old allocatable for a while).
    let pid = plugin.pid();
    node.restart_kubelet().await?;
    let began = Instant::now();
    loop {
        let now = kubelet_devices(&socket).await.unwrap_or_default();
        if now == full {
            eprintln!(
                "the restarted kubelet has every device again {:?} after it was Ready",
                began.elapsed()
            );
            break;
        }
        if began.elapsed() > TIMEOUT {
            anyhow::bail!(
                "the restarted kubelet has {now:?}, not {full:?}; plugin log:\n{}",
                plugin.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    wait_allocatable(&nodes, &full).await?;
    plugin.check_running()?;
    assert_eq!(plugin.pid(), pid);
    let log = std::fs::read_to_string(work.path().join("plugin.log"))?;
    assert!(log.contains("registering again"), "{log}");
    // The restarted kubelet lists the pod again once it has synced it, with
    // the device it had.
    let began = Instant::now();
    loop {
        let now = pod_resources(&socket).await?;
        if let Some(devices) = now.get("vm-h100") {
            assert_eq!(devices, &held(H100, &["0000:2a:00.0"]));
            break;
        }
        if began.elapsed() > TIMEOUT {
            anyhow::bail!("vm-h100 not in pod-resources after the restart: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
