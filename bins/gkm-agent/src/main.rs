//! `gkm-agent`: one per node; checks caches against the node's GPUs and extracts them.
//! Flag parsing and wiring only; the agent is `gkm_k8s_agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_bin_support::daemon_args::DaemonArgs;
use gkm_bin_support::shutdown::until_signal;
use gkm_gpu::{DiscoveryOptions, LabelOptions};
use gkm_k8s_agent::{AgentConfig, GpuMetrics, Liveness, SlowExtraction, TelemetryConfig};
use gkm_k8s_api::served::ready_when_releases_listable;
use gkm_k8s_runtime::endpoints::{Endpoints, ResponseFuture, Routes, text};
use gkm_k8s_runtime::metrics::register_build_info;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::EndpointServer;
use gkm_oci::mirrors::HostsConfig;
use gkm_oci::{FreeSpaceReserve, RegistryOptions};
use hyper::body::Bytes;
use hyper::{Method, StatusCode};
use prometheus_client::registry::Registry;

/// How long without a pass ending is a stall, unless three resyncs are longer.
const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(300);

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
    /// looking at the hardware, and its CPU ISA (the ISA PyTorch Inductor
    /// picks, what caches of C++ kernels only are judged by) from the file's
    /// `cpuIsa:` (`avx2`, `avx512`…; unknown when absent) instead of
    /// /proc/cpuinfo.
    #[arg(long, env = "GKM_SIMULATE")]
    simulate: Option<PathBuf>,
    /// The sysfs root to scan for GPUs.
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Where to serve /healthz, /readyz and /metrics (port 0 picks a free one).
    #[arg(long, env = "GKM_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Speak plain HTTP to registries (local test registries only).
    #[arg(long, env = "GKM_INSECURE_REGISTRY")]
    insecure_registry: bool,
    /// Registry mirrors and peer-to-peer caches: a directory of
    /// containerd-style host files (<dir>/<registry>/hosts.toml, such as
    /// /etc/containerd/certs.d). Content is read from them by digest and
    /// checked against it; a missing directory means no mirrors.
    #[arg(long, env = "GKM_REGISTRY_CONFIG_DIR", default_value = gkm_oci::mirrors::DEFAULT_CONFIG_DIR)]
    registry_config_dir: PathBuf,
    /// How often every cache is checked even without a change (e.g. 30s).
    #[arg(long, default_value = "30s", value_parser = gkm_bin_support::duration)]
    resync: Duration,
    /// How long the node's reports wait, after a change, for no further
    /// change before they are written, so that caches changing together
    /// make one write (at most ten windows after the first unwritten
    /// change; e.g. 1s; 0s writes at once).
    #[arg(long, default_value = "1s", value_parser = gkm_bin_support::duration)]
    report_batch_window: Duration,
    /// The window the first pass is delayed within, by a point fixed by the
    /// node's name, so that agents started together do not all list and
    /// write at once (e.g. 10s; 0s for none).
    #[arg(long, default_value = "10s", value_parser = gkm_bin_support::duration)]
    start_jitter: Duration,
    /// How long pulling and extracting one image may take in all (e.g. 30m).
    #[arg(long, default_value = "30m", value_parser = gkm_bin_support::duration)]
    extract_deadline: Duration,
    /// The fewest bytes per second (KiB, MiB or GiB, as in 1MiB) an
    /// extraction must fetch over --extract-rate-window to keep its slot
    /// while other namespaces' extractions wait for one (two run at once,
    /// one per namespace); a slower one gives its slot up to them, is cancelled
    /// keeping nothing, and is tried again with backoff, so that one
    /// tenant's slow registries do not hold every namespace's caches. 0:
    /// extractions keep their slot until --extract-deadline.
    #[arg(long, value_name = "BYTES", default_value = "1MiB", value_parser = parse_rate)]
    extract_min_rate: u64,
    /// How long an extraction's rate is measured over against
    /// --extract-min-rate (and so the least time it keeps its slot).
    #[arg(long, default_value = "30s", value_parser = gkm_bin_support::duration)]
    extract_rate_window: Duration,
    /// How long without an agent pass ending before /healthz fails, so the
    /// kubelet restarts a stuck agent (e.g. 5m); longer than --resync.
    /// Default: 5m, or three resyncs if that is longer.
    #[arg(long, value_parser = gkm_bin_support::duration)]
    stall_after: Option<Duration>,
    /// Space to keep free on the store's filesystem, the kubelet's: a
    /// percentage of it, bytes (KiB, MiB, GiB or TiB) or both, as in
    /// 10%+1GiB. An extraction stops, keeping nothing, before less is free.
    /// The default is the kubelet's default hard eviction threshold
    /// (nodefs.available<10%) plus a 2% margin, so caches never make the
    /// kubelet evict pods.
    #[arg(long, value_name = "PERCENT|BYTES", value_parser = <FreeSpaceReserve as std::str::FromStr>::from_str,
          default_value_t = FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN)]
    keep_free: FreeSpaceReserve,
    /// The most bytes the node store may hold (KiB, MiB, GiB or TiB, as in
    /// 500GiB), counting files in whole 4 KiB blocks and each directory and
    /// link as one; an extraction that would pass it stops, keeping
    /// nothing, and is tried again later. Default: no cap beyond
    /// --keep-free.
    #[arg(long, value_name = "BYTES", value_parser = parse_cap)]
    store_max_bytes: Option<u64>,
    /// The most bytes the caches of one namespace may hold in the node
    /// store, counted as --store-max-bytes counts them (the cluster-scoped
    /// caches together count as one more namespace; a digest several
    /// namespaces use counts for each), so that one tenant cannot take the
    /// node's store from the others.
    #[arg(long, value_name = "BYTES", value_parser = parse_cap,
          default_value = "64GiB")]
    namespace_max_bytes: u64,
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
    /// Write the capture index (<store>/delivery/captures.json): every
    /// pending GKMCacheCapture (the CSI driver publishes capture volumes
    /// only for those) and whether the capture of each captured tree on
    /// this node is over or gone (the driver then removes the tree).
    /// Watches every GKMCacheCapture.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    capture_index: bool,
}

