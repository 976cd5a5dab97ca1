//! Real Triton reuses the caches gkm delivers: for every target of the fleet
//! (`fixtures/triton`), the real Triton cache is built into an OCI layout
//! with `gkm build`, extracted with `gkm extract`, and Triton 3.6
//! (`hack/components.sh triton`) compiles the same kernels against the
//! extracted tree (`hack/triton-fleet.py check`): it compiles nothing. The
//! same check compiles every kernel against an empty tree, and against the
//! delivered tree at another path: Triton's group files record the absolute
//! path a kernel was compiled at, so a cache is reused only there. A cache
//! Triton warms is captured with `gkm capture` and reused from the captured
//! image.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod support;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    repo().join("fixtures/triton")
}

/// The Triton `hack/components.sh triton` installs; a clear failure when it
/// is missing.
fn triton_python() -> PathBuf {
    let path = gkm_testenv::tools_bin_dir().join("triton-python");
    assert!(
        path.is_file(),
        "Triton is not installed (no {}); install it with `hack/components.sh triton` from the repository root",
        path.display()
    );
    path
}

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
/// the cache tree `cache` (`hack/triton-fleet.py check`).
fn triton_check(target: &str, cache: &Path) -> Value {
    let out = Command::new(triton_python())
        .arg(repo().join("hack/triton-fleet.py"))
        .args(["check", "--target", target, "--cache"])
        .arg(cache)
        // Triton's own settings come from the environment; only the cache
        // directory is the test's.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", cache)
        .output()
        .expect("run triton-python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "triton check {target} {}:\n{stdout}{}",
        cache.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The directory a fixture's kernels were compiled in, as its group files
/// record it (`/tmp/gkm-triton-fixtures/<target>`): the only path Triton
/// finds them at.
fn compiled_at(fixture: &Path) -> PathBuf {
    for key in std::fs::read_dir(fixture).expect("fixture") {
        let key = key.expect("entry").path();
        for file in std::fs::read_dir(&key).expect("key dir") {
            let file = file.expect("entry").path();
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with("__grp__") {
                let group: Value =
                    serde_json::from_slice(&std::fs::read(&file).expect("group file"))
                        .expect("group JSON");
                let child = group["child_paths"]
                    .as_object()
                    .and_then(|c| c.values().next())
                    .and_then(Value::as_str)
                    .expect("a child path");
                return Path::new(child)
                    .ancestors()
                    .nth(2)
                    .expect("cache root")
                    .to_path_buf();
            }
        }
    }
    panic!("no group file in {}", fixture.display())
}

/// Where `hack/triton-fixtures.sh` compiles each target; the test removes
/// and extracts trees only below it.
const FIXTURE_HOME: &str = "/tmp/gkm-triton-fixtures/";

/// Holds the machine-wide lock on the fixed extraction paths (the one
/// `hack/triton-fixtures.sh` takes too), so runs side by side do not extract
/// into one another's tree.
fn lock_fixture_paths() -> File {
    let lock = File::create("/tmp/gkm-triton-fixtures.lock").expect("create lock file");
    lock.lock().expect("lock the fixture paths");
    lock
}

#[test]
fn real_triton_reuses_every_target_gkm_extracts_and_compiles_without_it() {
    let _lock = lock_fixture_paths();
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .expect("fixtures/triton (hack/triton-fixtures.sh writes it)")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    fixtures.sort();
    assert_eq!(fixtures.len(), 11, "one fixture per target of the fleet");

    for fixture in &fixtures {
        let name = fixture.file_name().unwrap().to_string_lossy().into_owned();
        let layout = format!("oci:{}/fleet:{name}", w.display());
        let digest = gkm(&["build", &fixture.display().to_string(), "-t", &layout]);
        let inspect: Value =
            serde_json::from_str(&gkm(&["inspect", &layout, "--json"])).expect("inspect JSON");
        // The one target gkm reads from the image is the one the fixture
        // was compiled for (its directory, `cuda-90-32`, names it).
        let targets = inspect["targets"].as_array().expect("targets");
        assert_eq!(targets.len(), 1, "{name}: {targets:?}");
        let target = targets[0].as_str().expect("target").to_string();
        assert_eq!(target.replace('/', "-"), name);
        let entries = inspect["entryCount"].as_u64().expect("entryCount");

        let home = compiled_at(fixture);
        assert!(
            home.starts_with(FIXTURE_HOME),
            "{name} was compiled at {}, not below {FIXTURE_HOME}: regenerate it with hack/triton-fixtures.sh",
            home.display()
        );
        if home.exists() {
            std::fs::remove_dir_all(&home).expect("clear the extraction path");
        }
        let extracted = gkm(&["extract", &layout, "-o", &home.display().to_string()]);
        assert_eq!(extracted.trim(), digest.trim(), "{name}");

        let report = triton_check(&target, &home);
        assert_eq!(report["target"], target.as_str());
        assert_eq!(report["triton"], "3.6.0");
        let kernels = report["kernels"].as_array().expect("kernels");
        assert_eq!(kernels.len() as u64, entries, "{name}: {report}");
        assert_eq!(
            report["compiled"], 0,
            "{name}: Triton compiled:\n{report:#}"
        );
        assert_eq!(report["reused"], entries, "{name}: {report}");

        std::fs::remove_dir_all(&home).expect("remove the extracted tree");

        // Triton finds the delivered tree only where it was compiled (its
        // group files name the files there).
        if name == "cuda-90-32" || name == "hip-gfx942-64" {
            let elsewhere = w.join(format!("elsewhere-{name}"));
            gkm(&["extract", &layout, "-o", &elsewhere.display().to_string()]);
            let moved = triton_check(&target, &elsewhere);
            assert_eq!(moved["compiled"], entries, "{name} moved: {moved}");
        }
    }
}

#[test]
fn real_triton_compiles_everything_against_an_empty_cache() {
    let work = tempfile::tempdir().expect("tempdir");
    for target in ["cuda/120/32", "hip/gfx950/64"] {
        let empty = work.path().join(target.replace('/', "-"));
        std::fs::create_dir(&empty).expect("mkdir");
        let report = triton_check(target, &empty);
        let kernels = report["kernels"].as_array().expect("kernels").len();
        assert!(kernels > 0, "{report}");
        assert_eq!(report["compiled"], kernels, "{target}: {report}");
        assert_eq!(report["reused"], 0, "{target}: {report}");
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
    let warmed = triton_check(target, &warm);
    let kernels = warmed["kernels"].as_array().expect("kernels").len();
    assert!(kernels > 0, "{warmed}");
    assert_eq!(warmed["compiled"], kernels, "{warmed}");

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
    let reused = triton_check(target, &warm);
    assert_eq!(reused["compiled"], 0, "Triton compiled:\n{reused:#}");
    assert_eq!(reused["reused"], kernels, "{reused}");
}
