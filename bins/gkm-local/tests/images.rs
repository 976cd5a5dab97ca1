//! `hack/images/build.sh`: the same binaries give the same image digests, and an
//! image carries what its users look at (user, entrypoint, OCI labels, a
//! small base).

use std::path::Path;
use std::process::Command;

use gkm_local::repo_root;
use gkm_testenv::workspace_binary;
use serde_json::Value;

/// Builds the `gkm-csi` image from the tests' binaries into `out`; returns
/// the `digests` file.
fn build(out: &Path) -> anyhow::Result<String> {
    let bin_dir = workspace_binary("gkm-csi")?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let run = Command::new(repo_root().join("hack/images/build.sh"))
        .args(["--profile", "dev", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(out)
        .args(["gkm-csi", "gkm-operator"])
        .output()?;
    anyhow::ensure!(
        run.status.success(),
        "hack/images/build.sh: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    Ok(std::fs::read_to_string(out.join("digests"))?)
}

fn blob(layout: &Path, digest: &str) -> anyhow::Result<Value> {
    let hex = digest.trim_start_matches("sha256:");
    Ok(serde_json::from_slice(&std::fs::read(
        layout.join("blobs/sha256").join(hex),
    )?)?)
}

#[test]
fn images_are_reproducible_and_labelled() -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let first = build(&work.path().join("first"))?;
    let second = build(&work.path().join("second"))?;
    assert_eq!(first, second, "two builds of the same binaries differ");
    assert_eq!(first.lines().count(), 2, "{first}");

    for (component, user) in [("gkm-operator", "65532:65532"), ("gkm-csi", "0:0")] {
        let layout = work.path().join("first").join(component);
        let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
        let descriptor = &index["manifests"][0];
        assert_eq!(
            descriptor["annotations"]["io.containerd.image.name"],
            format!("ghcr.io/gkm-rs/{component}:v0.1.0")
        );
        let manifest = blob(&layout, descriptor["digest"].as_str().unwrap_or(""))?;
        let config = blob(&layout, manifest["config"]["digest"].as_str().unwrap_or(""))?;
        assert_eq!(config["config"]["User"], user, "{component}");
        assert_eq!(
            config["config"]["Entrypoint"],
            serde_json::json!([format!("/usr/bin/{component}")])
        );
        let labels = &config["config"]["Labels"];
        for key in ["source", "version", "revision", "licenses"] {
            assert!(
                labels[format!("org.opencontainers.image.{key}")].is_string(),
                "{component}: no {key} label in {labels}"
            );
        }
        assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
        assert_eq!(manifest["annotations"], *labels);
        // The base layer: glibc and the CA bundle, a few MB, no shell.
        let base_size = manifest["layers"][0]["size"].as_u64().unwrap_or(u64::MAX);
        assert!(
            base_size < 4 << 20,
            "{component}: base layer {base_size} bytes"
        );
    }
    Ok(())
}
