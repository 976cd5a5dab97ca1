//! `gkm build`, `inspect`, `check` and `extract` on a TVM-FFI cache as a
//! user runs them, with real TVM-FFI (`gkm_testenv::tvm_ffi`: apache-tvm-ffi
//! 0.1.12 building C++ modules with g++ and CUDA modules with nvcc, without
//! a GPU): the cache is built, imaged, deleted and delivered back at the
//! path it was built at, where TVM-FFI finds every module built and builds
//! only the one it lacks; at another path it would build them all again,
//! which is why gkm delivers a TVM-FFI cache only where it was built. A
//! delta capture of what a run added keeps its files' mtimes, so the next
//! run at the same path finds every module built.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use gkm_testenv::Registry;
use gkm_testenv::tvm_ffi::build_modules;
use serde_json::Value;

mod support;

use support::{check_fits, gkm_in, gkm_ok, text};

/// What the script said, or the test fails with the command that installs
/// TVM-FFI.
fn build(cache: &Path, archs: &str, modules: &[&str]) -> Value {
    build_modules(cache, archs, modules).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn real_tvm_ffi_finds_the_modules_gkm_delivers_where_they_were_built_and_builds_the_one_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("home/.cache/tvm-ffi");
    let root = cache.display().to_string();
    let cold = build(&cache, "9.0a", &["add_one", "scale"]);
    eprintln!("TVM-FFI, cold: {cold:#}");
    assert_eq!(cold["modules"]["add_one"], "miss", "{cold:#}");
    assert_eq!(cold["modules"]["scale"], "miss", "{cold:#}");

    let image = format!("oci:{}:tvm", dir.path().join("layout").display());
    let built = gkm_ok(&["build", &root, "-t", &image], dir.path());
    eprintln!("gkm build:\n{built}");
    assert!(built.contains("(tvm-ffi cache): 2 kernels, "), "{built}");
    assert!(built.contains("targets: cuda/90a/32"), "{built}");

    let inspected = gkm_ok(&["inspect", &image], dir.path());
    eprintln!("gkm inspect:\n{inspected}");
    assert!(inspected.contains("Kind:        tvm-ffi"), "{inspected}");
    assert!(
        inspected.contains(&format!("Built at:    {root}")),
        "{inspected}"
    );
    let label = |key: &str, value: &str| {
        inspected
            .lines()
            .any(|l| l.split_whitespace().eq([key, value]))
    };
    for (key, value) in [
        ("cache.tvm-ffi.image/backend", "cpu,cuda"),
        ("cache.tvm-ffi.image/cuda-version", "13"),
        ("cache.tvm-ffi.image/cpp-kernel-count", "1"),
    ] {
        assert!(label(key, value), "{key}: {inspected}");
    }

    check_fits(&image, dir.path(), &["H100"], &["A100"]);

    // The cache gone, delivered back where it was built: both modules are
    // found built, the one it never held is built into it.
    std::fs::remove_dir_all(&cache).unwrap();
    gkm_ok(&["extract", &image, "-o", &root], dir.path());
    let warm = build(&cache, "9.0a", &["add_one", "scale", "triple"]);
    eprintln!("TVM-FFI against the delivered cache: {warm:#}");
    assert_eq!(warm["modules"]["add_one"], "hit", "{warm:#}");
    assert_eq!(warm["modules"]["scale"], "hit", "{warm:#}");
    assert_eq!(warm["modules"]["triple"], "miss", "{warm:#}");
    let seconds = |run: &Value, m: &str| run["seconds"][m].as_f64().unwrap();
    eprintln!(
        "delivered vs cold, add_one and scale: {:.3} s vs {:.3} s",
        seconds(&warm, "add_one") + seconds(&warm, "scale"),
        seconds(&cold, "add_one") + seconds(&cold, "scale"),
    );

    // For other GPUs (another TVM_FFI_CUDA_ARCH_LIST) TVM-FFI builds the
    // CUDA module again, over the delivered one: the architectures are a
    // fit fact, not a detail.
    let sm80 = build(&cache, "8.0", &["scale"]);
    assert_eq!(sm80["modules"]["scale"], "miss", "{sm80:#}");

    // Delivered at another path, every module is built again: what gkm's
    // views refuse (`Kind::relocated`).
    let elsewhere = dir.path().join("elsewhere");
    gkm_ok(
        &["extract", &image, "-o", &elsewhere.display().to_string()],
        dir.path(),
    );
    let moved = build(&elsewhere, "9.0a", &["add_one", "scale"]);
    eprintln!("TVM-FFI against the cache at another path: {moved:#}");
    assert_eq!(moved["modules"]["add_one"], "miss", "{moved:#}");
    assert_eq!(moved["modules"]["scale"], "miss", "{moved:#}");
    let refused = gkm_core::cache::relocated_tree(&cache, &elsewhere).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains(&format!("mount it at {root} (TVM_FFI_CACHE_DIR={root})")),
        "{refused}"
    );
}

/// `cp -a`: a copy that keeps the files' mtimes, as an overlay's upper
/// holds what a pod wrote.
fn copy_keeping_times(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delta_capture_of_the_module_a_run_built_keeps_its_mtimes_and_the_next_run_finds_it_built()
 {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = tempfile::tempdir().unwrap();
    let keys = support::key_pair(&dir.path().join("keys"));
    let key = keys.join("cosign.key").display().to_string();
    let cache = dir.path().join("cache");
    let root = cache.display().to_string();
    build(&cache, "9.0a", &["add_one"]);
    let base = format!("{}/tvm-ffi-delta/base:v1", registry.addr());
    let captured = gkm_ok(
        &["capture", &root, "-t", &base, "--key", &key, "--insecure"],
        dir.path(),
    );
    eprintln!("gkm capture (base):\n{captured}");

    // A run adds a module; the upper of its writable view holds just that
    // module's directory, as the pod wrote it.
    let run = build(&cache, "9.0a", &["add_one", "negate"]);
    assert_eq!(run["modules"]["add_one"], "hit", "{run:#}");
    assert_eq!(run["modules"]["negate"], "miss", "{run:#}");
    let upper = dir.path().join("upper");
    std::fs::create_dir(&upper).unwrap();
    let added = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("negate_")
        })
        .unwrap();
    copy_keeping_times(&added, &upper);

    let whole = format!("{}/tvm-ffi-delta/whole:v1", registry.addr());
    let out = gkm_in(
        &[
            "capture",
            &upper.display().to_string(),
            "-t",
            &whole,
            "--key",
            &key,
            "--insecure",
            "--delta-of",
            captured.lines().next().unwrap(),
            "--json",
        ],
        dir.path(),
    );
    eprintln!("gkm capture --delta-of:\n{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pinned = doc["image"].as_str().unwrap().to_string();

    // The next node: the whole image delivered at the build path, both
    // modules found built.
    std::fs::remove_dir_all(&cache).unwrap();
    gkm_ok(&["extract", &pinned, "-o", &root, "--insecure"], dir.path());
    let next = build(&cache, "9.0a", &["add_one", "negate"]);
    eprintln!("TVM-FFI against the delta image: {next:#}");
    assert_eq!(next["modules"]["add_one"], "hit", "{next:#}");
    assert_eq!(next["modules"]["negate"], "hit", "{next:#}");
}
