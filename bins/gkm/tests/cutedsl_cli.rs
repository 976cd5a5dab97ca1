//! `gkm build`, `inspect`, `check` and `extract` on a CuTe DSL cache as a
//! user runs them, with real CuTe DSL (`gkm_testenv::cutedsl`: NVIDIA's
//! CUTLASS Python DSL 4.8.1 compiling elementwise kernels without a GPU):
//! the cache it wrote is imaged and extracted at another path, where CuTe
//! DSL finds every kernel it compiled and compiles the one it lacks; for
//! another architecture it compiles them all.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use gkm_testenv::cutedsl::compile_kernels;
use serde_json::Value;

mod support;

use support::{check_fits, gkm_ok};

/// What the script said, or the test fails with the command that installs
/// CuTe DSL.
fn compile(cache: &Path, arch: &str, kernels: &[&str]) -> Value {
    compile_kernels(cache, arch, kernels).unwrap_or_else(|e| panic!("{e:#}"))
}

#[test]
fn real_cutedsl_finds_the_kernels_gkm_extracts_at_another_path_and_compiles_the_one_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("build/cutlass_python_cache");
    let cold = compile(&cache, "sm_90a", &["add", "mul"]);
    eprintln!("CuTe DSL, cold: {cold:#}");
    assert_eq!(cold["cutedsl"], "4.8.1");
    assert_eq!(cold["kernels"]["add"], "miss", "{cold:#}");
    assert_eq!(cold["kernels"]["mul"], "miss", "{cold:#}");

    let image = format!("oci:{}:cute", dir.path().join("layout").display());
    let root = cache.display().to_string();
    let built = gkm_ok(&["build", &root, "-t", &image], dir.path());
    eprintln!("gkm build:\n{built}");
    assert!(built.contains("(cutedsl cache): 2 kernels, "), "{built}");
    assert!(built.contains("targets: cuda/90a/32"), "{built}");

    let inspected = gkm_ok(&["inspect", &image], dir.path());
    eprintln!("gkm inspect:\n{inspected}");
    assert!(inspected.contains("Kind:        cutedsl"), "{inspected}");
    assert!(
        inspected.lines().any(|l| l
            .split_whitespace()
            .eq(["cache.cutedsl.image/cuda-version", "13.4"])),
        "{inspected}"
    );
    check_fits(&image, dir.path(), &["H100"], &["A100"]);

    // Delivered somewhere else: found there, as CuTe DSL looks a function
    // up by its hash wherever CUTE_DSL_CACHE_DIR points.
    let delivered = dir.path().join("pod/cutlass_python_cache");
    gkm_ok(
        &["extract", &image, "-o", &delivered.display().to_string()],
        dir.path(),
    );
    let warm = compile(&delivered, "sm_90a", &["add", "mul", "sub"]);
    eprintln!("CuTe DSL against the delivered cache: {warm:#}");
    assert_eq!(warm["kernels"]["add"], "hit", "{warm:#}");
    assert_eq!(warm["kernels"]["mul"], "hit", "{warm:#}");
    assert_eq!(warm["kernels"]["sub"], "miss", "{warm:#}");
    let rebuilt = gkm_ok(
        &["build", &delivered.display().to_string(), "-t", &image],
        dir.path(),
    );
    assert!(
        rebuilt.contains("(cutedsl cache): 3 kernels, "),
        "{rebuilt}"
    );

    // For another GPU every kernel is compiled again: the architecture is
    // in CuTe DSL's key, and a fit fact.
    let sm80 = compile(&delivered, "sm_80", &["add"]);
    assert_eq!(sm80["kernels"]["add"], "miss", "{sm80:#}");
}
