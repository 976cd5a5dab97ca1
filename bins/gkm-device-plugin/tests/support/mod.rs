//! What the real-kubelet tests share: the plugin started the way a node's
//! DaemonSet would start it, against a test-made tree. The scheduler
//! extender's real-node test includes this module too.

use std::path::Path;
use std::process::Command;

use gkm_k8s_device_plugin::node_tree::NodeTree;
use gkm_testenv::{Process, RealNode};

/// Starts `gkm-device-plugin` for `node`, reading `tree`, as the user of
/// `kubeconfig`, without NVML, polling every 500 ms, with `extra` flags;
/// its log goes to `log`.
pub fn start_plugin(
    node: &RealNode,
    tree: &NodeTree,
    kubeconfig: &Path,
    extra: &[String],
    log: &Path,
) -> anyhow::Result<Process> {
    let paths = tree.paths();
    // This crate's tests name the binary cargo built for them; other crates'
    // tests (which include this module) find it in the same target dir.
    let binary = match option_env!("CARGO_BIN_EXE_gkm-device-plugin") {
        Some(path) => std::path::PathBuf::from(path),
        None => gkm_testenv::workspace_binary("gkm-device-plugin")?,
    };
    let mut cmd = Command::new(binary);
    cmd.arg(format!(
        "--device-plugins-dir={}",
        node.device_plugins_dir().display()
    ))
    .arg(format!("--sysfs-root={}", paths.sysfs_root.display()))
    .arg(format!("--dev-root={}", paths.dev_root.display()))
    .arg(format!("--proc-root={}", paths.proc_root.display()))
    .arg(format!(
        "--pod-resources-socket={}",
        node.pod_resources_socket().display()
    ))
    .arg(format!("--kubeconfig={}", kubeconfig.display()))
    .arg(format!("--node-name={}", node.name()))
    .arg("--poll=500ms")
    .arg("--no-nvml")
    .args(extra);
    Process::spawn("gkm-device-plugin", cmd, log)
}
