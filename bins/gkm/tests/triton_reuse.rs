//! Real Triton reuses the caches gkm delivers: for every target of the fleet
//! (`fixtures/triton`), the real Triton cache is built into an OCI layout
//! with `gkm build`, extracted with `gkm extract` at the directory it was
//! compiled in, and Triton 3.6 (`hack/ci/components.sh triton`) compiles the
//! same kernels against the extracted trees (`hack/fixtures/triton_fleet.py check`,
//! one run for the whole fleet): it compiles nothing and reads every kernel
//! from the extracted tree. The same check compiles every kernel against an
//! empty tree, and against the delivered tree at another path: Triton's group
//! files record the absolute path a kernel was compiled at, so a cache is
//! reused only there. A cache Triton warms is captured with `gkm capture`
//! and reused from the captured image.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use gkm_testenv::triton::{CompilePaths, TritonReport, fleet, triton_check};
use serde_json::Value;

mod support;

fn gkm(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .env("DOCKER_CONFIG", "/nonexistent-gkm-test-docker-config")
        .output()
        .expect("run gkm");
    assert!(
        out.status.success(),
        "gkm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What real Triton did compiling the fleet's kernels for `target` against
/// the cache tree `cache`.
fn triton_check_one(target: &str, cache: &Path) -> TritonReport {
    triton_check(&[(target, cache)])
        .unwrap_or_else(|e| panic!("{e:#}"))
        .remove(0)
}

#[test]
fn real_triton_reuses_every_target_gkm_extracts_and_compiles_without_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let fleet = fleet().unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(fleet.len(), 11, "one fixture per target of the fleet");
    let mut paths = CompilePaths::lock().expect("lock the compile paths");

    let mut layouts = Vec::new();
    let mut extracted = Vec::new();
    for t in &fleet {
        let layout = format!("oci:{}/fleet:{}", w.display(), t.name);
        let digest = gkm(&["build", &t.fixture.display().to_string(), "-t", &layout]);
        let inspect: Value =
            serde_json::from_str(&gkm(&["inspect", &layout, "--json"])).expect("inspect JSON");
        // The one target gkm reads from the image is the one the fixture
        // was compiled for.
        let targets = inspect["targets"].as_array().expect("targets");
        assert_eq!(targets, &[Value::from(t.target.as_str())], "{}", t.name);
        assert_eq!(
            inspect["entryCount"].as_u64(),
            Some(t.kernels as u64),
            "{}",
            t.name
        );

        // Extracted where its kernels were compiled, with nothing else there.
        let home = paths.clear(t).expect("clear the compile path");
        let out = gkm(&["extract", &layout, "-o", &home.display().to_string()]);
        assert_eq!(out.trim(), digest.trim(), "{}", t.name);
        extracted.push((t.target.as_str(), home));
        layouts.push(layout);
    }

    let pairs: Vec<(&str, &Path)> = extracted.iter().map(|(t, p)| (*t, p.as_path())).collect();
    let reports = triton_check(&pairs).unwrap_or_else(|e| panic!("{e:#}"));
    for (t, report) in fleet.iter().zip(&reports) {
        assert_eq!(report.target, t.target);
        assert_eq!(report.triton, "3.6.0");
        assert_eq!(report.kernels.len(), t.kernels, "{}: {report:#?}", t.name);
        assert!(
            report.reused_whole(),
            "{}: Triton compiled or read elsewhere:\n{report:#?}",
            t.name
        );
    }
    // Triton finds the delivered tree only where it was compiled (its
    // group files name the files there): gone from there (the lock still
    // held, so no other run puts one there), it is a miss elsewhere.
    for (_, home) in &extracted {
        std::fs::remove_dir_all(home).expect("remove the extracted tree");
    }
    for (t, layout) in fleet.iter().zip(&layouts) {
        if t.name == "cuda-90-32" || t.name == "hip-gfx942-64" {
            let elsewhere = w.join(format!("elsewhere-{}", t.name));
            gkm(&["extract", layout, "-o", &elsewhere.display().to_string()]);
            let moved = triton_check_one(&t.target, &elsewhere);
            assert_eq!(moved.compiled, t.kernels, "{} moved: {moved:#?}", t.name);
        }
    }
}

#[test]
fn real_triton_compiles_everything_against_an_empty_cache() {
    let work = tempfile::tempdir().expect("tempdir");
    let targets = ["cuda/120/32", "hip/gfx950/64"];
    let empty: Vec<_> = targets
        .iter()
        .map(|t| work.path().join(t.replace('/', "-")))
        .collect();
    for dir in &empty {
        std::fs::create_dir(dir).expect("mkdir");
    }
    let pairs: Vec<(&str, &Path)> = targets
        .iter()
        .zip(&empty)
        .map(|(t, d)| (*t, d.as_path()))
        .collect();
    for (report, (target, dir)) in triton_check(&pairs)
        .unwrap_or_else(|e| panic!("{e:#}"))
        .iter()
        .zip(&pairs)
    {
        let kernels = report.kernels.len();
        assert!(kernels > 0, "{report:#?}");
        assert_eq!(report.compiled, kernels, "{target}: {report:#?}");
        assert_eq!(report.reused, 0, "{target}: {report:#?}");
        // What it compiled, it wrote to the tree it was given.
        assert!(
            report
                .kernels
                .iter()
                .all(|k| k.read_from == [dir.to_path_buf()]),
            "{report:#?}"
        );
    }
}

#[test]
fn a_cache_real_triton_warmed_is_captured_and_reused_from_the_captured_image() {
    let registry = gkm_testenv::Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let target = "cuda/75/32";
    // The workload: real Triton compiles the fleet's kernels into an empty
    // cache directory.
    let warm = w.join("warm");
    std::fs::create_dir(&warm).expect("mkdir");
    let warmed = triton_check_one(target, &warm);
    let kernels = warmed.kernels.len();
    assert!(kernels > 0, "{warmed:#?}");
    assert_eq!(warmed.compiled, kernels, "{warmed:#?}");

    // Captured: checked, built, pushed, signed, verified, tagged.
    let keys = support::key_pair(&w.join("keys"));
    let image = format!("{}/capture/warmed:v1", registry.addr());
    let key = keys.join("cosign.key").display().to_string();
    let warm_arg = warm.display().to_string();
    let out = support::gkm_in(
        &[
            "capture",
            &warm_arg,
            "-t",
            &image,
            "--key",
            &key,
            "--insecure",
            "--json",
        ],
        w,
    );
    assert_eq!(out.status.code(), Some(0), "{}", support::text(&out));
    let captured: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        captured["targets"],
        serde_json::json!([target]),
        "{captured}"
    );

    // The workload's tree is gone; the captured image, extracted where it
    // was compiled, is reused whole.
    std::fs::remove_dir_all(&warm).expect("remove the warmed tree");
    let public = keys.join("cosign.pub").display().to_string();
    let verified = support::gkm_in(&["verify", &image, "--key", &public, "--insecure"], w);
    assert_eq!(
        verified.status.code(),
        Some(0),
        "{}",
        support::text(&verified)
    );
    let extracted = support::gkm_in(&["extract", &image, "-o", &warm_arg, "--insecure"], w);
    assert_eq!(
        extracted.status.code(),
        Some(0),
        "{}",
        support::text(&extracted)
    );
    assert_eq!(
        String::from_utf8_lossy(&extracted.stdout).trim(),
        captured["digest"].as_str().expect("digest")
    );
    let reused = triton_check_one(target, &warm);
    assert!(reused.reused_whole(), "Triton compiled:\n{reused:#?}");
    assert_eq!(reused.reused, kernels, "{reused:#?}");
}
