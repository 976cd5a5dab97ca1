//! The extender's benchmark (run by `hack/bench-extender.sh`): kube-scheduler
//! places the same GPU pods on the same kwok nodes without and then with
//! the extender; prints pods per second, the ratio, the extender's exact
//! filter, prioritize and bind answer times (p50, p99, max, read from its
//! `GET /scheduler/latency`) and its memory.
//!
//! ```sh
//! cargo run -p gkm-scheduler-extender --example bench -- EXTENDER_BINARY [NODES] [PODS]
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use support::{Cluster, PLAIN_SCHEDULER, asking};

const MODEL: &str = "NVIDIA-A100-SXM4-80GB";

async fn create_nodes(cluster: &Cluster, count: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    futures::stream::iter(0..count)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let resources =
                    json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"});
                let node: Node = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("gpu-{i:04}"),
                        "labels": {"gkm.io/gpu.product": MODEL, "type": "kwok",
                                   "kubernetes.io/hostname": format!("gpu-{i:04}")},
                        "annotations": {gkm_testenv::KWOK_NODE_ANNOTATION: "fake"},
                    },
                    "status": {"capacity": resources, "allocatable": resources},
                }))?;
                nodes.create(&PostParams::default(), &node).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn create_pods(cluster: &Cluster, ns: &str, count: usize) -> anyhow::Result<()> {
    futures::stream::iter(0..count)
        .map(|i| {
            let spec = json!({"containers": asking(json!({"nvidia.com/gpu": "1"}))});
            async move {
                cluster
                    .pod(ns, &format!("pod-{i:04}"), spec)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Starts the scheduler with `config` and returns how long it took from the
/// first pod bound to the last, as the pod watch saw them.
async fn schedule(
    cluster: &mut Cluster,
    ns: &str,
    count: usize,
    config: &str,
) -> anyhow::Result<Duration> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let stream = watcher(pods, watcher::Config::default()).applied_objects();
    futures::pin_mut!(stream);
    cluster.start_scheduler(config)?;
    let mut bound: HashMap<String, Instant> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(900);
    while bound.len() < count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {count} pods bound",
            bound.len()
        );
        let next = tokio::time::timeout(Duration::from_secs(60), stream.try_next()).await;
        let Ok(Ok(Some(pod))) = next else {
            anyhow::bail!(
                "the pod watch stalled at {} of {count} bound:\n{}",
                bound.len(),
                cluster.logs()
            );
        };
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
        {
            bound
                .entry(pod.metadata.name.unwrap_or_default())
                .or_insert_with(Instant::now);
        }
    }
    cluster.scheduler = None;
    let first = bound.values().min().copied().unwrap_or_else(Instant::now);
    let last = bound.values().max().copied().unwrap_or(first);
    Ok(last - first)
}

/// The extender's exact answer times per verb (`GET /scheduler/latency`):
/// verb → (calls, p50, p99, max), in seconds.
async fn latencies(addr: &str) -> anyhow::Result<serde_json::Value> {
    let reply = support::http_get(addr, gkm_k8s_extender::LATENCY_PATH).await?;
    let body = reply
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .ok_or_else(|| anyhow::anyhow!("no body in the latency reply: {reply}"))?;
    Ok(serde_json::from_str(body)?)
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("n/a".into(), |s| format!("{:.3} ms", s * 1000.0))
}

fn rss(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.trim_start_matches(name).trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    format!("{} (peak {})", field("VmRSS:"), field("VmHWM:"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let extender = PathBuf::from(
        args.next()
            .ok_or_else(|| anyhow::anyhow!("usage: bench EXTENDER_BINARY [NODES] [PODS]"))?,
    );
    let nodes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let count: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(2000);

    let began = Instant::now();
    let mut cluster = Cluster::start().await?;
    create_nodes(&cluster, nodes).await?;
    for ns in ["bench-plain", "bench-gkm"] {
        cluster.namespace(ns).await?;
    }
    let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100", "namespace": "bench-gkm"},
        "spec": {"limits": [{"model": MODEL, "gpus": 100000}]},
    }))?;
    Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(cluster.client.clone(), "bench-gkm")
        .create(&PostParams::default(), &quota)
        .await?;
    eprintln!("== {nodes} kwok nodes up in {:.0?}", began.elapsed());

    create_pods(&cluster, "bench-plain", count).await?;
    let plain = schedule(&mut cluster, "bench-plain", count, PLAIN_SCHEDULER).await?;
    eprintln!("== without the extender: {count} pods in {plain:.2?}");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "bench-plain");
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await?;
    while !pods
        .list(&ListParams::default().limit(1))
        .await?
        .items
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    cluster.start_extender_from(&extender).await?;
    create_pods(&cluster, "bench-gkm", count).await?;
    let config = support::scheduler_config(&cluster.extender_addr)?;
    let with = schedule(&mut cluster, "bench-gkm", count, &config).await?;
    eprintln!("== with the extender: {count} pods in {with:.2?}");

    let latency = latencies(&cluster.extender_addr).await?;
    let pid = cluster
        .extender
        .as_ref()
        .map(|p| p.pid())
        .unwrap_or_default();
    let per_second =
        |d: Duration| count.saturating_sub(1) as f64 / d.as_secs_f64().max(f64::EPSILON);
    println!("nodes {nodes}, GPU pods {count}");
    println!(
        "without extender: {:8.1} pods/s ({plain:.2?})",
        per_second(plain)
    );
    println!(
        "with extender:    {:8.1} pods/s ({with:.2?})",
        per_second(with)
    );
    println!(
        "time ratio (with / without): {:.2}x (target <= 1.30x)",
        with.as_secs_f64() / plain.as_secs_f64().max(f64::EPSILON)
    );
    println!("extender answer times (exact, measured in the extender):");
    for verb in ["filter", "prioritize", "bind"] {
        let v = &latency[verb];
        println!(
            "{verb:<10} calls {:>6}  p50 {}  p99 {}  max {}",
            v["count"].as_u64().unwrap_or(0),
            ms(v["p50"].as_f64()),
            ms(v["p99"].as_f64()),
            ms(v["max"].as_f64())
        );
    }
    let filter_p99 = latency["filter"]["p99"].as_f64().unwrap_or(f64::INFINITY);
    println!(
        "filter p99 {} (target < 5 ms: {})",
        ms(Some(filter_p99)),
        if filter_p99 < 0.005 { "met" } else { "missed" }
    );
    println!("extender RSS: {}", rss(pid));
    Ok(())
}
