//! The operator's metrics, as the reconciles record them and each scrape
//! reads them. Under a `gkm` prefix:
//!
//! - `gkm_operator_reconciles_total{controller}`: reconciles run;
//! - `gkm_operator_reconcile_errors_total{controller,error}`: those that
//!   failed, by [`error_kind`];
//! - `gkm_operator_reconcile_duration_seconds{controller}`: how long each took;
//! - `gkm_operator_caches{state}`: caches by the state their status shows,
//!   counted at scrape time from the controllers' caches, and each cache's
//!   nodes, pods and workloads ([`crate::cache_metrics`]);
//! - `gkm_operator_registry_requests_total{operation,outcome}` and
//!   `gkm_operator_registry_request_duration_seconds{operation,outcome}`:
//!   tag resolutions (`resolve`), signature checks (`verify`) and reads of
//!   an image's variants (`variants`);
//! - `gkm_operator_status_writes_total`: status writes made;
//! - `gkm_operator_release_writes_total`: release writes made (what the
//!   agents watch).
//!
//! `controller` is `gkmcache`, `clustergkmcache` or `gkmcachecapture`
//! ([`ControllerKind`]); every label takes values from a small fixed set.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;

use crate::cache_metrics::CacheFigures;
use crate::error::Error;
use gkm_k8s_api::cache_object::Scope;
use gkm_k8s_api::crd::CacheState;

/// Which controller a reconcile metric is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerKind {
    /// The cache controller of `GKMCache`s or `ClusterGKMCache`s.
    Cache(Scope),
    /// The capture controller of `GKMCacheCapture`s.
    Capture,
}

impl ControllerKind {
    /// Its `controller` label: `gkmcache`, `clustergkmcache` or
    /// `gkmcachecapture`.
    pub fn label(self) -> &'static str {
        match self {
            ControllerKind::Cache(Scope::Namespaced) => "gkmcache",
            ControllerKind::Cache(Scope::Cluster) => "clustergkmcache",
            ControllerKind::Capture => "gkmcachecapture",
        }
    }
}

impl From<Scope> for ControllerKind {
    fn from(scope: Scope) -> ControllerKind {
        ControllerKind::Cache(scope)
    }
}

/// What kind of failure an error is, for the `error` label: `kube`,
/// `registry`, `invalid_spec`, `waiting`, `panicked` or `other`.
pub fn error_kind(error: &Error) -> &'static str {
    match error {
        Error::Kube(_) | Error::Finalizer(_) | Error::NotWatched(_) => "kube",
        Error::Oci(_) => "registry",
        Error::InvalidSpec(_) => "invalid_spec",
        Error::WaitingForNodes(_) => "waiting",
        Error::Panicked(_) => "panicked",
        Error::Io { .. } | Error::Json(_) => "other",
    }
}

/// A registry request the operator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryOperation {
    /// Resolving a tag to a digest.
    Resolve,
    /// Reading an image's signatures to verify them.
    Verify,
    /// Reading an image's manifest for the targets its variants fit.
    Variants,
}

