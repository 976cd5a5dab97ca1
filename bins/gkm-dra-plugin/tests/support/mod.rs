//! What the plugin's tests share: the chart's DRA templates, rendered.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Renders the chart's `templates` (paths under `templates/`) with
/// `dra.enabled=true` and a DeviceClass for H100s (`gkm-model-h100`) for
/// the namespace gkm-system into `dir/<name>`.
fn render_chart(dir: &Path, name: &str, templates: &[&str]) -> anyhow::Result<PathBuf> {
    let chart = gkm_testenv::repo_root().join("deploy/helm/gkm");
    let mut cmd = Command::new(gkm_testenv::find_binary(gkm_testenv::Component::Helm)?);
    cmd.args(["template", "gkm"]).arg(&chart).args([
        "--namespace",
        "gkm-system",
        "--set",
        "dra.enabled=true",
        "--set-json",
        r#"dra.deviceClasses.models=[{"name":"h100","productName":"NVIDIA H100 SXM5 80GB"}]"#,
    ]);
    for template in templates {
        cmd.args(["--show-only", &format!("templates/{template}")]);
    }
    let out = cmd.output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(name);
    std::fs::write(&path, out.stdout)?;
    Ok(path)
}

/// Installs gkm's namespace and the chart's `templates` for the plugin
/// (its RBAC, its policy); the kubeconfig of the plugin's ServiceAccount.
pub async fn install(
    plane: &gkm_testenv::ControlPlane,
    dir: &Path,
    templates: &[&str],
) -> anyhow::Result<PathBuf> {
    let deploy = gkm_testenv::repo_root().join("deploy");
    plane.apply_file(&deploy.join("namespace.yaml")).await?;
    plane
        .apply_file(&render_chart(dir, "dra.yaml", templates)?)
        .await?;
    plane.kubeconfig_for_service_account("gkm-system", "gkm-dra-plugin")
}

/// Where a plugin runs: its node and the node's directories.
pub struct Site<'a> {
    /// The node's name.
    pub node: &'a str,
    /// The kubelet's root directory.
    pub kubelet_dir: PathBuf,
    /// The CDI spec directory.
    pub cdi_dir: PathBuf,
    /// The plugin's state directory.
    pub state_dir: PathBuf,
}

/// Starts `gkm-dra-plugin` at `site`, reading `tree`, as the user of
/// `kubeconfig`, without NVML, with `extra` flags; its log goes to `log`.
pub fn start_plugin(
    site: &Site<'_>,
    tree: &gkm_k8s_devices::node_tree::NodeTree,
    kubeconfig: &Path,
    extra: &[String],
    log: &Path,
) -> anyhow::Result<gkm_testenv::Process> {
    let paths = tree.paths();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-dra-plugin"));
    cmd.arg(format!("--node-name={}", site.node))
        .arg(format!("--kubelet-dir={}", site.kubelet_dir.display()))
        .arg(format!("--cdi-dir={}", site.cdi_dir.display()))
        .arg(format!("--state-dir={}", site.state_dir.display()))
        .arg(format!("--sysfs-root={}", paths.sysfs_root.display()))
        .arg(format!("--dev-root={}", paths.dev_root.display()))
        .arg(format!("--proc-root={}", paths.proc_root.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--no-nvml")
        .args(extra);
    gkm_testenv::Process::spawn("gkm-dra-plugin", cmd, log)
}
