//! What the plugin's tests share: the chart's DRA templates, rendered.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Renders the chart's `templates` (paths under `templates/`) with
/// `dra.enabled=true` for the namespace gkm-system into `dir/<name>`.
pub fn render_chart(dir: &Path, name: &str, templates: &[&str]) -> anyhow::Result<PathBuf> {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gkm");
    let mut cmd = Command::new(gkm_testenv::find_binary(gkm_testenv::Component::Helm)?);
    cmd.args(["template", "gkm"]).arg(&chart).args([
        "--namespace",
        "gkm-system",
        "--set",
        "dra.enabled=true",
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
