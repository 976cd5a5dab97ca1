//! GPU pods through DRA against through gkm's device plugin resources and
//! extender (run by `hack/bench/dra.sh`): on the same kwok nodes, each with
//! [`GPUS_PER_NODE`] GPUs both ways, kube-scheduler alone places pods that
//! each claim one GPU from a ResourceClaimTemplate (driver `gpu.gkm.io`,
//! the chart's DeviceClass `gkm-gpu`), then kube-scheduler with gkm's
//! extender places the same number of pods asking for one `nvidia.com/gpu`.
//! Prints pods per second for both, the ratio, and kube-scheduler's (and
//! the extender's) CPU seconds; writes them as JSON to `JSON_PATH`.
//!
//! The nodes' ResourceSlices are what `gkm-dra-plugin` publishes for a node
//! with eight H100s on the `nvidia` driver: the plugin's own discovery
//! (`gkm_k8s_dra::look`, over a simulated node tree, without NVML) and its
//! own slices (`gkm_k8s_dra::slices::pool_slices`), so the benchmark's
//! devices carry whatever attributes the driver publishes.
//!
//! ```sh
//! cargo run -p gkm-scheduler-extender --example bench_dra -- EXTENDER_BINARY NODES PODS JSON_PATH
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use common::{GPUS_PER_NODE, Scheduled};
use futures::{StreamExt, TryStreamExt};
use gkm_gpu::PciIdsSource;
use gkm_gpu::pci_ids::PciIds;
use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use gkm_k8s_dra::devices::DraDevice;
use gkm_k8s_dra::slices::{PoolOwner, pool_slices};
use gkm_k8s_dra::{DRIVER, DraConfig};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Cluster, PLAIN_SCHEDULER, asking};

/// The DeviceClass the claims name: the chart's class for container GPUs.
const DEVICE_CLASS: &str = "gkm-gpu";
const DRA_NS: &str = "bench-dra";
const EXTENDER_NS: &str = "bench-gkm";

/// The devices `gkm-dra-plugin` publishes for a node with
/// [`GPUS_PER_NODE`] H100s on the `nvidia` driver, found by the plugin's own
/// look at a node tree made under `dir`.
fn plugin_devices(dir: &Path) -> anyhow::Result<Vec<DraDevice>> {
    let tree = NodeTree::new(&dir.join("node"))?;
    for i in 0..GPUS_PER_NODE {
        let address = format!("0000:{:02x}:00.0", 0x18 + 0x11 * i);
        tree.pci(
            &Pci::gpu(&address, 0x10de, 0x2330)
                .driver("nvidia")
                .numa((i / 4) as u32),
        )?;
        let uuid = format!("GPU-{i:08x}-1111-2222-3333-444444444444");
        tree.nvidia_gpu(&address, &uuid, i as u32)?;
    }
    let config = DraConfig {
        paths: tree.paths().clone(),
        kubelet_dir: dir.join("kubelet"),
        cdi_dir: dir.join("cdi"),
        state_dir: dir.join("state"),
        pci_ids: PciIdsSource::System,
        poll: Duration::from_secs(5),
        nvml: false,
        node_name: "bench".to_string(),
    };
    let ids = PciIds::open(&config.pci_ids)?;
    let found = gkm_k8s_dra::look(&config, &ids)?;
    anyhow::ensure!(
        found.devices.len() == GPUS_PER_NODE,
        "the plugin found {} of the node tree's {GPUS_PER_NODE} GPUs; left out: {:?}",
        found.devices.len(),
        found.excluded
    );
    Ok(found.devices)
}

/// Publishes `devices` as every node's pool, as the plugin would.
async fn publish(
    cluster: &Cluster,
    nodes: &[common::BenchNode],
    devices: &[DraDevice],
) -> anyhow::Result<()> {
    let api: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let slices: Vec<ResourceSlice> = nodes
        .iter()
        .flat_map(|node| {
            let owner = PoolOwner {
                node: &node.name,
                node_uid: &node.uid,
            };
            pool_slices(DRIVER, &owner, 1, devices)
        })
        .collect();
    futures::stream::iter(slices)
        .map(|slice| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &slice).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// The chart's DeviceClass [`DEVICE_CLASS`] (with `dra.enabled`), created.
async fn install_device_class(cluster: &Cluster) -> anyhow::Result<()> {
    let docs = support::chart_documents(&[
        "--set",
        "dra.enabled=true",
        "--set",
        "dra.deviceClasses.extendedResources=false",
    ])?;
    let class = support::find_document(&docs, "DeviceClass", DEVICE_CLASS)
        .with_context(|| format!("the chart renders no DeviceClass {DEVICE_CLASS}"))?;
    let class: DeviceClass = serde_json::from_value(class.clone())?;
    Api::<DeviceClass>::all(cluster.client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

/// Waits until the resource claim controller has made the claims of `count`
/// pods in `ns`.
async fn wait_for_claims(cluster: &Cluster, ns: &str, count: usize) -> anyhow::Result<()> {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), ns);
    let what = format!("{count} ResourceClaims made from the template");
    gkm_testenv::eventually(&what, Duration::from_secs(600), || {
        let claims = claims.clone();
        async move {
            let made = claims
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
            Ok((made >= count).then_some(()))
        }
    })
    .await
}

/// How many claims in `ns` are allocated a device of [`DRIVER`].
async fn allocated(cluster: &Cluster, ns: &str) -> anyhow::Result<usize> {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), ns);
    Ok(claims
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .is_some_and(|results| results.iter().any(|r| r.driver == DRIVER))
        })
        .count())
}

