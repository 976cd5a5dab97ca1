//! The operator's metrics: counters the reconciles bump, read at each scrape.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// Counters exported on `/metrics`.
#[derive(Default)]
pub struct Metrics {
    /// Reconciles run.
    pub reconciles: AtomicU64,
    /// Reconciles that failed.
    pub reconcile_errors: AtomicU64,
    /// Status writes made.
    pub status_writes: AtomicU64,
}

/// The operator's counters, read at each scrape. Under a `gkm` prefix they
/// read `gkm_operator_reconciles_total`, `gkm_operator_reconcile_errors_total`
/// and `gkm_operator_status_writes_total`.
#[derive(Clone)]
pub struct OperatorCollector(pub Arc<Metrics>);

impl fmt::Debug for OperatorCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OperatorCollector")
    }
}

impl Collector for OperatorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let m = &self.0;
        for (name, help, value) in [
            (
                "operator_reconciles",
                "Reconciles of GKMCaches and ClusterGKMCaches run",
                &m.reconciles,
            ),
            (
                "operator_reconcile_errors",
                "Reconciles that ended in an error",
                &m.reconcile_errors,
            ),
            (
                "operator_status_writes",
                "Status writes made to caches",
                &m.status_writes,
            ),
        ] {
            let metric = ConstCounter::new(value.load(Ordering::Relaxed));
            let out = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(out)?;
        }
        Ok(())
    }
}
