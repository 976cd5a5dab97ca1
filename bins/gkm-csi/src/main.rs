//! `gkm-csi`: the CSI node plugin that mounts extracted caches into pods
//! (read-only, or copy-on-write over a private upper). Flag parsing and
//! wiring only; the driver is `gkm_k8s_csi`. It reads
//! no cluster object: what it needs of the cluster, the agent writes beside
//! the store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_k8s_csi::capture_admission::CaptureConfig;
use gkm_k8s_csi::capture_release::{ReleaseOptions, release_captures};
use gkm_k8s_csi::{
    Driver, DriverConfig, PLUGIN, RegistrationService, serve_csi, serve_registration,
};
use tokio::sync::watch;

/// gkm CSI driver (`csi.gkm.io`): mounts a verified, compatible cache from
/// the node store into pods, read-only or copy-on-write (the store is never
/// written).
#[derive(Parser)]
#[command(name = "gkm-csi", version)]
struct Cli {
    /// The CSI endpoint to serve: `unix:///path/to/csi.sock` or a path.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This node's name (the CSI node id).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The node store the gkm agent extracts into (its `--store`).
    #[arg(long, env = "GKM_STORE", default_value = "/var/lib/gkm/store")]
    store: PathBuf,
    /// Register with the kubelet, announcing the CSI socket at this path as
    /// the kubelet sees it (e.g. /var/lib/kubelet/plugins/csi.gkm.io/csi.sock).
    /// Without it, no registration is served (use node-driver-registrar).
    #[arg(long)]
    kubelet_registration_path: Option<PathBuf>,
    /// The kubelet's plugin registry directory as mounted in this container.
    #[arg(long, default_value = "/registration")]
    plugin_registration_dir: PathBuf,
    /// Publish capture volumes (csi.gkm.io/GKMCacheCapture): a workload's
    /// own tree only for a pending GKMCacheCapture of its namespace, as the
    /// capture index the agent writes in the store says
    /// (<store>/delivery/captures.json). The chart sets it from
    /// capture.enabled; when false every capture volume is refused and
    /// every tree no pod has mounted is removed.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    capture_volumes: bool,
    /// The most bytes one namespace's capture trees may be granted on this
    /// node (the sum of their tmpfs sizes, whether their pods run or
    /// ended); a capture volume past it is refused (e.g. 20Gi).
    #[arg(long, default_value = "20Gi", value_parser = parse_cap)]
    capture_namespace_max_bytes: u64,
    /// The most bytes all capture trees may be granted on this node.
    #[arg(long, default_value = "40Gi", value_parser = parse_cap)]
    capture_node_max_bytes: u64,
    /// How long a tree of a pending capture stays once no pod has it
    /// mounted (its workload ended and no capture Job read it since).
    #[arg(long, default_value = "30m", value_parser = gkm_bin_support::duration)]
    capture_unread_grace: Duration,
    /// Remove each capture tree from this node once nothing will capture
    /// it: its capture is over, deleted, or pending but unread for
    /// --capture-unread-grace, as the capture index says (without it,
    /// trees are kept, but with --capture-volumes=false).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    release_captures: bool,
    /// How old a capture tree whose GKMCacheCapture does not exist must be
    /// before it goes.
    #[arg(long, default_value = "1m", value_parser = gkm_bin_support::duration)]
    capture_orphan_grace: Duration,
    /// Where to serve /healthz, /readyz and /metrics (the bytes of pods'
    /// writable views, writable publishes, swept uppers; port 0 picks a
    /// free one). Without it, nothing is served.
    #[arg(long, env = "GKM_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

/// How often mount records are checked against the kernel's mount table
/// (and how old a record must be to be forgotten).
const MOUNT_RECORD_CHECK: Duration = Duration::from_secs(60);
/// How often the capture index and the captured trees are looked at.
const CAPTURE_RELEASE_CHECK: Duration = Duration::from_secs(5);

/// Parses a cap on capture tree bytes: bytes, more than none.
fn parse_cap(text: &str) -> Result<u64, String> {
    match gkm_core::bytes::parse_bytes(text).map_err(|e| e.to_string())? {
        0 => Err(format!(
            "{text:?}: a cap of 0 bytes would refuse every capture volume"
        )),
        bytes => Ok(bytes),
    }
}

/// The socket path of a CSI endpoint.
fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if !path.starts_with('/') {
        bail!("--endpoint {endpoint:?}: expected unix:///absolute/path or an absolute path");
    }
    Ok(PathBuf::from(path))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let socket = socket_path(&cli.endpoint)?;
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) is empty");
    }
    let config = DriverConfig {
        node_name: cli.node_name,
        store_root: cli.store,
        capture: CaptureConfig {
            enabled: cli.capture_volumes,
            namespace_max_bytes: cli.capture_namespace_max_bytes,
            node_max_bytes: cli.capture_node_max_bytes,
            unread_grace: cli.capture_unread_grace,
        },
    };
    let driver = Driver::new(&config)
        .with_context(|| format!("opening the store {}", config.store_root.display()))?;
    gkm_k8s_csi::capture_release::report_trees_at_start(&config.store_root);
    let metrics = match cli.metrics_addr {
        None => None,
        Some(addr) => Some(serve_metrics(addr, &driver, &config.store_root).await?),
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let registration = cli.kubelet_registration_path.map(|endpoint| {
        let reg_socket = cli.plugin_registration_dir.join(PLUGIN.socket_name());
        let shutdown = stopped(stop_rx.clone());
        tokio::spawn(async move {
            serve_registration(
                &reg_socket,
                RegistrationService::new(PLUGIN, endpoint),
                shutdown,
            )
            .await
        })
    });
    tokio::spawn(async move {
        gkm_bin_support::shutdown::shutdown_signal().await;
        tracing::info!("stopping");
        let _ = stop_tx.send(true);
    });
    tokio::spawn(gkm_k8s_csi::forget_stale_mount_records(
        config.store_root.clone(),
        MOUNT_RECORD_CHECK,
        MOUNT_RECORD_CHECK,
        stopped(stop_rx.clone()),
    ));
    if cli.release_captures {
        let options = ReleaseOptions {
            interval: CAPTURE_RELEASE_CHECK,
            grace: cli.capture_orphan_grace,
        };
        tokio::spawn(release_captures(
            driver.node.clone(),
            options,
            stopped(stop_rx.clone()),
        ));
    }
    serve_csi(&socket, driver, stopped(stop_rx))
        .await
        .context("serving CSI")?;
    if let Some(server) = metrics {
        server.stop().await.context("the metrics server")?;
    }
    if let Some(task) = registration {
        task.await
            .context("registration task")?
            .context("serving plugin registration")?;
    }
    Ok(())
}

