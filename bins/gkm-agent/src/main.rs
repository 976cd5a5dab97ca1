//! `gkm-agent`: one per node; checks caches against the node's GPUs and extracts them.
//! Flag parsing and wiring only; the agent is `gkm_k8s_agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_bin_support::shutdown::until_signal;
use gkm_gpu::{DiscoveryOptions, LabelOptions};
use gkm_k8s_agent::{AgentConfig, GpuMetrics, TelemetryConfig};
use gkm_k8s_api::served::ready_when_caches_listable;
use gkm_k8s_runtime::metrics::register_build_info;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::EndpointServer;
use gkm_oci::RegistryOptions;
use prometheus_client::registry::Registry;

/// How long the agent gets to finish a pass after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// gkm node agent: discovers the node's GPUs, pulls and extracts compatible
/// caches into the node store and reports in the node's GKMCacheNode.
#[derive(Parser)]
#[command(name = "gkm-agent", version)]
struct Cli {
    /// This node's name; its reports and labels are for this Node.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The node store the caches are extracted into (the CSI driver's --store).
    #[arg(long, env = "GKM_STORE", default_value = "/var/lib/gkm/store")]
    store: PathBuf,
    /// Read the node's GPUs from this simulated inventory file instead of
    /// looking at the hardware.
    #[arg(long, env = "GKM_SIMULATE")]
    simulate: Option<PathBuf>,
    /// The sysfs root to scan for GPUs.
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
    /// A kubeconfig file; without it, $KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Where to serve /healthz, /readyz and /metrics (port 0 picks a free one).
    #[arg(long, env = "GKM_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Speak plain HTTP to registries (local test registries only).
    #[arg(long, env = "GKM_INSECURE_REGISTRY")]
    insecure_registry: bool,
    /// How often every cache is checked even without a change (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = gkm_bin_support::duration)]
    resync: Duration,
    /// How long a digest no cache or pod uses stays in the store (e.g. 10m).
    #[arg(long, default_value = "10m", value_parser = gkm_bin_support::duration)]
    gc_grace: Duration,
    /// Also write the node labels NVIDIA GPU Feature Discovery and AMD's node
    /// labeller write (nvidia.com/gpu.product, amd.com/gpu.family…), so
    /// selectors written for them keep working without those daemons.
    #[arg(long, env = "GKM_VENDOR_LABELS")]
    vendor_labels: bool,
    /// The kubelet's pod-resources socket, read to label GPU metrics with the
    /// namespace, pod and container holding each GPU; empty for no pod labels.
    #[arg(long, env = "GKM_POD_RESOURCES_SOCKET", default_value = gkm_k8s_kubelet::podresources::DEFAULT_SOCKET, value_parser = path_or_empty)]
    pod_resources_socket: PathBuf,
    /// How often the kubelet is asked which containers hold which GPUs.
    #[arg(long, default_value = "10s", value_parser = gkm_bin_support::duration)]
    pod_resources_interval: Duration,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) is empty");
    }
    if cli.resync.is_zero() {
        bail!("--resync must be longer than 0s");
    }
    if cli.pod_resources_interval.is_zero() {
        bail!("--pod-resources-interval must be longer than 0s");
    }
    if let Some(file) = &cli.simulate
        && !file.is_file()
    {
        bail!("--simulate {}: no such file", file.display());
    }
    let client = gkm_k8s_runtime::client::connect(cli.kubeconfig.as_deref()).await?;
    let mut config = AgentConfig::new(&cli.node_name, &cli.store);
    config.discovery = DiscoveryOptions {
        sysfs_root: cli.sysfs,
        simulate: cli.simulate,
        ..DiscoveryOptions::default()
    };
    config.registry = RegistryOptions {
        insecure: cli.insecure_registry,
        ..RegistryOptions::default()
    };
    config.resync = cli.resync;
    config.gc_grace = cli.gc_grace;
    config.label_options = LabelOptions {
        vendor_labels: cli.vendor_labels,
    };
    let gpu_metrics = GpuMetrics::default();
    config.telemetry = Some(TelemetryConfig {
        pod_resources_socket: (!cli.pod_resources_socket.as_os_str().is_empty())
            .then_some(cli.pod_resources_socket),
        pod_resources_every: cli.pod_resources_interval,
        ..TelemetryConfig::new(gpu_metrics.clone())
    });

    let readiness = Readiness::default();
    let mut registry = Registry::with_prefix("gkm");
    register_build_info(&mut registry, "gkm-agent", env!("CARGO_PKG_VERSION"));
    registry.register_collector(Box::new(gpu_metrics));
    config.metrics.register(&mut registry);
    let server = EndpointServer::start(cli.metrics_addr, registry, readiness.clone())
        .await
        .with_context(|| format!("listening on --metrics-addr {}", cli.metrics_addr))?;
    ready_when_caches_listable(&client, &readiness);

    let result = match until_signal(
        gkm_k8s_agent::run(client, config, gkm_bin_support::shutdown::shutdown_signal()),
        SHUTDOWN_GRACE,
    )
    .await
    {
        Some(result) => result.with_context(|| format!("the agent of node {}", cli.node_name)),
        None => Ok(()),
    };
    server.stop().await.context("the endpoints server")?;
    result
}

/// A path, where an empty value (which clap's path parser refuses) means none.
fn path_or_empty(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gkm_bin_support::init_logging(cli.log_json, "info");
    gkm_bin_support::exit_code("gkm-agent", run(cli).await)
}