/// Pods through DRA: slices, the DeviceClass, the template and the pods,
/// then kube-scheduler alone.
async fn dra(
    cluster: &mut Cluster,
    nodes: &[common::BenchNode],
    count: usize,
) -> anyhow::Result<Scheduled> {
    let dir = tempfile::tempdir()?;
    let devices = plugin_devices(dir.path())?;
    if let Some(device) = devices.first() {
        let keys: Vec<&str> = device.attributes.keys().map(String::as_str).collect();
        eprintln!(
            "== each node's pool: {} devices like {} with attributes {}",
            devices.len(),
            device.name,
            keys.join(", ")
        );
    }
    publish(cluster, nodes, &devices).await?;
    install_device_class(cluster).await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "gpu", "namespace": DRA_NS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}},
        ]}}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(cluster.client.clone(), DRA_NS)
        .create(&PostParams::default(), &template)
        .await?;
    let spec = json!({
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
        "containers": [{"name": "c", "image": "busybox",
                        "resources": {"claims": [{"name": "gpu"}]}}],
    });
    common::create_pods(cluster, DRA_NS, count, &spec).await?;
    wait_for_claims(cluster, DRA_NS, count).await?;
    let scheduled = common::schedule(cluster, DRA_NS, count, PLAIN_SCHEDULER).await?;
    let allocated = allocated(cluster, DRA_NS).await?;
    anyhow::ensure!(
        allocated == count,
        "{allocated} of the {count} bound pods' claims are allocated a {DRIVER} device"
    );
    Ok(scheduled)
}

/// Pods through gkm's device plugin resource and extender.
async fn extender(
    cluster: &mut Cluster,
    binary: &Path,
    count: usize,
) -> anyhow::Result<(Scheduled, f64)> {
    common::allow_gpus(cluster, EXTENDER_NS).await?;
    cluster.start_extender_from(binary).await?;
    let pid = cluster
        .extender
        .as_ref()
        .map(|p| p.pid())
        .context("the extender did not start")?;
    let spec = json!({"containers": asking(json!({"nvidia.com/gpu": "1"}))});
    common::create_pods(cluster, EXTENDER_NS, count, &spec).await?;
    let config = support::scheduler_config(&cluster.extender_addr)?;
    let before = gkm_testenv::cpu_seconds(pid)?;
    let scheduled = common::schedule(cluster, EXTENDER_NS, count, &config).await?;
    Ok((scheduled, gkm_testenv::cpu_seconds(pid)? - before))
}

fn line(s: &Scheduled) -> String {
    format!(
        "{:8.1} pods/s ({:.2?}); kube-scheduler CPU {:.2} s ({:.2} s since its start)",
        s.per_second(),
        s.elapsed,
        s.cpu_seconds,
        s.cpu_seconds_total
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let usage = "usage: bench_dra EXTENDER_BINARY NODES PODS JSON_PATH";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, nodes, count, json_path] = args.as_slice() else {
        anyhow::bail!("{usage}");
    };
    let binary = PathBuf::from(binary);
    let nodes: usize = nodes
        .parse()
        .with_context(|| format!("NODES {nodes:?}: {usage}"))?;
    let count: usize = count
        .parse()
        .with_context(|| format!("PODS {count:?}: {usage}"))?;
    anyhow::ensure!(
        count <= nodes * GPUS_PER_NODE,
        "{count} pods do not fit {nodes} nodes of {GPUS_PER_NODE} GPUs"
    );

    let began = Instant::now();
    let mut cluster = Cluster::start_with_controllers(&["resourceclaim-controller"]).await?;
    let bench_nodes = common::create_nodes(&cluster, nodes).await?;
    for ns in [DRA_NS, EXTENDER_NS] {
        cluster.namespace(ns).await?;
    }
    eprintln!("== {nodes} kwok nodes up in {:.0?}", began.elapsed());

    let dra = dra(&mut cluster, &bench_nodes, count).await?;
    eprintln!("== DRA: {count} pods in {:.2?}", dra.elapsed);
    common::delete_pods(&cluster, DRA_NS).await?;
    let (extender, extender_cpu) = extender(&mut cluster, &binary, count).await?;
    eprintln!("== extender: {count} pods in {:.2?}", extender.elapsed);

    let ratio = dra.per_second() / extender.per_second().max(f64::EPSILON);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("nodes {nodes} ({GPUS_PER_NODE} GPUs each), GPU pods {count}");
    println!("DRA, kube-scheduler alone:    {}", line(&dra));
    println!("device plugin + extender:     {}", line(&extender));
    println!("                              extender CPU {extender_cpu:.2} s");
    println!("pods/s ratio DRA / extender:  {ratio:.2}x");
    let mut extender_json = extender.json();
    extender_json["extender_cpu_seconds"] = json!(extender_cpu);
    let summary = json!({
        "nodes": nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "pods": count,
        "dra": dra.json(),
        "extender": extender_json,
        "dra_over_extender_pods_per_second": ratio,
        "load_average": load.split_whitespace().take(3).collect::<Vec<_>>(),
    });
    std::fs::write(json_path, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {json_path}"))?;
    Ok(())
}
