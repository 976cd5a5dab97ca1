//! Pod attribution of GPU metrics on a real node: gkm's device plugin offers
//! two NVIDIA GPUs (a sysfs, /dev and /proc tree the test makes, no NVML) as
//! `nvidia.com/gpu`, the real kubelet allocates one to a container, the
//! agent reads the allocation from the kubelet's pod-resources API, and that
//! GPU's series carry the pod's `namespace`, `pod` and `container` until the
//! pod goes.

mod support;

use std::cell::RefCell;
use std::time::Duration;

use gkm_k8s_agent::{AgentConfig, GpuMetrics, TelemetryConfig};
use gkm_k8s_device_plugin::node_tree::{NodeTree, Pci};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, Sample,
    eventually, samples, settle, wait_for_pod,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
const NODE: &str = "gpu-attribution";
const GPU: &str = "nvidia.com/gpu";
const GPUS: [(&str, &str); 2] = [
    ("0000:6e:00.0", "GPU-0a7c0000-0000-4000-8000-000000000000"),
    ("0000:6f:00.0", "GPU-0a7c0000-0000-4000-8000-000000000001"),
];

/// The GPU metrics the agent serves now.
fn scrape(metrics: &GpuMetrics) -> anyhow::Result<Vec<Sample>> {
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(Box::new(metrics.clone()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    samples(&text)
}

/// The temperature series once `done` holds for them.
async fn temperatures_when(
    metrics: &GpuMetrics,
    done: impl Fn(&[Sample]) -> bool,
) -> anyhow::Result<Vec<Sample>> {
    let series = settle(
        TIMEOUT,
        || async {
            Ok(scrape(metrics)?
                .into_iter()
                .filter(|s| s.name == "gkm_gpu_temperature_celsius")
                .collect::<Vec<Sample>>())
        },
        |series| done(series),
    )
    .await?;
    anyhow::ensure!(done(&series), "GPU series never got there: {series:?}");
    Ok(series)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_held_by_a_pod_carries_its_namespace_pod_and_container() -> anyhow::Result<()> {
    let plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: true,
        ..ControlPlaneOptions::default()
    })
    .await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let node = RealNode::start(
        &plane,
        RealNodeOptions {
            name: NODE.into(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    let client = plane.client().await?;

    // gkm's device plugin, offering two GPUs on the nvidia driver.
    let work = gkm_testenv::temp_dir()?;
    let tree = NodeTree::new(&work.path().join("node"))?.with_char_devices()?;
    for (minor, (address, uuid)) in GPUS.iter().enumerate() {
        tree.pci(&Pci::gpu(address, 0x10de, 0x2330).driver("nvidia"))?;
        tree.nvidia_gpu(address, uuid, minor as u32)?;
    }
    let mut plugin = support::start_plugin(
        &node,
        &tree,
        plane.kubeconfig(),
        &[],
        &work.path().join("plugin.log"),
    )?;
    let nodes: Api<Node> = Api::all(client.clone());
    let offered = RefCell::new(None);
    eventually(&format!("the kubelet offering {GPU}"), TIMEOUT, || {
        let running = plugin.check_running();
        let (nodes, offered) = (&nodes, &offered);
        async move {
            running?;
            let allocatable = nodes
                .get(NODE)
                .await?
                .status
                .and_then(|s| s.allocatable)
                .and_then(|a| a.get(GPU).map(|q| q.0.clone()));
            let done = allocatable.as_deref() == Some("2");
            *offered.borrow_mut() = allocatable;
            Ok(done.then_some(()))
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {:?}\n{}", offered.borrow(), plugin.log_tail(30)))?;

    // The agent of this node, its simulated inventory naming the same GPUs.
    let dir = gkm_testenv::temp_dir()?;
    let inventory = dir.path().join("gpus.yaml");
    std::fs::write(
        &inventory,
        format!(
            "gpus:\n  - {{profile: H100, uuid: {}}}\n  - {{profile: H100, uuid: {}}}\n",
            GPUS[0].1, GPUS[1].1
        ),
    )?;
    let metrics = GpuMetrics::default();
    let mut config = AgentConfig::new(NODE, dir.path().join("store"));
    config.discovery.simulate = Some(inventory);
    config.telemetry = Some(TelemetryConfig {
        pod_resources_socket: Some(node.pod_resources_socket()),
        pod_resources_every: Duration::from_millis(500),
        ..TelemetryConfig::new(metrics.clone())
    });
    let agent = tokio::spawn(gkm_k8s_agent::run(
        client.clone(),
        config,
        std::future::pending(),
    ));
    let before = temperatures_when(&metrics, |s| s.len() == 2).await?;
    assert!(
        before.iter().all(|s| s.label("pod").is_none()),
        "{before:?}"
    );

    plane.ensure_namespace("ml").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train-0", "namespace": "ml"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "100000"],
                "resources": {"limits": {GPU: "1"}},
            }],
        }
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    wait_for_pod(&pods, "train-0", TIMEOUT, running).await?;

    let held = temperatures_when(&metrics, |s| s.iter().any(|s| s.label("pod").is_some())).await?;
    assert_eq!(held.len(), 2, "{held:?}");
    let labelled: Vec<&Sample> = held.iter().filter(|s| s.label("pod").is_some()).collect();
    assert_eq!(labelled.len(), 1, "one GPU is held: {held:?}");
    let uuid = labelled[0].label("UUID").unwrap_or_default();
    assert!(GPUS.iter().any(|(_, u)| *u == uuid), "{uuid}");
    let holder = ["namespace", "pod", "container"].map(|k| labelled[0].label(k));
    assert_eq!(holder, [Some("ml"), Some("train-0"), Some("main")]);

    pods.delete("train-0", &DeleteParams::default().grace_period(0))
        .await?;
    temperatures_when(&metrics, |s| {
        s.len() == 2 && s.iter().all(|s| s.label("pod").is_none())
    })
    .await?;
    plugin.check_running()?;
    agent.abort();
    Ok(())
}
