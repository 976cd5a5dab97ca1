//! `gkm-device-plugin`: the kubelet device plugin for VFIO-passthrough GPUs,
//! mediated vGPUs and container GPUs. Flag parsing and wiring only; the
//! plugin is `gkm_k8s_device_plugin`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_bin_support::node_args::NodeDeviceArgs;
use gkm_k8s_device_plugin::PluginConfig;
use gkm_k8s_device_plugin::assignments::{AssignmentSource, PodAssignments};
use gkm_k8s_device_plugin::node_gpus::{NodeAnnotation, NodeGpusSink};

/// gkm device plugin: offers VFIO-bound GPUs (one resource per model), mdev
/// vGPUs (one resource per type), nvidia.com/gpu and amd.com/gpu to the
/// kubelet.
#[derive(Parser)]
#[command(name = "gkm-device-plugin", version)]
struct Cli {
    /// The kubelet's device-plugins directory (kubelet.sock and the plugin's
    /// sockets).
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugins_dir: PathBuf,
    /// How often to look at the node again (30s, 500ms…).
    #[arg(long, default_value = "2s", value_parser = gkm_bin_support::duration)]
    poll: Duration,
    /// Also hand nvidia.com/gpu devices over as CDI devices
    /// (nvidia.com/gpu=<UUID>), for runtimes with NVIDIA's CDI specs.
    #[arg(long)]
    nvidia_cdi: bool,
    /// Offer container GPUs as gkm.io/gpu-cores (100 per GPU) and
    /// gkm.io/gpu-memory (one per MiB) units, for gkm's scheduler extender
    /// to share them, instead of whole (nvidia.com/gpu, amd.com/gpu).
    #[arg(long)]
    gpu_shares: bool,
    /// Write the resources and the GPUs not offered (with reasons) as JSON
    /// to this file after every look.
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// This node's name. With it, GetPreferredAllocation and Allocate honour
    /// the gkm.io/gpu-assignment of pods waiting on this node (needs API
    /// access to list pods), and with --gpu-shares the node's GPUs are
    /// published in its gkm.io/gpu-devices annotation (needs to patch it).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// The kubelet's pod-resources socket, to tell pods that already hold
    /// devices from those still waiting.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: PathBuf,
    /// Where the node's devices are read from, NVML, the apiserver, logging.
    #[command(flatten)]
    node: NodeDeviceArgs,
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.poll.is_zero() {
        bail!("--poll must be longer than zero");
    }
    let node = match cli.node_name {
        Some(node) if !node.is_empty() => Some((
            gkm_k8s_runtime::client::connect(cli.node.daemon.kubeconfig.as_deref()).await?,
            node,
        )),
        _ => None,
    };
    let assignments = node.clone().map(|(client, node)| {
        Arc::new(PodAssignments::new(
            client,
            node,
            Some(cli.pod_resources_socket),
        )) as Arc<dyn AssignmentSource>
    });
    let node_gpus = node
        .map(|(client, node)| Arc::new(NodeAnnotation::new(client, node)) as Arc<dyn NodeGpusSink>);
    let config = PluginConfig {
        paths: cli.node.paths(),
        device_plugins_dir: cli.device_plugins_dir,
        pci_ids: cli.node.pci_ids(),
        poll: cli.poll,
        nvml: cli.node.nvml(),
        nvidia_cdi: cli.nvidia_cdi,
        gpu_shares: cli.gpu_shares,
        status_file: cli.status_file,
    };
    gkm_k8s_device_plugin::run(
        config,
        assignments,
        node_gpus,
        gkm_bin_support::shutdown::shutdown_signal(),
    )
    .await
    .context("running the device plugin")
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.node.daemon.init_logging();
    gkm_bin_support::exit_code("gkm-device-plugin", run(cli).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--help` as users read it: the flags, their defaults and help text.
    #[test]
    fn help() {
        use clap::CommandFactory;
        let help = Cli::command().term_width(100).render_long_help();
        insta::assert_snapshot!(help.to_string());
    }

    /// The DaemonSet in deploy/ passes flags this binary takes.
    #[test]
    fn the_daemonset_args_parse() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/manifests/device-plugin.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the DaemonSet manifest");
        let daemonset: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
        let args: Vec<String> = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        assert!(args.len() >= 5, "{args:?}");
        let cli = Cli::try_parse_from(std::iter::once("gkm-device-plugin".to_string()).chain(args))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.node.sysfs_root, PathBuf::from("/host/sys"));
        assert_eq!(cli.node.dev_root, PathBuf::from("/dev"));
        assert_eq!(
            cli.device_plugins_dir,
            PathBuf::from("/var/lib/kubelet/device-plugins")
        );
    }
}
