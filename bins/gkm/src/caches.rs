//! `gkm caches`: the caches of a cluster and whether they are used, as
//! their statuses say (the operator rolls the node reports up into them):
//! per cache its state, digest, the nodes serving it and the pods on it, and
//! per workload counted on a writable view its hit ratio and misses: the
//! table the `gkm-caches` dashboard draws.

use std::path::PathBuf;
use std::process::ExitCode;

use gkm_k8s_api::crd::{CacheStatus, ClusterGKMCache, GKMCache, WorkloadUsage};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;

/// Arguments of `gkm caches`.
#[derive(clap::Args)]
pub struct Args {
    /// The kubeconfig (default: `KUBECONFIG`, `~/.kube/config`, or the
    /// pod's service account).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Only the GKMCaches of this namespace (no ClusterGKMCache).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Print the rows as JSON.
    #[arg(long)]
    json: bool,
}

/// One row: a cache, and one workload counted on it (none when no
/// writable view of its digest ended yet).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The cache's namespace; empty for a `ClusterGKMCache`.
    pub namespace: String,
    /// The cache's name.
    pub cache: String,
    /// Its status' state (`Pending` before one is written).
    pub state: String,
    /// The digest it resolved to.
    pub digest: Option<String>,
    /// Nodes where it is extracted (in use or not).
    pub nodes_serving: i32,
    /// Nodes that reported it.
    pub nodes: i32,
    /// Pods mounting it.
    pub pods: i32,
    /// The workload counted (`ml/Deployment/vllm`).
    pub workload: Option<String>,
    /// The share of the workload's counted pods that compiled nothing.
    pub hit_ratio: Option<f64>,
    /// The entries its last pod compiled: the cache's misses for it.
    pub new_entries: Option<i64>,
    /// The entries the delivered tree holds.
    pub entries_delivered: Option<i64>,
}

/// The share of `usage`'s counted pods that compiled nothing the cache did
/// not hold; `None` before any was counted.
pub fn hit_ratio(usage: &WorkloadUsage) -> Option<f64> {
    (usage.pods_ended > 0).then(|| {
        f64::from(usage.pods_ended - usage.pods_compiling.min(usage.pods_ended))
            / f64::from(usage.pods_ended)
    })
}

/// The rows of cache `name` in `namespace` (empty: cluster-scoped) whose
/// status is `status`: one per workload its status lists, or one.
pub fn rows(namespace: &str, name: &str, status: Option<&CacheStatus>) -> Vec<Row> {
    let counts = status.map(|s| s.counts).unwrap_or_default();
    let cache = Row {
        namespace: namespace.to_string(),
        cache: name.to_string(),
        state: status
            .and_then(|s| s.state)
            .unwrap_or_default()
            .as_str()
            .to_string(),
        digest: status.and_then(|s| s.resolved_digest.clone()),
        nodes_serving: counts.node_in_use_cnt + counts.node_not_in_use_cnt,
        nodes: counts.node_cnt,
        pods: counts.pod_running_cnt,
        workload: None,
        hit_ratio: None,
        new_entries: None,
        entries_delivered: None,
    };
    let workloads = status
        .and_then(|s| s.workloads.as_deref())
        .unwrap_or_default();
    if workloads.is_empty() {
        return vec![cache];
    }
    workloads
        .iter()
        .map(|w| Row {
            workload: Some(format!("{}/{}", w.namespace, w.workload)),
            hit_ratio: hit_ratio(w),
            new_entries: Some(w.new_entries),
            entries_delivered: w.entries_delivered,
            ..cache.clone()
        })
        .collect()
}

/// The rows as a table, a row a line under the header.
pub fn table(rows: &[Row]) -> String {
    let dash = || "-".to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                if r.namespace.is_empty() {
                    dash()
                } else {
                    r.namespace.clone()
                },
                r.cache.clone(),
                r.state.clone(),
                r.digest
                    .as_deref()
                    .map(|d| d.trim_start_matches("sha256:").chars().take(12).collect())
                    .unwrap_or_else(dash),
                format!("{}/{}", r.nodes_serving, r.nodes),
                r.pods.to_string(),
                r.workload.clone().unwrap_or_else(dash),
                r.hit_ratio
                    .map(|h| format!("{:.0}%", h * 100.0))
                    .unwrap_or_else(dash),
                r.new_entries.map(|n| n.to_string()).unwrap_or_else(dash),
                r.entries_delivered
                    .map(|n| n.to_string())
                    .unwrap_or_else(dash),
            ]
        })
        .collect();
    let mut out = String::new();
    gkm_gpu::report::table(
        &mut out,
        &[
            "NAMESPACE",
            "CACHE",
            "STATE",
            "DIGEST",
            "NODES",
            "PODS",
            "WORKLOAD",
            "HITS",
            "NEW",
            "DELIVERED",
        ],
        &cells,
    );
    out
}

