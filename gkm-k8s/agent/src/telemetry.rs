//! The agent's GPU metrics: gkm-gpu's collector ([`gkm_gpu::metrics`]),
//! filled in once the agent has found its GPUs, with pod labels from the
//! kubelet's pod resources ([`crate::allocations`]).

use std::fmt;
use std::sync::Arc;

use gkm_gpu::telemetry::Telemetry;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::allocations::Allocations;
pub use gkm_gpu::metrics::{GpuCollector, family_names, metrics_text};

/// The agent's GPU collector, filled in once the agent has found its GPUs:
/// register it in the metrics registry before the agent starts (clones share
/// the collector). Until it is filled it exposes nothing.
#[derive(Debug, Clone, Default)]
pub struct GpuMetrics(Arc<std::sync::OnceLock<GpuCollector>>);

impl GpuMetrics {
    /// Fills in the collector; a second call changes nothing.
    pub fn set(&self, collector: GpuCollector) {
        let _ = self.0.set(collector);
    }
}

impl Collector for GpuMetrics {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        match self.0.get() {
            Some(collector) => collector.encode(encoder),
            None => Ok(()),
        }
    }
}

/// Where the agent's GPU metrics go and where pod attribution comes from.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// The collector registered in the agent's registry.
    pub metrics: GpuMetrics,
    /// The kubelet's pod-resources socket; `None` for no pod labels.
    pub pod_resources_socket: Option<std::path::PathBuf>,
    /// How often the kubelet is asked which containers hold which devices.
    pub pod_resources_every: std::time::Duration,
}

impl TelemetryConfig {
    /// Metrics into `metrics`, pod labels from the kubelet's default socket
    /// every 10 s.
    pub fn new(metrics: GpuMetrics) -> TelemetryConfig {
        TelemetryConfig {
            metrics,
            pod_resources_socket: Some(gkm_k8s_kubelet::podresources::DEFAULT_SOCKET.into()),
            pod_resources_every: std::time::Duration::from_secs(10),
        }
    }
}

/// Opens the readings of `inventory`'s GPUs, says once in the log why any
/// are missing, starts following the kubelet's pod resources, and fills in
/// the collector.
pub(super) async fn start(
    config: &TelemetryConfig,
    node_name: &str,
    discovery: &gkm_gpu::DiscoveryOptions,
    inventory: gkm_gpu::Inventory,
) {
    let options = gkm_gpu::telemetry::TelemetryOptions {
        sysfs_root: discovery.sysfs_root.clone(),
        nvml: discovery.nvml,
    };
    let opened = tokio::task::spawn_blocking(move || Telemetry::open(&inventory, &options)).await;
    let telemetry = match opened {
        Ok(telemetry) => telemetry,
        Err(e) => {
            tracing::warn!(error = %e, "opening GPU readings stopped; no GPU metrics");
            return;
        }
    };
    for note in telemetry.notes() {
        tracing::warn!(reason = %note, "GPU readings missing");
    }
    let mut collector = GpuCollector::new(telemetry, node_name);
    if let Some(socket) = &config.pod_resources_socket {
        let allocations = Allocations::default();
        tokio::spawn(crate::allocations::follow(
            socket.clone(),
            allocations.clone(),
            config.pod_resources_every,
        ));
        collector = collector.with_holders(allocations);
    }
    config.metrics.set(collector);
}