/// Serves the driver's metrics ([`gkm_k8s_csi::metrics`]) on `addr`.
async fn serve_metrics(
    addr: SocketAddr,
    driver: &Driver,
    store_root: &std::path::Path,
) -> anyhow::Result<gkm_k8s_runtime::server::EndpointServer> {
    use gkm_k8s_csi::metrics::CsiCollector;
    use gkm_k8s_runtime::metrics::register_build_info;
    use gkm_k8s_runtime::readiness::Readiness;
    let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
    register_build_info(&mut registry, "gkm-csi", env!("CARGO_PKG_VERSION"));
    registry.register_collector(Box::new(CsiCollector::new(
        driver.node.metrics().clone(),
        store_root,
    )));
    let readiness = Readiness::default();
    readiness.check("driver").set(true);
    let server = gkm_k8s_runtime::server::EndpointServer::start(addr, registry, readiness)
        .await
        .with_context(|| format!("listening on --metrics-addr {addr}"))?;
    tracing::info!(%addr, "serving metrics");
    Ok(server)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gkm_bin_support::init_logging(cli.log_json, "info");
    gkm_bin_support::exit_code("gkm-csi", run(cli).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(socket_path("tcp://0.0.0.0:1").is_err());
        assert!(socket_path("unix://relative").is_err());
    }
}
