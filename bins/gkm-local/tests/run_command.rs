//! README's run commands, `cargo run -p gkm-local` and `cargo run -p
//! gkm-local -- --dra`, with `--exit-when-ready`: gkm installed by its
//! chart onto the real node converges, and a pod there reads the cache (it
//! prints what README shows), or, with `--dra`, the chart runs gkm's DRA
//! kubelet plugin instead of the device plugin and a pod whose claim
//! template names the cache's DeviceClass runs with the node's (simulated)
//! T4 allocated to its claim.

use std::process::Command;

use gkm_local::dra::{DRIVER, T4_DEVICE, cache_class};
use sha2::{Digest as _, Sha256};

/// The fixture's kernel directory.
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// Runs `gkm-local --exit-when-ready` with `args`, in a directory of its
/// own; its standard output and error once it succeeded.
fn run_until_ready(args: &[&str]) -> anyhow::Result<(String, String)> {
    let dir = gkm_testenv::temp_dir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_gkm-local"))
        .arg("--dir")
        .arg(dir.path().join("local"))
        .args(args)
        .arg("--exit-when-ready")
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "gkm-local {args:?} failed:\n{stdout}\n{stderr}"
    );
    Ok((stdout, stderr))
}

/// Asserts that the `kubectl get pods -n gkm-system` gkm-local printed
/// lists exactly `components`, one pod each, Running on the real node.
fn assert_chart_pods_running(stdout: &str, components: &[&str]) {
    let pods: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("$ kubectl get pods -n gkm-system"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    for component in components {
        let line = pods
            .iter()
            .find(|l| l.starts_with(&format!("{component}-")))
            .unwrap_or_else(|| panic!("no {component} pod in:\n{stdout}"));
        assert!(
            line.contains(" Running ") && line.contains(" real-sm75 "),
            "{line}"
        );
    }
    assert_eq!(pods.len(), components.len(), "{pods:?}");
}

#[test]
fn the_run_command_installs_gkm_with_its_chart_and_a_pod_reads_the_cache() -> anyhow::Result<()> {
    let (stdout, stderr) = run_until_ready(&[])?;

    // The chart's four components, each one pod, Running on the real node.
    assert_chart_pods_running(&stdout, &gkm_local::chart::COMPONENTS);

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

#[test]
fn a_pod_claims_the_real_nodes_gpu_through_the_caches_device_class() -> anyhow::Result<()> {
    let (stdout, _) = run_until_ready(&["--dra"])?;

    // The chart's DRA components, each one pod, Running on the real node;
    // no device plugin.
    assert_chart_pods_running(&stdout, &gkm_local::chart::DRA_COMPONENTS);

    // The claim of the cache's class got the real node's T4 (the pod ran:
    // gkm-local waits for it to run before it reads the claim).
    let class = cache_class("default", "vector-add");
    let allocated =
        format!("(class {class}) allocated driver={DRIVER} pool=real-sm75 device={T4_DEVICE}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("claim default/vector-add-gpu-") && l.ends_with(&allocated)),
        "no claim allocated {allocated} in:\n{stdout}"
    );
    Ok(())
}
