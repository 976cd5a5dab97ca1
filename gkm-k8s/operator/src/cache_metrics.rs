//! Per-cache figures the operator serves on `/metrics`, read at each scrape
//! from the caches its controllers hold (their statuses, which roll the
//! node reports up): what the `gkm-caches` dashboard draws.
//!
//! - `gkm_operator_cache_nodes{namespace,cache,state}`: nodes by what the
//!   cache is on them: `in_use` (extracted, a pod mounts it), `idle`
//!   (extracted, no pod), `error`, `incompatible`;
//! - `gkm_operator_cache_pods{namespace,cache}`: pods mounting it;
//! - `gkm_operator_cache_workload_pods_ended{namespace,cache,workload_namespace,workload}`
//!   and `…_pods_compiling`: a workload's pods whose writable view ended and
//!   was counted, and of them those that compiled anything (so
//!   `1 - compiling / ended` is the share of its pods the cache served
//!   whole);
//! - `gkm_operator_cache_workload_new_entries{…}` and
//!   `…_entries_delivered{…}`: what its last pod compiled (the cache's
//!   misses for it) and what the delivered tree holds.
//!
//! `namespace` is the cache's (empty for a `ClusterGKMCache`); a cache's
//! status lists at most 8 workloads, so the series are bounded by the
//! caches. Read-only volumes, PVCs and image volumes cannot see misses: a
//! workload reading only those has no workload series.

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use gkm_k8s_api::crd::{CacheCounts, CacheState, CacheStatus, WorkloadUsage};

/// What one cache's status says, for its series.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheFigures {
    /// The cache's namespace; empty for a `ClusterGKMCache`.
    pub namespace: String,
    /// The cache's name.
    pub name: String,
    /// Its `status.state`, `None` when not written yet.
    pub state: Option<CacheState>,
    /// Its node and pod counts.
    pub counts: CacheCounts,
    /// What its workloads compiled.
    pub workloads: Vec<WorkloadUsage>,
}

impl CacheFigures {
    /// The figures of cache `name` in `namespace` (none: cluster-scoped)
    /// whose status is `status`.
    pub fn of(namespace: Option<&str>, name: &str, status: Option<&CacheStatus>) -> CacheFigures {
        CacheFigures {
            namespace: namespace.unwrap_or_default().to_string(),
            name: name.to_string(),
            state: status.and_then(|s| s.state),
            counts: status.map(|s| s.counts).unwrap_or_default(),
            workloads: status.and_then(|s| s.workloads.clone()).unwrap_or_default(),
        }
    }

    /// Its nodes by state, every state listed.
    fn nodes(&self) -> [(&'static str, i32); 4] {
        let c = &self.counts;
        [
            ("in_use", c.node_in_use_cnt),
            ("idle", c.node_not_in_use_cnt),
            ("error", c.node_error_cnt),
            ("incompatible", c.node_incompatible_cnt),
        ]
    }
}

/// The labels of one series.
type Labels = Vec<(&'static str, String)>;

/// One gauge family: its name (after the `gkm_` prefix), help, and each
/// series' labels and value.
fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[(Labels, i64)],
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ConstGauge::new(*value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The families of a workload's series: name, help.
const WORKLOAD_FAMILIES: [(&str, &str); 4] = [
    (
        "operator_cache_workload_pods_ended",
        "A workload's pods whose writable view of a cache ended and was counted",
    ),
    (
        "operator_cache_workload_pods_compiling",
        "Of those, the pods that compiled at least one entry the cache did not hold",
    ),
    (
        "operator_cache_workload_new_entries",
        "The entries a workload's last pod compiled: the cache's misses for it",
    ),
    (
        "operator_cache_workload_entries_delivered",
        "The entries the tree delivered to a workload holds",
    ),
];

/// A workload's values, in [`WORKLOAD_FAMILIES`]' order (none where it
/// was not counted).
fn workload_values(w: &WorkloadUsage) -> [Option<i64>; 4] {
    [
        Some(i64::from(w.pods_ended)),
        Some(i64::from(w.pods_compiling)),
        Some(w.new_entries),
        w.entries_delivered,
    ]
}

/// Encodes the per-cache families of `caches`.
pub(crate) fn encode(encoder: &mut DescriptorEncoder, caches: &[CacheFigures]) -> std::fmt::Result {
    let mut nodes = Vec::new();
    let mut pods = Vec::new();
    let mut workloads: [Vec<(Labels, i64)>; 4] = Default::default();
    for c in caches {
        let cache: Labels = vec![
            ("namespace", c.namespace.clone()),
            ("cache", c.name.clone()),
        ];
        for (state, count) in c.nodes() {
            let mut labels = cache.clone();
            labels.push(("state", state.to_string()));
            nodes.push((labels, i64::from(count)));
        }
        pods.push((cache.clone(), i64::from(c.counts.pod_running_cnt)));
        for w in &c.workloads {
            let mut labels = cache.clone();
            labels.push(("workload_namespace", w.namespace.clone()));
            labels.push(("workload", w.workload.clone()));
            for (series, value) in workloads.iter_mut().zip(workload_values(w)) {
                if let Some(value) = value {
                    series.push((labels.clone(), value));
                }
            }
        }
    }
    gauges(
        encoder,
        "operator_cache_nodes",
        "Nodes by what a cache is on them: in_use, idle, error, incompatible",
        &nodes,
    )?;
    gauges(
        encoder,
        "operator_cache_pods",
        "Pods mounting a cache",
        &pods,
    )?;
    for ((name, help), series) in WORKLOAD_FAMILIES.iter().zip(&workloads) {
        gauges(encoder, name, help, series)?;
    }
    Ok(())
}
