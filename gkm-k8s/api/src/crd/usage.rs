//! What the workloads on a cache compiled into their writable views: the
//! cache's misses, per workload, as node reports carry them
//! ([`NodeCacheStatus::workloads`](super::NodeCacheStatus::workloads)) and
//! a cache's status rolls them up
//! ([`CacheStatus::workloads`](super::CacheStatus::workloads)).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What one workload's pods compiled into their writable views of one
/// digest, the entries the cache did not hold for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadUsage {
    /// The pods' namespace.
    pub namespace: String,
    /// The workload, `Kind/name`: the pods' controller, a ReplicaSet's
    /// Deployment, a Job's CronJob (`Deployment/vllm`, `Job/warmup`), or
    /// `Pod/name` for a pod of its own.
    #[schemars(length(max = 320))]
    pub workload: String,
    /// The cache's kind (`triton`, `vllm`, `inductor`…), by whose rules the
    /// entries were counted.
    pub kind: String,
    /// Its pods whose writable view ended and was counted.
    pub pods_ended: i32,
    /// Of them, the pods that compiled at least one new entry.
    pub pods_compiling: i32,
    /// The entries the delivered tree holds, by the kind's rules (absent
    /// when it could not be counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries_delivered: Option<i64>,
    /// The new entries its last pod compiled: its misses.
    pub new_entries: i64,
    /// The first of them, by kernel (or graph) name, or key when the files
    /// name none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub new_entry_names: Vec<String>,
    /// Why its last pod's new entries missed: the first distinct sentences
    /// of `gkm explain`, each saying what to change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub reasons: Vec<String>,
    /// When its last pod's view ended.
    pub last_ended: Time,
    /// The nodes whose reports counted its pods (a cache's status only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i32>,
}

impl WorkloadUsage {
    /// `workload` of `namespace` with nothing counted yet, on a cache of
    /// `kind`, as of `last_ended`: the counts are filled in by struct update.
    ///
    /// ```
    /// use gkm_k8s_api::crd::WorkloadUsage;
    /// use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    /// let usage = WorkloadUsage {
    ///     new_entries: 2,
    ///     ..WorkloadUsage::of("ml", "Job/warmup", "triton", Time(jiff::Timestamp::UNIX_EPOCH))
    /// };
    /// assert_eq!((usage.pods_ended, usage.new_entries), (0, 2));
    /// ```
    pub fn of(namespace: &str, workload: &str, kind: &str, last_ended: Time) -> WorkloadUsage {
        WorkloadUsage {
            namespace: namespace.into(),
            workload: workload.into(),
            kind: kind.into(),
            pods_ended: 0,
            pods_compiling: 0,
            entries_delivered: None,
            new_entries: 0,
            new_entry_names: Vec::new(),
            reasons: Vec::new(),
            last_ended,
            nodes: None,
        }
    }
}