impl RegistryOperation {
    fn label(self) -> &'static str {
        match self {
            RegistryOperation::Resolve => "resolve",
            RegistryOperation::Verify => "verify",
            RegistryOperation::Variants => "variants",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    controller: &'static str,
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RegistryLabels {
    operation: &'static str,
    outcome: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latencies from 5 ms to about 20 s.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

/// The figures of every cache one controller holds, read at each scrape.
type FigureSource = Box<dyn Fn() -> Vec<CacheFigures> + Send + Sync>;

/// The operator's metrics; clones of the `Arc` record into the same series.
pub struct Metrics {
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histograms<ControllerLabels>,
    registry_requests: Family<RegistryLabels, Counter>,
    registry_duration: Histograms<RegistryLabels>,
    status_writes: Counter,
    release_writes: Counter,
    caches: Mutex<Vec<FigureSource>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let metrics = Metrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(seconds_histogram),
            registry_requests: Family::default(),
            registry_duration: Family::new_with_constructor(seconds_histogram),
            status_writes: Counter::default(),
            release_writes: Counter::default(),
            caches: Mutex::new(Vec::new()),
        };
        // Both cache controllers' series exist from the start, at zero.
        for scope in [Scope::Namespaced, Scope::Cluster] {
            let labels = ControllerLabels {
                controller: ControllerKind::Cache(scope).label(),
            };
            let _ = metrics.reconciles.get_or_create(&labels);
            let _ = metrics.reconcile_duration.get_or_create(&labels);
        }
        metrics
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// Records one reconcile by `controller` (a cache controller's
    /// [`Scope`] or [`ControllerKind::Capture`]): how long it took and, when
    /// it failed, why.
    pub fn reconciled(
        &self,
        controller: impl Into<ControllerKind>,
        took: Duration,
        error: Option<&Error>,
    ) {
        let controller = controller.into().label();
        let labels = ControllerLabels { controller };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(error) = error {
            self.reconcile_errors
                .get_or_create(&ErrorLabels {
                    controller,
                    error: error_kind(error),
                })
                .inc();
        }
    }

    /// Records one registry request, its outcome and how long it took.
    pub fn registry_request(&self, operation: RegistryOperation, ok: bool, took: Duration) {
        let labels = RegistryLabels {
            operation: operation.label(),
            outcome: if ok { "ok" } else { "error" },
        };
        self.registry_requests.get_or_create(&labels).inc();
        self.registry_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records one status write.
    pub fn status_written(&self) {
        self.status_writes.inc();
    }

    /// Records one release write.
    pub fn release_written(&self) {
        self.release_writes.inc();
    }

    /// Release writes made so far.
    pub fn release_writes(&self) -> u64 {
        self.release_writes.get()
    }

    /// Status writes made so far.
    pub fn status_writes(&self) -> u64 {
        self.status_writes.get()
    }

    /// Reconciles run so far by `controller`.
    pub fn reconciles(&self, controller: impl Into<ControllerKind>) -> u64 {
        self.reconciles
            .get_or_create(&ControllerLabels {
                controller: controller.into().label(),
            })
            .get()
    }

    /// Reads the figures of the caches `caches` lists (their statuses) at
    /// each scrape: `gkm_operator_caches` and the per-cache families.
    pub fn count_caches(&self, caches: impl Fn() -> Vec<CacheFigures> + Send + Sync + 'static) {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(caches));
    }

    /// Every cache's figures, from every source.
    fn cache_figures(&self) -> Vec<CacheFigures> {
        self.caches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flat_map(|source| source())
            .collect()
    }
}

/// The number of `caches` in each state, every state listed.
fn caches_by_state(caches: &[CacheFigures]) -> BTreeMap<&'static str, i64> {
    let mut out: BTreeMap<&'static str, i64> = STATES.iter().map(|s| (s.as_str(), 0)).collect();
    for cache in caches {
        *out.entry(cache.state.unwrap_or_default().as_str())
            .or_default() += 1;
    }
    out
}

/// Every state a cache's status can show.
const STATES: [CacheState; 9] = [
    CacheState::Pending,
    CacheState::Downloading,
    CacheState::Extracted,
    CacheState::Running,
    CacheState::Outdated,
    CacheState::Deleting,
    CacheState::Error,
    CacheState::NoNamespace,
    CacheState::Incompatible,
];

/// Encodes [`Metrics`] at each scrape; register it with
/// `registry.register_collector`.
#[derive(Clone)]
pub struct OperatorCollector(pub Arc<Metrics>);

impl fmt::Debug for OperatorCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorCollector")
    }
}

