//! `gkm-csi`: the CSI node plugin that mounts extracted caches into pods
//! (a read-only view, or a copy-on-write view over a private upper) and the
//! capture trees workloads compile into (a tree of their own, or a
//! copy-on-write view keeping its upper as a delta). Flag parsing and
//! wiring only; the driver is `gkm_k8s_csi`. It reads no cluster object:
//! what it needs of the cluster, the agent writes beside the store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Parser;
use gkm_core::free_space::FreeSpaceReserve;
use gkm_k8s_csi::{
    CaptureConfig, DriverConfig, Registration, ReleaseOptions, RelocationConfig, RunConfig,
    ViewsConfig,
};

/// gkm CSI driver (`csi.gkm.io`): mounts a verified, compatible cache from
/// the node store into pods, read-only or copy-on-write (the store is never
/// written), and the capture trees workloads compile into.
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
    /// The most capture trees one namespace may hold on this node (each a
    /// tmpfs mount on the host, whether its pod runs or ended); a capture
    /// volume past it is refused.
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_NAMESPACE_MAX_TREES,
        value_parser = clap::value_parser!(u64).range(1..))]
    capture_namespace_max_trees: u64,
    /// The most capture trees this node may hold.
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_NODE_MAX_TREES,
        value_parser = clap::value_parser!(u64).range(1..))]
    capture_node_max_trees: u64,
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
    /// The most relocation layers one cache digest may have on this node:
    /// one for each csi.gkm.io/mountPath its pods name other than the path
    /// its tree was built at (each a copy of its group files on disk). A
    /// volume that would need one more is refused; one made already is
    /// reused.
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_DIGEST_MAX_LAYERS,
        value_parser = clap::value_parser!(u64).range(1..))]
    relocation_digest_max_layers: u64,
    /// The most relocation layers made for one namespace's pods this node
    /// may hold (a layer counts against the namespace whose pod made it;
    /// pods of any namespace reuse it).
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_NAMESPACE_MAX_LAYERS,
        value_parser = clap::value_parser!(u64).range(1..))]
    relocation_namespace_max_layers: u64,
    /// The most relocation layers this node may hold, of every digest.
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_NODE_MAX_LAYERS,
        value_parser = clap::value_parser!(u64).range(1..))]
    relocation_node_max_layers: u64,
    /// What a new relocation layer must leave free of the store's
    /// filesystem: a percentage of its size, bytes (1GiB), or both
    /// (10%+1GiB), as the agent's --keep-free (whose default it shares).
    #[arg(long, value_name = "PERCENT|BYTES",
        value_parser = <FreeSpaceReserve as std::str::FromStr>::from_str,
        default_value_t = gkm_k8s_csi::DEFAULT_KEEP_FREE)]
    relocation_keep_free: FreeSpaceReserve,
    /// The most directories a writable view for a pod with an fsGroup
    /// makes writable by the group (the driver copies each up, in its own
    /// memory); a cache with more is refused such a view.
    #[arg(long, default_value_t = gkm_k8s_csi::DEFAULT_GROUP_MAX_DIRS)]
    writable_group_max_dirs: usize,
    /// Where to serve /healthz, /readyz and /metrics (the bytes of pods'
    /// writable views, writable publishes, swept uppers; port 0 picks a
    /// free one). Without it, nothing is served.
    #[arg(long, env = "GKM_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    log_json: bool,
}

/// Parses a cap on capture tree bytes: bytes, more than none.
fn parse_cap(text: &str) -> Result<u64, String> {
    match gkm_core::bytes::parse_bytes(text).map_err(|e| e.to_string())? {
        0 => Err(format!(
            "{text:?}: a cap of 0 bytes would refuse every capture volume"
        )),
        bytes => Ok(bytes),
    }
}

/// The driver's configuration from the flags.
fn config(cli: Cli) -> anyhow::Result<RunConfig> {
    let socket = gkm_k8s_csi::endpoint_socket(&cli.endpoint)
        .map_err(|e| anyhow::anyhow!("--endpoint {e}"))?;
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) is empty");
    }
    let driver = DriverConfig {
        node_name: cli.node_name,
        store_root: cli.store,
        capture: CaptureConfig {
            enabled: cli.capture_volumes,
            namespace_max_bytes: cli.capture_namespace_max_bytes,
            node_max_bytes: cli.capture_node_max_bytes,
            namespace_max_trees: cli.capture_namespace_max_trees,
            node_max_trees: cli.capture_node_max_trees,
            unread_grace: cli.capture_unread_grace,
        },
        views: ViewsConfig {
            relocation: RelocationConfig {
                digest_max_layers: cli.relocation_digest_max_layers,
                namespace_max_layers: cli.relocation_namespace_max_layers,
                node_max_layers: cli.relocation_node_max_layers,
                keep_free: cli.relocation_keep_free,
            },
            group_max_dirs: cli.writable_group_max_dirs,
        },
    };
    let mut config = RunConfig::new(driver, socket);
    config.registration = cli.kubelet_registration_path.map(|endpoint| Registration {
        dir: cli.plugin_registration_dir,
        endpoint,
    });
    config.release = cli.release_captures.then_some(ReleaseOptions {
        interval: gkm_k8s_csi::CAPTURE_RELEASE_CHECK,
        grace: cli.capture_orphan_grace,
    });
    config.metrics_addr = cli.metrics_addr;
    Ok(config)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gkm_bin_support::init_logging(cli.log_json, "info");
    let run = async {
        let config = config(cli)?;
        gkm_k8s_csi::run(config, gkm_bin_support::shutdown::shutdown_signal()).await?;
        anyhow::Ok(())
    };
    gkm_bin_support::exit_code("gkm-csi", run.await)
}