/// Parses `--extract-min-rate`: bytes per second, 0 for none.
fn parse_rate(s: &str) -> Result<u64, String> {
    gkm_oci::disk::parse_bytes(s).map_err(|e| e.to_string())
}

/// Parses `--store-max-bytes` and `--namespace-max-bytes`: bytes, more
/// than none.
fn parse_cap(s: &str) -> Result<u64, String> {
    match gkm_oci::disk::parse_bytes(s).map_err(|e| e.to_string())? {
        0 => Err(format!("{s:?}: a cap of 0 bytes would refuse every cache")),
        bytes => Ok(bytes),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) is empty");
    }
    if cli.resync.is_zero() {
        bail!("--resync must be longer than 0s");
    }
    if cli.extract_deadline.is_zero() {
        bail!("--extract-deadline must be longer than 0s");
    }
    if cli.extract_min_rate > 0 && cli.extract_rate_window.is_zero() {
        bail!("--extract-rate-window must be longer than 0s (or --extract-min-rate 0)");
    }
    let stall_after = cli
        .stall_after
        .unwrap_or_else(|| DEFAULT_STALL_AFTER.max(cli.resync.saturating_mul(3)));
    if stall_after <= cli.resync {
        bail!(
            "--stall-after ({stall_after:?}) must be longer than --resync ({:?}): a pass ends at least every resync",
            cli.resync
        );
    }
    if cli.pod_resources_interval.is_zero() {
        bail!("--pod-resources-interval must be longer than 0s");
    }
    if let Some(file) = &cli.simulate
        && !file.is_file()
    {
        bail!("--simulate {}: no such file", file.display());
    }
    let client = gkm_k8s_runtime::client::connect(cli.daemon.kubeconfig.as_deref()).await?;
    let mut config = AgentConfig::new(&cli.node_name, &cli.store);
    config.discovery = DiscoveryOptions {
        sysfs_root: cli.sysfs,
        simulate: cli.simulate,
        ..DiscoveryOptions::default()
    };
    let hosts = HostsConfig::Dir(cli.registry_config_dir);
    for problem in hosts.problems() {
        tracing::warn!(%problem, "--registry-config-dir: pulls from this registry will fail");
    }
    config.registry = RegistryOptions {
        insecure: cli.insecure_registry,
        hosts,
        ..RegistryOptions::default()
    };
    config.resync = cli.resync;
    config.report_batch_window = cli.report_batch_window;
    config.start_jitter = cli.start_jitter;
    config.extract_deadline = cli.extract_deadline;
    config.slow_extraction = SlowExtraction {
        min_bytes_per_second: cli.extract_min_rate,
        window: cli.extract_rate_window,
    };
    config.liveness = Liveness::new(stall_after);
    config.gc_grace = cli.gc_grace;
    config.extract_policy.free_space_reserve = cli.keep_free;
    config.store_max_bytes = cli.store_max_bytes;
    config.namespace_max_bytes = Some(cli.namespace_max_bytes);
    config.capture_index_every = cli
        .capture_index
        .then_some(gkm_k8s_agent::DEFAULT_CAPTURE_INDEX_EVERY);
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
    let endpoints = Endpoints::new(registry, readiness.clone())
        .with_routes(Arc::new(Health(config.liveness.clone())));
    let server = EndpointServer::start_endpoints(cli.metrics_addr, endpoints, None)
        .await
        .with_context(|| format!("listening on --metrics-addr {}", cli.metrics_addr))?;
    ready_when_releases_listable(&client, &readiness);

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

/// `/healthz` (and `/livez`): `ok` while the agent's passes go on, `503`
/// with the reason once they stopped ([`Liveness`]).
struct Health(Liveness);

impl Routes for Health {
    fn serves(&self, path: &str) -> bool {
        matches!(path, "/healthz" | "/livez")
    }

    fn respond<'a>(&'a self, method: &'a Method, _: &'a str, _: Bytes) -> ResponseFuture<'a> {
        Box::pin(async move {
            let mut response = match self.0.check() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            };
            if method == Method::HEAD {
                *response.body_mut() = Default::default();
            }
            response
        })
    }
}

/// A path, where an empty value (which clap's path parser refuses) means none.
fn path_or_empty(value: &str) -> Result<PathBuf, std::convert::Infallible> {
    Ok(PathBuf::from(value))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.daemon.init_logging();
    gkm_bin_support::exit_code("gkm-agent", run(cli).await)
}
