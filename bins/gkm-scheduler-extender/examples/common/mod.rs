//! What the extender's benchmarks share: kwok GPU nodes, pods made in bulk,
//! kube-scheduler timed while it places them, and the quota that lets the
//! extender place GPU pods.

#![allow(dead_code)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use crate::support::Cluster;

/// The GPU model of every node (its `gkm.io/gpu.product` label).
pub const MODEL: &str = "NVIDIA-A100-SXM4-80GB";

/// The GPUs of every node (`nvidia.com/gpu` capacity, devices in its pool).
pub const GPUS_PER_NODE: usize = 8;

/// How many API requests the benchmark keeps in flight when it makes objects.
const IN_FLIGHT: usize = 16;

/// A kwok node made by [`create_nodes`].
pub struct BenchNode {
    /// Its name.
    pub name: String,
    /// Its UID (what owner references name).
    pub uid: String,
}

/// Makes `count` kwok nodes `gpu-NNNN` with [`GPUS_PER_NODE`] `nvidia.com/gpu`
/// of [`MODEL`] each.
pub async fn create_nodes(cluster: &Cluster, count: usize) -> anyhow::Result<Vec<BenchNode>> {
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    futures::stream::iter(0..count)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110",
                                       "nvidia.com/gpu": GPUS_PER_NODE.to_string()});
                let name = format!("gpu-{i:04}");
                let node: Node = serde_json::from_value(json!({
                    "metadata": {
                        "name": name,
                        "labels": {"gkm.io/gpu.product": MODEL, "type": "kwok",
                                   "kubernetes.io/hostname": name},
                        "annotations": {gkm_testenv::KWOK_NODE_ANNOTATION: "fake"},
                    },
                    "status": {"capacity": resources, "allocatable": resources},
                }))?;
                let made = nodes.create(&PostParams::default(), &node).await?;
                anyhow::Ok(BenchNode {
                    name,
                    uid: made.metadata.uid.unwrap_or_default(),
                })
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await
}

/// Makes pods `pod-NNNN` in `ns`, `count` of them, with the pod spec
/// `spec` (see [`Cluster::pod`]).
pub async fn create_pods(
    cluster: &Cluster,
    ns: &str,
    count: usize,
    spec: &Value,
) -> anyhow::Result<()> {
    futures::stream::iter(0..count)
        .map(|i| async move {
            cluster
                .pod(ns, &format!("pod-{i:04}"), spec.clone())
                .await
                .map(|_| ())
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Deletes every pod of `ns` and waits until they are gone.
pub async fn delete_pods(cluster: &Cluster, ns: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
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
    Ok(())
}

/// A GKMGPUQuota in `ns` that no benchmark reaches: the extender places
/// GPU pods of namespaces with a quota for their model.
pub async fn allow_gpus(cluster: &Cluster, ns: &str) -> anyhow::Result<()> {
    let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100", "namespace": ns},
        "spec": {"limits": [{"model": MODEL, "gpus": 100000}]},
    }))?;
    Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &quota)
        .await?;
    Ok(())
}

/// How kube-scheduler did placing a set of pods.
pub struct Scheduled {
    /// From the first pod bound to the last, as the pod watch saw them.
    pub elapsed: Duration,
    /// The pods bound.
    pub pods: usize,
    /// kube-scheduler's CPU time (user and system) from the first pod bound
    /// to the last.
    pub cpu_seconds: f64,
    /// kube-scheduler's CPU time from its start (its informers' first lists
    /// included) to the last pod bound.
    pub cpu_seconds_total: f64,
}

impl Scheduled {
    /// Pods bound per second (the first bind starts the clock).
    pub fn per_second(&self) -> f64 {
        self.pods.saturating_sub(1) as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    /// The figures as JSON.
    pub fn json(&self) -> Value {
        json!({
            "pods": self.pods,
            "seconds": self.elapsed.as_secs_f64(),
            "pods_per_second": self.per_second(),
            "scheduler_cpu_seconds": self.cpu_seconds,
            "scheduler_cpu_seconds_since_start": self.cpu_seconds_total,
        })
    }
}

/// Starts kube-scheduler with `config`, waits until the `count` pods of
/// `ns` are bound, and stops it.
pub async fn schedule(
    cluster: &mut Cluster,
    ns: &str,
    count: usize,
    config: &str,
) -> anyhow::Result<Scheduled> {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let stream = watcher(pods, watcher::Config::default()).applied_objects();
    futures::pin_mut!(stream);
    cluster.start_scheduler(config)?;
    let pid = cluster
        .scheduler
        .as_ref()
        .map(|s| s.pid())
        .ok_or_else(|| anyhow::anyhow!("kube-scheduler did not start"))?;
    let mut bound: HashMap<String, Instant> = HashMap::new();
    let mut cpu_at_first_bind = None;
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
            if cpu_at_first_bind.is_none() {
                cpu_at_first_bind = Some(gkm_testenv::cpu_seconds(pid)?);
            }
            bound
                .entry(pod.metadata.name.unwrap_or_default())
                .or_insert_with(Instant::now);
        }
    }
    let cpu_seconds_total = gkm_testenv::cpu_seconds(pid)?;
    cluster.scheduler = None;
    let first = bound.values().min().copied().unwrap_or_else(Instant::now);
    let last = bound.values().max().copied().unwrap_or(first);
    Ok(Scheduled {
        elapsed: last - first,
        pods: count,
        cpu_seconds: cpu_seconds_total - cpu_at_first_bind.unwrap_or(cpu_seconds_total),
        cpu_seconds_total,
    })
}
