//! README's run command, `cargo run -p gkm-local`, with `--exit-when-ready`:
//! gkm installed by its chart onto the real node converges, and a pod there
//! reads the cache; it prints what README shows.

use std::process::Command;

use sha2::{Digest as _, Sha256};

/// The fixture's kernel directory.
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

#[test]
fn the_run_command_installs_gkm_with_its_chart_and_a_pod_reads_the_cache() -> anyhow::Result<()> {
    let dir = gkm_testenv::temp_dir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_gkm-local"))
        .arg("--dir")
        .arg(dir.path().join("local"))
        .arg("--exit-when-ready")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "gkm-local failed:\n{stdout}\n{stderr}"
    );

    // The chart's four components, each one pod, Running on the real node.
    let pods: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("$ kubectl get pods -n gkm-system"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    for component in gkm_local::chart::COMPONENTS {
        let line = pods
            .iter()
            .find(|l| l.starts_with(&format!("{component}-")))
            .unwrap_or_else(|| panic!("no {component} pod in:\n{stdout}"));
        assert!(
            line.contains(" Running ") && line.contains(" real-sm75 "),
            "{line}"
        );
    }
    assert_eq!(pods.len(), 4, "{pods:?}");

    // All four nodes report; the cache is extracted on the two sm75 nodes.
    let cache = stdout
        .lines()
        .find(|l| l.contains("gkmcache.gkm.io/vector-add"))
        .unwrap_or_default();
    let columns: Vec<&str> = cache.split_whitespace().collect();
    assert_eq!(
        columns.get(2..8),
        Some(&["Extracted", "4", "0", "2", "0", "2"][..]),
        "{cache}"
    );

    // The reader pod on the real node printed the kernel's sha256.
    let kernel = std::fs::read(
        gkm_local::fixture("triton-vector-add-cuda-sm75")
            .join(KERNEL_DIR)
            .join("add_kernel.cubin"),
    )?;
    let want = format!(
        "{}  /root/.triton/cache/{KERNEL_DIR}/add_kernel.cubin",
        hex::encode(Sha256::digest(&kernel))
    );
    assert!(stdout.contains(&want), "no {want} in:\n{stdout}");
    assert!(stderr.contains("helm install gkm"), "{stderr}");
    Ok(())
}
