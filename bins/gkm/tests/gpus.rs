//! `gkm gpus`, run as a user would run it.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn repo() -> PathBuf {
    gkm_testenv::repo_root()
}

fn sysfs(name: &str) -> String {
    repo()
        .join("gkm-gpu/testdata/sysfs")
        .join(name)
        .display()
        .to_string()
}

/// The PCI names gkm bundles, so output is the same with or without the
/// system's pci.ids.
fn pci_ids() -> String {
    repo()
        .join("gkm-gpu/src/pci_ids_fallback.ids")
        .display()
        .to_string()
}

fn gkm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .env_remove("GKM_LOG")
        .output()
        .expect("run gkm")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn lists_nvidia_gpus_from_a_sysfs_tree_as_json() {
    let out = gkm(&[
        "gpus",
        "--json",
        "--no-nvml",
        "--sysfs",
        &sysfs("nvidia-h100"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let inv: gkm_gpu::Inventory = serde_json::from_slice(&out.stdout).unwrap();
    let archs: Vec<String> = inv
        .gpus
        .iter()
        .map(|g| {
            g.arch
                .as_ref()
                .and_then(|a| a.sm_name())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(archs, ["sm_90", "sm_90"]);
}

#[test]
fn without_an_nvidia_library_reports_no_driver_and_exits_0() {
    // NVML is asked (no --no-nvml). Where libnvidia-ml.so.1 is absent, as on
    // the build machines, that is reported, not failed.
    let out = gkm(&["gpus", "--json", "--sysfs", &sysfs("no-gpu")]);
    assert!(out.status.success(), "{out:?}");
    let inv: gkm_gpu::Inventory = serde_json::from_slice(&out.stdout).unwrap();
    match inv.nvml {
        gkm_gpu::NvmlStatus::NoDriver { .. } => {
            assert!(inv.gpus.is_empty(), "{:?}", inv.gpus);
            let text = gkm(&["gpus", "--sysfs", &sysfs("no-gpu")]);
            assert!(text.status.success(), "{text:?}");
            let text = stdout(&text);
            assert!(text.contains("No GPUs found."), "{text}");
            assert!(text.contains("NVIDIA: no NVIDIA driver here"), "{text}");
        }
        gkm_gpu::NvmlStatus::Loaded { .. } => {}
        other => panic!("NVML neither loaded nor absent: {other:?}"),
    }
}

#[test]
fn this_machine_lists_without_error() {
    let out = gkm(&["gpus"]);
    if std::path::Path::new("/sys/bus/pci/devices").is_dir() {
        assert!(out.status.success(), "{out:?}");
    } else {
        // A sandbox without a PCI bus in /sys: a clear error, not a crash.
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("/sys is not a sysfs tree"));
    }
}

#[test]
fn text_output_shows_vfio_groups() {
    let out = gkm(&[
        "gpus",
        "--no-nvml",
        "--pci-ids",
        &pci_ids(),
        "--sysfs",
        &sysfs("nvidia-vfio"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out).replace(&sysfs("nvidia-vfio"), "<sysfs>");
    insta::assert_snapshot!("gpus-nvidia-vfio", text);
}

#[test]
fn text_output_shows_gpus_and_mdevs() {
    let out = gkm(&[
        "gpus",
        "--no-nvml",
        "--pci-ids",
        &pci_ids(),
        "--sysfs",
        &sysfs("nvidia-mdev"),
    ]);
    assert!(out.status.success(), "{out:?}");
    insta::assert_snapshot!("gpus-nvidia-mdev", stdout(&out));
}

#[test]
fn labels_of_a_simulated_node() {
    let file = repo().join("gkm-gpu/testdata/simulate/mixed.yaml");
    let out = gkm(&[
        "gpus",
        "--simulate",
        &file.display().to_string(),
        "--labels",
        "--vendor-labels",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.lines().any(|l| l == "gkm.io/gpu.count=6"), "{text}");
    insta::assert_snapshot!("gpus-simulated-labels", text);
}

/// `gkm gpus` of a simulated node: a table by default, the inventory with
/// `--json` (which `--simulate` reads back to the same table).
#[test]
fn table_and_json_of_a_simulated_node() {
    let file = repo().join("gkm-gpu/testdata/simulate/mixed.yaml");
    let file = file.display().to_string();
    let table = stdout(&gkm(&["gpus", "--simulate", &file]));
    assert!(
        table.lines().any(|l| l.starts_with("GPU  PRODUCT")),
        "{table}"
    );
    let json = stdout(&gkm(&["gpus", "--simulate", &file, "--json"]));
    let doc: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    assert_eq!(doc["gpus"].as_array().map(Vec::len), Some(6), "{doc}");
    insta::assert_snapshot!("gpus-simulated-json", json);
    let work = tempfile::tempdir().expect("tempdir");
    let again = work.path().join("inventory.json");
    std::fs::write(&again, &json).expect("write");
    let reread = stdout(&gkm(&["gpus", "--simulate", &again.display().to_string()]));
    assert_eq!(reread, table);
}

/// What gkm-agent serves on /metrics for these GPUs, printed without a
/// cluster: the same every run for a simulated inventory.
#[test]
fn metrics_of_a_simulated_node() {
    let file = repo().join("gkm-gpu/testdata/simulate/mixed.yaml");
    let file = file.display().to_string();
    let args = [
        "gpus",
        "--simulate",
        &file,
        "--metrics",
        "--node-name",
        "node-1",
    ];
    let out = gkm(&args);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(stdout(&gkm(&args)), text, "deterministic");
    insta::assert_snapshot!("gpus-simulated-metrics", text);
}

#[test]
fn metrics_without_nvml_name_the_gpus_and_say_why() {
    let out = gkm(&[
        "gpus",
        "--sysfs",
        &sysfs("nvidia-h100"),
        "--no-nvml",
        "--metrics",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("gkm_gpu_info{"))
            .count(),
        2,
        "{text}"
    );
    assert!(!text.contains("gkm_gpu_utilization_ratio"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NVML is switched off: no readings for 2 NVIDIA GPU(s)"),
        "{err}"
    );
}

#[test]
fn a_root_that_is_not_sysfs_fails_with_its_name() {
    let out = gkm(&["gpus", "--sysfs", "/nonexistent-root"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent-root is not a sysfs tree"),
        "{err}"
    );
}

#[test]
fn a_bad_simulated_file_fails_with_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, "gpus:\n  - profile: T4\n  - profile: B9000\n").unwrap();
    let out = gkm(&["gpus", "--simulate", &file.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GPU entry 1: unknown profile \"B9000\""),
        "{err}"
    );
}
