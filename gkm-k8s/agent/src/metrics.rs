//! The agent's cache-delivery metrics: what its store holds, how its
//! extractions and image reads go, and how long its passes take.
//!
//! Register them in the `/metrics` registry (prefix `gkm`) before the agent
//! starts; clones share the values:
//!
//! ```
//! use gkm_k8s_agent::AgentMetrics;
//! use prometheus_client::registry::Registry;
//!
//! let metrics = AgentMetrics::default();
//! let mut registry = Registry::with_prefix("gkm");
//! metrics.register(&mut registry);
//! ```

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

/// How a step ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

const SUCCEEDED: Outcome = Outcome {
    outcome: "succeeded",
};
const FAILED: Outcome = Outcome { outcome: "failed" };

/// Why an extraction gave its slot up.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

fn outcome(ok: bool) -> Outcome {
    if ok { SUCCEEDED } else { FAILED }
}

/// Extraction times: 0.1 s to about 27 minutes.
fn extraction_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 15))
}

/// Pass times: 1 ms to about 16 s.
fn pass_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The agent's counters, gauges and histograms.
#[derive(Clone)]
pub struct AgentMetrics {
    extractions: Family<Outcome, Counter>,
    extraction_seconds: Histogram,
    slot_yields: Family<Reason, Counter>,
    passes: Family<Outcome, Counter>,
    pass_seconds: Histogram,
    store_bytes: Gauge<i64, AtomicI64>,
    store_images: Gauge<i64, AtomicI64>,
    store_quarantined: Counter,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics {
            extractions: Family::default(),
            extraction_seconds: extraction_histogram(),
            slot_yields: Family::default(),
            passes: Family::default(),
            pass_seconds: pass_histogram(),
            store_bytes: Gauge::default(),
            store_images: Gauge::default(),
            store_quarantined: Counter::default(),
        }
    }
}

impl AgentMetrics {
    /// Adds every metric to `registry` (names below assume its `gkm` prefix):
    /// `gkm_agent_extractions_total{outcome}`,
    /// `gkm_agent_extraction_duration_seconds`,
    /// `gkm_agent_extraction_slot_yields_total{reason}`,
    /// `gkm_agent_sync_passes_total{outcome}`,
    /// `gkm_agent_sync_duration_seconds`, `gkm_agent_store_bytes`,
    /// `gkm_agent_store_images` and `gkm_agent_store_quarantined_total`.
    pub fn register(&self, registry: &mut Registry) {
        let agent = registry.sub_registry_with_prefix("agent");
        agent.register(
            "extractions",
            "Image pulls and extractions into the node's store, by outcome",
            self.extractions.clone(),
        );
        agent.register_with_unit(
            "extraction_duration",
            "Time to pull and extract one image, successful or not",
            Unit::Seconds,
            self.extraction_seconds.clone(),
        );
        agent.register(
            "extraction_slot_yields",
            "Extractions that gave their slot up to waiting ones, cancelled to be tried again later, by reason",
            self.slot_yields.clone(),
        );
        agent.register(
            "sync_passes",
            "Passes over every cache on this node, by outcome",
            self.passes.clone(),
        );
        agent.register_with_unit(
            "sync_duration",
            "Time one pass over every cache on this node takes",
            Unit::Seconds,
            self.pass_seconds.clone(),
        );
        agent.register_with_unit(
            "store",
            "Bytes of extracted caches in the node's store",
            Unit::Bytes,
            self.store_bytes.clone(),
        );
        agent.register(
            "store_images",
            "Image digests extracted in the node's store",
            self.store_images.clone(),
        );
        agent.register(
            "store_quarantined",
            "Store entries taken out of service because their tree was unsealed or changed since extraction",
            self.store_quarantined.clone(),
        );
    }

    /// One extraction ended after `took`.
    pub(super) fn extraction(&self, ok: bool, took: Duration) {
        self.extractions.get_or_create(&outcome(ok)).inc();
        self.extraction_seconds.observe(took.as_secs_f64());
    }

    /// One extraction gave its slot up for `reason`.
    pub(super) fn slot_yielded(&self, reason: &'static str) {
        self.slot_yields.get_or_create(&Reason { reason }).inc();
    }

    /// One pass ended after `took`.
    pub(super) fn pass(&self, ok: bool, took: Duration) {
        self.passes.get_or_create(&outcome(ok)).inc();
        self.pass_seconds.observe(took.as_secs_f64());
    }

    /// `entries` store entries were quarantined.
    pub(super) fn quarantined(&self, entries: usize) {
        self.store_quarantined.inc_by(entries as u64);
    }

    /// The store now holds `images` digests of `bytes` in all.
    pub(super) fn store(&self, images: usize, bytes: i64) {
        self.store_images.set(images as i64);
        self.store_bytes.set(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(metrics: &AgentMetrics) -> String {
        let mut registry = Registry::with_prefix("gkm");
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn names_follow_the_prometheus_conventions() {
        let metrics = AgentMetrics::default();
        metrics.extraction(true, Duration::from_millis(1500));
        metrics.extraction(false, Duration::from_millis(200));
        metrics.pass(true, Duration::from_millis(3));
        metrics.store(2, 4096);
        metrics.quarantined(1);
        metrics.slot_yielded("slower_than_min_rate");
        let out = text(&metrics);
        for line in [
            "gkm_agent_extractions_total{outcome=\"succeeded\"} 1",
            "gkm_agent_extractions_total{outcome=\"failed\"} 1",
            "gkm_agent_extraction_duration_seconds_count 2",
            "gkm_agent_extraction_slot_yields_total{reason=\"slower_than_min_rate\"} 1",
            "gkm_agent_sync_passes_total{outcome=\"succeeded\"} 1",
            "gkm_agent_sync_duration_seconds_count 1",
            "gkm_agent_store_bytes 4096",
            "gkm_agent_store_images 2",
            "gkm_agent_store_quarantined_total 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
    }
}
