//! What `gkm` said on a real NVIDIA H100 (driver 580.159.04, CUDA 13.0, real
//! NVML), replayed here without a GPU: the recorded inventory, read back with
//! `--gpus`/`--simulate`, must give the same labels and the same
//! compatibility reports, for a Triton cache compiled on that GPU and for
//! the sm75 fixture. The recordings and the script that made them:
//! `gkm-gpu/tests/fixtures/nvml-h100/` and `hack/gpu/`. The cold-start
//! recording (`fixtures/cold-start-h100/`, `hack/gpu/cold-start.sh`) keeps
//! the tree gkm delivered there, which Triton reused without compiling.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    gkm_testenv::repo_root()
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

/// `gkm check --json` of a cache against the H100 inventory recorded through NVML.
fn check_on_recorded_h100(cache: &Path) -> Output {
    let inventory = recorded("gpus.json");
    gkm(&[
        "check",
        "--json",
        "--gpus",
        inventory.to_str().unwrap(),
        cache.to_str().unwrap(),
    ])
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
    // Every label gkm wrote on the real H100, with the same value (selectors
    // written against them keep matching), plus the mark of a simulated
    // inventory; any other label is one gkm may write.
    let got: Vec<&str> = replayed.lines().collect();
    for label in real.lines().chain(["gkm.io/gpu.simulated=true"]) {
        assert!(got.contains(&label), "{label} is gone: {replayed}");
    }
    for label in &got {
        let key = label.split_once('=').map_or(*label, |(k, _)| k);
        assert!(gkm_gpu::labels::KEYS.contains(&key), "{label}");
    }
    // GPU Feature Discovery's older names say what its newer ones say.
    for (old, new) in [
        (
            "nvidia.com/cuda.driver.rev=04",
            "nvidia.com/cuda.driver-version.revision=04",
        ),
        (
            "nvidia.com/cuda.runtime.major=13",
            "nvidia.com/cuda.runtime-version.major=13",
        ),
    ] {
        assert!(got.contains(&old) && got.contains(&new), "{replayed}");
    }
}

#[test]
fn a_cache_compiled_on_the_h100_fits_it_and_the_sm75_fixture_does_not() {
    let sm90 = repo().join("fixtures/caches/triton-vector-add-cuda-sm90");
    let out = check_on_recorded_h100(&sm90);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(json(&out.stdout), read_json(&recorded("check-sm90.json")));

    let sm75 = gkm_testenv::fixture_cache("triton-vector-add-cuda-sm75");
    let out = check_on_recorded_h100(&sm75);
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

/// `fixtures/cold-start-h100/`: `hack/gpu/cold-start.sh` on an H100, where
/// a Triton workload compiled and autotuned its kernels into an empty cache,
/// gkm built, signed, verified and extracted that tree, and the same
/// workload then compiled nothing. `cache.tar.gz` is the tree gkm extracted.
fn cold_start_recording() -> PathBuf {
    repo().join("fixtures/cold-start-h100")
}

/// Unpacks the tree gkm delivered in the cold-start recording.
fn unpack_cold_start_tree(into: &Path) -> PathBuf {
    let tgz =
        std::fs::File::open(cold_start_recording().join("cache.tar.gz")).expect("cache.tar.gz");
    tar::Archive::new(flate2::read::GzDecoder::new(tgz))
        .unpack(into)
        .expect("unpack cache.tar.gz");
    into.join("triton")
}

#[test]
fn the_delivered_tree_lists_every_kernel_triton_compiled_and_fits_the_h100() {
    let summary = read_json(&cold_start_recording().join("summary.json"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = unpack_cold_start_tree(tmp.path());

    // One entry per kernel Triton compiled in each cold run: nothing the
    // workload needs is left out of what gkm lists, checks and counts.
    let manifest = gkm_core::cache::scan(&tree).expect("scan");
    let cold: Vec<&serde_json::Value> = summary["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter(|run| {
            run["run"]
                .as_str()
                .is_some_and(|name| name.starts_with("cold"))
        })
        .collect();
    assert!(!cold.is_empty(), "{summary}");
    for run in cold {
        assert_eq!(
            manifest.entries().len() as u64,
            run["compiled"].as_u64().expect("compiled"),
            "{}",
            run["run"]
        );
    }

    // The recorded H100 inventory gets the verdict real NVML gave there.
    let out = check_on_recorded_h100(&tree);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let there = read_json(&cold_start_recording().join("check.json"));
    assert_eq!(
        json(&out.stdout)["gpus"][0]["matchingTargets"],
        there["gpus"][0]["matchingTargets"]
    );
}

/// The digest the image `digest` of the layout at `dir` would have
/// without the config label and manifest annotation `key`, and the value
/// it had. Each document is re-serialised as gkm writes it (compact, keys
/// sorted), which must give back its own digest first.
fn without_label(dir: &Path, digest: &str, key: &str) -> (String, String) {
    let blob = |d: &str| {
        std::fs::read(
            dir.join("blobs/sha256")
                .join(d.trim_start_matches("sha256:")),
        )
        .expect("blob")
    };
    let digest_of = |v: &serde_json::Value| {
        gkm_core::digest::Digest::of(&serde_json::to_vec(v).expect("json")).to_string()
    };
    let mut manifest = json(&blob(digest));
    assert_eq!(
        digest_of(&manifest),
        digest,
        "gkm's manifest bytes re-serialise"
    );
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .expect("config")
        .to_string();
    let mut config = json(&blob(&config_digest));
    assert_eq!(
        digest_of(&config),
        config_digest,
        "gkm's config bytes re-serialise"
    );
    let value = config["config"]["Labels"]
        .as_object_mut()
        .expect("labels")
        .remove(key)
        .expect("the label");
    manifest["annotations"]
        .as_object_mut()
        .expect("annotations")
        .remove(key);
    let bytes = serde_json::to_vec(&config).expect("json");
    manifest["config"]["digest"] = gkm_core::digest::Digest::of(&bytes).to_string().into();
    manifest["config"]["size"] = bytes.len().into();
    (
        digest_of(&manifest),
        value.as_str().expect("a path").to_string(),
    )
}

#[test]
fn the_delivered_tree_builds_the_image_signed_on_the_h100_byte_for_byte() {
    let summary = read_json(&cold_start_recording().join("summary.json"));
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = unpack_cold_start_tree(tmp.path());
    let layout = format!("oci:{}:rebuilt", tmp.path().join("layout").display());
    let out = gkm(&["build", "--json", tree.to_str().unwrap(), "-t", &layout]);
    assert!(out.status.success(), "{out:?}");
    let rebuilt = json(&out.stdout);
    let there = &summary["image"]["build"];
    assert_eq!(rebuilt["layer"], there["layer"], "{rebuilt}");
    // The recording predates the build-path label: without it, the image
    // is the one signed on the H100, byte for byte.
    let layout_dir = tmp.path().join("layout");
    let digest = rebuilt["digest"].as_str().expect("digest");
    let (label, path) = without_label(&layout_dir, digest, "cache.triton.image/build-path");
    assert_eq!(
        path, summary["image"]["extract"]["output"],
        "the label names where the H100 run extracted the tree it compiled into"
    );
    assert_eq!(
        label,
        there["digest"].as_str().expect("recorded digest"),
        "{rebuilt}"
    );
    assert_eq!(
        summary["image"]["verify"]["result"]["digest"],
        there["digest"]
    );
}
