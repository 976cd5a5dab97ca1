//! `gkm-csi`: the CSI node plugin that mounts extracted caches read-only into
//! pods. Flag parsing and wiring only; the driver is `gkm_k8s_csi`. It reads
//! no cluster object: what it needs of the cluster, the agent writes beside
//! the store.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_k8s_csi::capture_release::{ReleaseOptions, release_captures};
use gkm_k8s_csi::{
    Driver, DriverConfig, PLUGIN, RegistrationService, serve_csi, serve_registration,
};
use tokio::sync::watch;

/// gkm CSI driver (`csi.gkm.io`): bind-mounts a verified, compatible cache
/// from the node store read-only into pods.
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
    /// Remove each captured tree (a GKMCacheCapture's volume) from this node
    /// once its capture is over, or once its capture no longer exists and
    /// the tree is older than --capture-orphan-grace, as the capture index
    /// the agent writes in the store says (<store>/delivery/captures.json;
    /// without it, trees are kept).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    release_captures: bool,
    /// How old a captured tree whose GKMCacheCapture does not exist must be
    /// before it goes (a workload may start before its capture is made).
    #[arg(long, default_value = "10m", value_parser = gkm_bin_support::duration)]
    capture_orphan_grace: Duration,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

/// How often mount records are checked against the kernel's mount table
/// (and how old a record must be to be forgotten).
const MOUNT_RECORD_CHECK: Duration = Duration::from_secs(60);
/// How often the capture index and the captured trees are looked at.
const CAPTURE_RELEASE_CHECK: Duration = Duration::from_secs(5);

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
    };
    let driver = Driver::new(&config)
        .with_context(|| format!("opening the store {}", config.store_root.display()))?;

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
    if let Some(task) = registration {
        task.await
            .context("registration task")?
            .context("serving plugin registration")?;
    }
    Ok(())
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