fn encode(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> fmt::Result {
    let out = encoder.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(out)
}

impl Collector for OperatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let m = &self.0;
        let e = &mut encoder;
        encode(
            e,
            "operator_reconciles",
            "Reconciles of GKMCaches and ClusterGKMCaches run",
            None,
            &m.reconciles,
        )?;
        encode(
            e,
            "operator_reconcile_errors",
            "Reconciles that ended in an error, by kind of error",
            None,
            &m.reconcile_errors,
        )?;
        encode(
            e,
            "operator_reconcile_duration",
            "How long reconciles took",
            Some(&Unit::Seconds),
            &m.reconcile_duration,
        )?;
        encode(
            e,
            "operator_status_writes",
            "Status writes made to caches",
            None,
            &m.status_writes,
        )?;
        encode(
            e,
            "operator_release_writes",
            "Release writes made (what the agents watch)",
            None,
            &m.release_writes,
        )?;
        encode(
            e,
            "operator_registry_requests",
            "Registry requests: tag resolutions, signature checks and variant reads",
            None,
            &m.registry_requests,
        )?;
        encode(
            e,
            "operator_registry_request_duration",
            "How long registry requests took",
            Some(&Unit::Seconds),
            &m.registry_duration,
        )?;
        let caches = m.cache_figures();
        let by_state = caches_by_state(&caches);
        let out = e.encode_descriptor(
            "operator_caches",
            "Caches by the state their status shows",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let mut out = out;
        for (state, count) in by_state {
            let gauge = ConstGauge::new(count);
            gauge.encode(out.encode_family(&[("state", state)])?)?;
        }
        crate::cache_metrics::encode(e, &caches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CacheStatus, WorkloadUsage};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use prometheus_client::registry::Registry;

    fn scrape(metrics: &Arc<Metrics>) -> String {
        let mut registry = Registry::with_prefix("gkm");
        registry.register_collector(Box::new(OperatorCollector(metrics.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn series_carry_their_controller_error_kind_and_operation() {
        let metrics = Arc::new(Metrics::default());
        metrics.reconciled(Scope::Namespaced, Duration::from_millis(20), None);
        metrics.reconciled(
            Scope::Cluster,
            Duration::from_millis(5),
            Some(&Error::WaitingForNodes("n".into())),
        );
        metrics.registry_request(RegistryOperation::Resolve, true, Duration::from_millis(3));
        metrics.registry_request(RegistryOperation::Verify, false, Duration::from_secs(1));
        metrics.status_written();
        metrics.release_written();
        metrics.count_caches(|| {
            let status = |state| CacheStatus {
                state: Some(state),
                ..CacheStatus::default()
            };
            let mut served =
                CacheFigures::of(Some("ml"), "kernels", Some(&status(CacheState::Running)));
            served.counts.node_in_use_cnt = 2;
            served.counts.node_incompatible_cnt = 1;
            served.counts.pod_running_cnt = 3;
            served.workloads = vec![WorkloadUsage {
                pods_ended: 4,
                pods_compiling: 1,
                new_entries: 2,
                entries_delivered: Some(40),
                ..WorkloadUsage::of(
                    "ml",
                    "Deployment/vllm",
                    "triton",
                    Time(jiff::Timestamp::UNIX_EPOCH),
                )
            }];
            vec![
                served,
                CacheFigures::of(None, "pending", None),
                CacheFigures::of(None, "shared", Some(&status(CacheState::Running))),
            ]
        });
        let text = scrape(&metrics);
        for line in [
            "gkm_operator_reconciles_total{controller=\"gkmcache\"} 1",
            "gkm_operator_reconciles_total{controller=\"clustergkmcache\"} 1",
            "gkm_operator_reconcile_errors_total{controller=\"clustergkmcache\",error=\"waiting\"} 1",
            "gkm_operator_reconcile_duration_seconds_count{controller=\"gkmcache\"} 1",
            "gkm_operator_registry_requests_total{operation=\"resolve\",outcome=\"ok\"} 1",
            "gkm_operator_registry_requests_total{operation=\"verify\",outcome=\"error\"} 1",
            "gkm_operator_registry_request_duration_seconds_count{operation=\"verify\",outcome=\"error\"} 1",
            "gkm_operator_status_writes_total 1",
            "gkm_operator_release_writes_total 1",
            "gkm_operator_caches{state=\"Running\"} 2",
            "gkm_operator_caches{state=\"Pending\"} 1",
            "gkm_operator_caches{state=\"Error\"} 0",
            "gkm_operator_cache_nodes{namespace=\"ml\",cache=\"kernels\",state=\"in_use\"} 2",
            "gkm_operator_cache_nodes{namespace=\"ml\",cache=\"kernels\",state=\"incompatible\"} 1",
            "gkm_operator_cache_nodes{namespace=\"\",cache=\"shared\",state=\"idle\"} 0",
            "gkm_operator_cache_pods{namespace=\"ml\",cache=\"kernels\"} 3",
            "gkm_operator_cache_workload_pods_ended{namespace=\"ml\",cache=\"kernels\",workload_namespace=\"ml\",workload=\"Deployment/vllm\"} 4",
            "gkm_operator_cache_workload_pods_compiling{namespace=\"ml\",cache=\"kernels\",workload_namespace=\"ml\",workload=\"Deployment/vllm\"} 1",
            "gkm_operator_cache_workload_new_entries{namespace=\"ml\",cache=\"kernels\",workload_namespace=\"ml\",workload=\"Deployment/vllm\"} 2",
            "gkm_operator_cache_workload_entries_delivered{namespace=\"ml\",cache=\"kernels\",workload_namespace=\"ml\",workload=\"Deployment/vllm\"} 40",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn every_error_has_a_kind_from_the_fixed_set() {
        let kinds = [
            "kube",
            "registry",
            "invalid_spec",
            "waiting",
            "panicked",
            "other",
        ];
        for error in [
            Error::Finalizer("f".into()),
            Error::InvalidSpec("s".into()),
            Error::WaitingForNodes("w".into()),
            Error::Panicked("p".into()),
            Error::Json(serde_json::from_str::<u8>("x").unwrap_err()),
        ] {
            assert!(kinds.contains(&error_kind(&error)), "{error}");
        }
        assert_eq!(error_kind(&Error::Panicked("p".into())), "panicked");
    }
}
