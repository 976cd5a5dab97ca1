//! The flags every gkm daemon takes (`gkm-agent`, `gkm-csi`,
//! `gkm-operator`, `gkm-scheduler-extender`, and through
//! [`NodeDeviceArgs`](crate::node_args::NodeDeviceArgs) the kubelet
//! plugins): how to reach the apiserver and how to log. Each binary
//! flattens [`DaemonArgs`] into its own flags, so these are named,
//! documented and read the same way everywhere.

use std::path::PathBuf;

/// `--kubeconfig` and `--log-json`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonArgs {
    /// A kubeconfig file; without it, $KUBECONFIG, ~/.kube/config or the
    /// in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

impl DaemonArgs {
    /// Sets up logging as these flags ask: [`crate::init_logging`] at level
    /// `info` unless `GKM_LOG` says otherwise.
    pub fn init_logging(&self) {
        crate::init_logging(self.log_json, "info");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        daemon: DaemonArgs,
    }

    #[test]
    fn the_defaults_infer_the_cluster_and_log_text() {
        let cli = Cli::try_parse_from(["daemon"]).unwrap();
        assert_eq!(cli.daemon, DaemonArgs::default());
    }

    #[test]
    fn flags_name_the_kubeconfig_and_turn_json_logs_on() {
        let cli = Cli::try_parse_from(["daemon", "--kubeconfig=/kc", "--log-json"]).unwrap();
        assert_eq!(cli.daemon.kubeconfig, Some(PathBuf::from("/kc")));
        assert!(cli.daemon.log_json);
    }
}
