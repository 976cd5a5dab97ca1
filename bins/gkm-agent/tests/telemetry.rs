//! `gkm-agent`'s GPU labels and GPU metrics against a real kube-apiserver,
//! running as its ServiceAccount with the shipped RBAC: on a real node (a
//! kubelet registered it), the Node's labels follow the (simulated)
//! inventory, with GPU Feature Discovery's and AMD's names when asked, labels
//! that no longer apply go and labels the agent does not own (the kubelet's,
//! a person's) stay; `/metrics` passes Prometheus's parser and promlint;
//! without NVML every other metric is still served and the log says why,
//! once.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gkm_gpu::labels::{LabelOptions, node_labels};
use gkm_testenv::{Process, RealNode, RealNodeOptions, promlint, samples};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod support;

use gkm_testenv::{free_port, http_get as get};

/// Labels a person (or another daemon) set on the Node.
const HAND_SET: &[(&str, &str)] = &[("team", "ml"), ("nvidia.com/gpu.deploy.driver", "true")];

/// Starts the agent for `node` with `args`; returns it and its metrics port.
fn agent(
    kubeconfig: &Path,
    node: &str,
    dir: &Path,
    args: &[String],
) -> anyhow::Result<(Process, u16)> {
    let port = free_port()?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--node-name={node}"))
        .arg(format!("--store={}", dir.join("store").display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .arg("--pod-resources-socket=")
        .arg("--resync=1s")
        .args(args);
    let log = dir.join(format!("gkm-agent-{port}.log"));
    Ok((Process::spawn("gkm-agent", cmd, &log)?, port))
}

/// The Node's labels once `done` holds for them.
async fn labels_when(
    nodes: &Api<Node>,
    node: &str,
    agent: &mut Process,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> anyhow::Result<BTreeMap<String, String>> {
    let done = &done;
    support::until_some(
        agent,
        "the Node's labels",
        Duration::from_secs(30),
        || async move {
            let labels = nodes.get(node).await?.metadata.labels.unwrap_or_default();
            Ok(done(&labels).then_some(labels))
        },
    )
    .await
}

/// What the Node should carry: the labels it had before the agent came (the
/// kubelet's and a person's) and the inventory's.
fn expected(
    before: &BTreeMap<String, String>,
    inventory: &str,
    vendor_labels: bool,
) -> anyhow::Result<BTreeMap<String, String>> {
    let inventory = gkm_gpu::simulate::parse(inventory, "gpus.yaml".as_ref())?;
    let mut labels = before.clone();
    labels.extend(node_labels(&inventory, &LabelOptions { vendor_labels }));
    Ok(labels)
}

#[tokio::test]
async fn node_labels_follow_the_inventory_and_leave_other_labels_alone() -> anyhow::Result<()> {
    let (plane, kubeconfig) = support::agent_plane().await?;
    let nodes: Api<Node> = Api::all(plane.client().await?);
    let node = "agent-node-labels";
    let _kubelet = RealNode::start(
        plane,
        RealNodeOptions {
            name: node.into(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    let hand_set: BTreeMap<&str, &str> = HAND_SET.iter().copied().collect();
    let object: Node =
        serde_json::from_value(json!({"metadata": {"name": node, "labels": hand_set}}))?;
    nodes
        .patch(
            node,
            &PatchParams::apply("a-person"),
            &Patch::Apply(&object),
        )
        .await?;
    let before = nodes.get(node).await?.metadata.labels.unwrap_or_default();
    assert_eq!(
        before.get("kubernetes.io/hostname").map(String::as_str),
        Some(node),
        "the kubelet's own labels"
    );
    let dir = gkm_testenv::temp_dir()?;
    let gpus = dir.path().join("gpus.yaml");
    let simulate = format!("--simulate={}", gpus.display());
    let vendor = "--vendor-labels".to_string();

    // Eight H100s, with GPU Feature Discovery's names.
    let h100 = "gpus: [{profile: H100, count: 8, driverVersion: 550.90.07}]";
    std::fs::write(&gpus, h100)?;
    let (mut running, port) = agent(
        &kubeconfig,
        node,
        dir.path(),
        &[simulate.clone(), vendor.clone()],
    )?;
    let want = expected(&before, h100, true)?;
    let labels = labels_when(&nodes, node, &mut running, |l| {
        l.contains_key("nvidia.com/gpu.family")
    })
    .await?;
    assert_eq!(labels, want);
    for (key, value) in [
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/cuda.driver.major", "550"),
        ("nvidia.com/cuda.runtime.minor", "0"),
        ("gkm.io/gpu.arch", "sm_90"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }

    // Its metrics, as Prometheus would scrape them.
    let (status, metrics) = get(port, "/metrics").await.unwrap_or_default();
    assert_eq!(status, 200);
    promlint(&metrics)?;
    let series = samples(&metrics)?;
    let temperatures = series
        .iter()
        .filter(|s| s.name == "gkm_gpu_temperature_celsius" && s.label("Hostname") == Some(node))
        .count();
    assert_eq!(temperatures, 8);
    assert!(series.iter().any(|s| s.name == "gkm_build_info"));
    running.terminate(Duration::from_secs(15))?;

    // The node now has four MI300X: NVIDIA's names go, AMD's come, the
    // hand-set labels (one of them under nvidia.com/) stay.
    let mi300x = "gpus: [{profile: MI300X, count: 4, driverVersion: 6.8.5}]";
    std::fs::write(&gpus, mi300x)?;
    let (mut running, _) = agent(&kubeconfig, node, dir.path(), &[simulate.clone(), vendor])?;
    let labels = labels_when(&nodes, node, &mut running, |l| {
        l.contains_key("amd.com/gpu.family") && !l.contains_key("nvidia.com/gpu.family")
    })
    .await?;
    assert_eq!(labels, expected(&before, mi300x, true)?);
    assert!(!labels.contains_key("nvidia.com/gpu.present"));
    running.terminate(Duration::from_secs(15))?;

    // Without --vendor-labels only gkm's own remain.
    let (mut running, _) = agent(&kubeconfig, node, dir.path(), &[simulate])?;
    let labels = labels_when(&nodes, node, &mut running, |l| {
        !l.contains_key("amd.com/gpu.family")
    })
    .await?;
    assert_eq!(labels, expected(&before, mi300x, false)?);
    running.terminate(Duration::from_secs(15))?;
    Ok(())
}

#[tokio::test]
async fn without_nvml_the_agent_serves_every_other_metric_and_says_why_once() -> anyhow::Result<()>
{
    if gkm_gpu::nvidia::open().is_ok() {
        eprintln!("skipped: this machine has NVML");
        return Ok(());
    }
    let (plane, kubeconfig) = support::agent_plane().await?;
    let nodes: Api<Node> = Api::all(plane.client().await?);
    let node = "agent-node-no-nvml";
    plane.ensure_node(node).await?;
    let dir = gkm_testenv::temp_dir()?;
    // Two H100s on the nvidia driver, as a captured sysfs tree shows them.
    let sysfs = gkm_testenv::repo_root().join("gkm-gpu/testdata/sysfs/nvidia-h100");
    let (mut running, port) = agent(
        &kubeconfig,
        node,
        dir.path(),
        &[format!("--sysfs={}", sysfs.display())],
    )?;
    labels_when(&nodes, node, &mut running, |l| {
        l.contains_key("gkm.io/gpu.count")
    })
    .await?;

    let mut metrics = String::new();
    for _ in 0..3 {
        let (status, body) = get(port, "/metrics").await.unwrap_or_default();
        assert_eq!(status, 200);
        metrics = body;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    promlint(&metrics)?;
    let series = samples(&metrics)?;
    assert!(series.iter().any(|s| s.name == "gkm_build_info"));
    let info: Vec<_> = series.iter().filter(|s| s.name == "gkm_gpu_info").collect();
    assert_eq!(info.len(), 2, "{metrics}");
    assert!(info.iter().all(|s| s.label("source") == Some("none")));
    assert!(
        !series
            .iter()
            .any(|s| s.name.starts_with("gkm_gpu_") && s.name != "gkm_gpu_info"),
        "readings without NVML: {metrics}"
    );
    running.terminate(Duration::from_secs(15))?;
    let log = running.log_tail(usize::MAX);
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("GPU readings missing"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("NVML is not available")
            && said[0].contains("no readings for 2 NVIDIA GPU(s)"),
        "{}",
        said[0]
    );
    Ok(())
}
