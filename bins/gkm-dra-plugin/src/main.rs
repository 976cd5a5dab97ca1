//! `gkm-dra-plugin`: the kubelet DRA plugin for the driver `gpu.gkm.io`.
//! Flag parsing and wiring only; the plugin is `gkm_k8s_dra`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use gkm_bin_support::node_args::NodeDeviceArgs;
use gkm_k8s_dra::DraConfig;

/// gkm DRA plugin: publishes the node's GPUs, VFIO-bound GPUs and vGPUs as
/// ResourceSlices of the driver gpu.gkm.io and prepares the claims the
/// kubelet hands it, as CDI devices.
#[derive(Parser)]
#[command(name = "gkm-dra-plugin", version)]
struct Cli {
    /// This node's name (the pool's name; the slices' owner).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The kubelet's root directory (plugins_registry/ and plugins/ are in it).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// Where to write CDI specs: a directory in the runtime's CDI spec dirs.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Where to keep the prepared-claims checkpoint (on the host, so it
    /// outlives the plugin's pod).
    #[arg(long, default_value = "/var/lib/kubelet/plugins/gpu.gkm.io")]
    state_dir: PathBuf,
    /// How often to look at the node again (30s, 500ms…).
    #[arg(long, default_value = "5s", value_parser = gkm_bin_support::duration)]
    poll: Duration,
    /// Where the node's devices are read from, NVML, the apiserver, logging.
    #[command(flatten)]
    node: NodeDeviceArgs,
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.poll.is_zero() {
        bail!("--poll must be longer than zero");
    }
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) must name this node");
    }
    let client = gkm_k8s_runtime::client::connect(cli.node.daemon.kubeconfig.as_deref()).await?;
    let config = DraConfig {
        paths: cli.node.paths(),
        kubelet_dir: cli.kubelet_dir,
        cdi_dir: cli.cdi_dir,
        state_dir: cli.state_dir,
        pci_ids: cli.node.pci_ids(),
        poll: cli.poll,
        nvml: cli.node.nvml(),
        node_name: cli.node_name,
    };
    gkm_k8s_dra::run(config, client, gkm_bin_support::shutdown::shutdown_signal())
        .await
        .context("running the DRA plugin")
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.node.daemon.init_logging();
    gkm_bin_support::exit_code("gkm-dra-plugin", run(cli).await)
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

    /// The chart's DaemonSet (as rendered in the chart's snapshot with
    /// `dra.enabled` and a custom kubelet directory) passes flags this
    /// binary takes.
    #[test]
    fn the_charts_daemonset_args_parse() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../gkm-local/tests/snapshots/chart__chart_private_registry_custom_paths.snap"
        );
        let text = std::fs::read_to_string(path).expect("the chart snapshot");
        let daemonset: serde_yaml::Value = text
            .split("\n---\n")
            .filter_map(|doc| serde_yaml::from_str::<serde_yaml::Value>(doc).ok())
            .find(|doc| {
                doc["kind"].as_str() == Some("DaemonSet")
                    && doc["metadata"]["name"].as_str() == Some("gkm-dra-plugin")
            })
            .expect("the gkm-dra-plugin DaemonSet in the chart snapshot");
        let args: Vec<String> = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let cli = Cli::try_parse_from(
            ["gkm-dra-plugin", "--node-name=n1"]
                .into_iter()
                .map(String::from)
                .chain(args),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.kubelet_dir, PathBuf::from("/var/lib/k0s/kubelet"));
        assert_eq!(
            cli.state_dir,
            PathBuf::from("/var/lib/k0s/kubelet/plugins/gpu.gkm.io")
        );
        assert_eq!(cli.cdi_dir, PathBuf::from("/var/run/cdi"));
        assert_eq!(cli.node.sysfs_root, PathBuf::from("/host/sys"));
    }
}
