//! What `gkm` said on a real NVIDIA H100 (driver 580.159.04, CUDA 13.0, real
//! NVML), replayed here without a GPU: the recorded inventory, read back with
//! `--gpus`/`--simulate`, must give the same labels and the same
//! compatibility reports, for a Triton cache compiled on that GPU and for
//! the sm75 fixture. The recordings and the script that made them:
//! `gkm-gpu/tests/fixtures/nvml-h100/` and `hack/gpu/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn recorded(name: &str) -> PathBuf {
    repo().join("gkm-gpu/tests/fixtures/nvml-h100").join(name)
}

fn gkm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .env_remove("GKM_LOG")
        .output()
        .expect("run gkm")
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).expect("JSON")
}

fn read_json(path: &Path) -> serde_json::Value {
    json(&std::fs::read(path).expect("recorded file"))
}

#[test]
fn the_recorded_h100_is_read_back_as_nvml_saw_it() {
    let inventory = recorded("gpus.json");
    let out = gkm(&["gpus", "--json", "--simulate", inventory.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let gpus = json(&out.stdout)["gpus"].clone();
    assert_eq!(gpus, read_json(&inventory)["gpus"]);
    assert_eq!(gpus[0]["arch"], "90");
    assert_eq!(gpus[0]["toolkitVersion"], "13.0");

    let out = gkm(&[
        "gpus",
        "--labels",
        "--vendor-labels",
        "--simulate",
        inventory.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let real = std::fs::read_to_string(recorded("labels.txt")).expect("labels");
    let replayed = String::from_utf8_lossy(&out.stdout);
    // The same labels as on the real H100, plus the mark of a simulated
    // inventory.
    let mut expected: Vec<&str> = real.lines().collect();
    expected.push("gkm.io/gpu.simulated=true");
    expected.sort();
    let mut got: Vec<&str> = replayed.lines().collect();
    got.sort();
    assert_eq!(got, expected, "the labels gkm wrote on the real H100");
}

#[test]
fn a_cache_compiled_on_the_h100_fits_it_and_the_sm75_fixture_does_not() {
    let inventory = recorded("gpus.json");
    let sm90 = repo().join("fixtures/caches/triton-vector-add-cuda-sm90");
    let out = gkm(&[
        "check",
        "--json",
        "--gpus",
        inventory.to_str().unwrap(),
        sm90.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out.stdout), read_json(&recorded("check-sm90.json")));

    let sm75 = repo().join("../shared/fixtures/caches/triton-vector-add-cuda-sm75");
    let out = gkm(&[
        "check",
        "--json",
        "--gpus",
        inventory.to_str().unwrap(),
        sm75.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "incompatible: {out:?}");
    let report = json(&out.stdout);
    assert_eq!(report, read_json(&recorded("check-sm75-on-h100.json")));
    assert_eq!(
        report["gpus"][0]["mismatches"][0]["reasons"][0]["reason"],
        "archMismatch"
    );
}

#[test]
fn the_h100_cache_scans_as_triton_3_6_for_sm_90() {
    let sm90 = repo().join("fixtures/caches/triton-vector-add-cuda-sm90");
    let manifest = gkm_core::cache::scan(&sm90).expect("scan");
    let summary = manifest.summary();
    let targets: Vec<String> = summary.targets.iter().map(ToString::to_string).collect();
    assert_eq!(targets, ["cuda/90/32"]);
    let json = serde_json::to_value(&summary).expect("summary JSON");
    assert_eq!(json["targets"][0]["ptx_version"], 87, "{json}");
    assert_eq!(json["targets"][0]["triton_version"], "3.6.0", "{json}");
}
