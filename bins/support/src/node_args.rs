//! The flags gkm's kubelet plugins (`gkm-device-plugin`, `gkm-dra-plugin`)
//! share: where the node's devices are read from, NVML, and the flags every
//! daemon takes ([`DaemonArgs`]: the apiserver and logging). Each binary flattens [`NodeDeviceArgs`] into its own flags, so
//! a flag is named, documented and read the same way in both.

use std::path::PathBuf;

use gkm_gpu::PciIdsSource;
use gkm_k8s_devices::NodePaths;

use crate::daemon_args::DaemonArgs;

/// The flags both kubelet plugins take.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct NodeDeviceArgs {
    /// The sysfs root to read devices from.
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// The /dev root: device nodes are looked up here and handed to
    /// containers under this path, so it must be the host's /dev at the
    /// same path.
    #[arg(long, default_value = "/dev")]
    pub dev_root: PathBuf,
    /// The procfs root (NVIDIA GPU UUIDs and minors).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// A pci.ids file naming devices (default: the system's).
    #[arg(long)]
    pub pci_ids: Option<PathBuf>,
    /// Do not use NVML: no XID health checks, and no UUIDs, driver versions
    /// or memory from it.
    #[arg(long)]
    pub no_nvml: bool,
    /// The flags every daemon takes.
    #[command(flatten)]
    pub daemon: DaemonArgs,
}

impl NodeDeviceArgs {
    /// Where the plugin looks at the node.
    pub fn paths(&self) -> NodePaths {
        NodePaths {
            sysfs_root: self.sysfs_root.clone(),
            dev_root: self.dev_root.clone(),
            proc_root: self.proc_root.clone(),
        }
    }

    /// The PCI ID database naming devices: `--pci-ids`, else the system's.
    pub fn pci_ids(&self) -> PciIdsSource {
        self.pci_ids
            .clone()
            .map_or(PciIdsSource::System, PciIdsSource::File)
    }

    /// Whether to ask NVML about NVIDIA GPUs.
    pub fn nvml(&self) -> bool {
        !self.no_nvml
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        node: NodeDeviceArgs,
    }

    #[test]
    fn the_defaults_are_the_hosts_own_roots_the_systems_pci_ids_and_nvml() {
        let cli = Cli::try_parse_from(["plugin"]).unwrap();
        assert_eq!(
            cli.node.paths(),
            NodePaths {
                sysfs_root: "/sys".into(),
                dev_root: "/dev".into(),
                proc_root: "/proc".into(),
            }
        );
        assert_eq!(cli.node.pci_ids(), PciIdsSource::System);
        assert!(cli.node.nvml());
        assert!(!cli.node.daemon.log_json);
    }

    #[test]
    fn flags_name_the_roots_the_pci_ids_and_turn_nvml_off() {
        let cli = Cli::try_parse_from([
            "plugin",
            "--sysfs-root=/host/sys",
            "--dev-root=/host/dev",
            "--proc-root=/host/proc",
            "--pci-ids=/ids",
            "--no-nvml",
            "--kubeconfig=/kc",
            "--log-json",
        ])
        .unwrap();
        assert_eq!(cli.node.paths().sysfs_root, PathBuf::from("/host/sys"));
        assert_eq!(cli.node.paths().dev_root, PathBuf::from("/host/dev"));
        assert_eq!(cli.node.paths().proc_root, PathBuf::from("/host/proc"));
        assert_eq!(cli.node.pci_ids(), PciIdsSource::File("/ids".into()));
        assert!(!cli.node.nvml());
        assert_eq!(cli.node.daemon.kubeconfig, Some(PathBuf::from("/kc")));
        assert!(cli.node.daemon.log_json);
    }
}