/// Lists the caches and prints their rows.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let client = gkm_k8s_runtime::client::connect(args.kubeconfig.as_deref()).await?;
    let mut all = Vec::new();
    let (api, scope): (Api<GKMCache>, String) = match &args.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            format!("namespace {ns}"),
        ),
        None => (Api::all(client.clone()), "every namespace".into()),
    };
    let listed: Vec<GKMCache> = api
        .list(&ListParams::default())
        .await
        .map_err(|e| listing_failed("GKMCaches", &scope, e))?
        .items;
    for cache in &listed {
        all.extend(rows(
            &cache.namespace().unwrap_or_default(),
            &cache.name_any(),
            cache.status.as_ref(),
        ));
    }
    if args.namespace.is_none() {
        let cluster: Vec<ClusterGKMCache> = Api::all(client)
            .list(&ListParams::default())
            .await
            .map_err(|e| listing_failed("ClusterGKMCaches", "the cluster", e))?
            .items;
        for cache in &cluster {
            all.extend(rows("", &cache.name_any(), cache.status.as_ref()));
        }
    }
    if args.json {
        crate::output::print(&all)?;
    } else {
        print!("{}", table(&all));
    }
    Ok(ExitCode::SUCCESS)
}

/// The sentence for a list the apiserver refused: what was listed where,
/// the apiserver's own words, and for a refusal, the narrower command a
/// tenant's role allows.
fn listing_failed(what: &str, scope: &str, error: kube::Error) -> anyhow::Error {
    match error {
        kube::Error::Api(status) if status.code == 403 => anyhow::anyhow!(
            "listing {what} in {scope} is forbidden: {}; `gkm caches -n NAMESPACE` lists the caches of a namespace your role can read",
            status.message
        ),
        kube::Error::Api(status) => {
            anyhow::anyhow!("listing {what} in {scope}: {}", status.message)
        }
        other => anyhow::Error::new(other).context(format!("listing {what} in {scope}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::CacheState;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_cache_is_a_row_per_workload_with_its_share_of_pods_served_whole() {
        let mut status = CacheStatus {
            state: Some(CacheState::Running),
            resolved_digest: Some(format!("sha256:{}", "ab".repeat(32))),
            ..CacheStatus::default()
        };
        status.counts.node_cnt = 3;
        status.counts.node_in_use_cnt = 1;
        status.counts.node_not_in_use_cnt = 1;
        status.counts.pod_running_cnt = 2;
        let epoch = Time(jiff::Timestamp::UNIX_EPOCH);
        status.workloads = Some(vec![
            WorkloadUsage {
                pods_ended: 4,
                pods_compiling: 1,
                new_entries: 2,
                entries_delivered: Some(40),
                ..WorkloadUsage::of("ml", "Deployment/vllm", "triton", epoch.clone())
            },
            WorkloadUsage::of("ml", "Job/warmup", "triton", epoch),
        ]);
        let rows = rows("ml", "kernels", Some(&status));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].hit_ratio, Some(0.75));
        assert_eq!(rows[1].hit_ratio, None);
        let text = table(&rows);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0][0], "NAMESPACE");
        assert_eq!(
            lines[1],
            [
                "ml",
                "kernels",
                "Running",
                "abababababab",
                "2/3",
                "2",
                "ml/Deployment/vllm",
                "75%",
                "2",
                "40"
            ]
        );
        assert_eq!(lines[2][6..], ["ml/Job/warmup", "-", "0", "-"]);
        // A cluster cache with no status yet: one row.
        let pending = super::rows("", "shared", None);
        assert_eq!(pending.len(), 1);
        assert_eq!(
            table(&pending)
                .lines()
                .nth(1)
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>(),
            [
                "-", "shared", "Pending", "-", "0/0", "0", "-", "-", "-", "-"
            ]
        );
    }
}
