//! `gkm build`, `inspect`, `check` and `extract` on a TileLang cache as a
//! user runs them, on the real cache in `fixtures/tilelang`
//! (`hack/fixtures/tilelang.sh`: GEMM kernels TileLang 0.1.15 compiled
//! without a GPU, two for sm_90a and one for sm_80), and real TileLang
//! (`hack/ci/components.sh tilelang`) reusing what gkm delivered at another
//! path, with a miss among the hits.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use gkm_testenv::{Component, copy_tree, find_binary, repo_root};
use serde_json::Value;

mod support;

use support::{check_fits, gkm_in, gkm_ok, text};

/// A copy of the fixture's cache at `dir/cache`.
fn fixture_in(dir: &Path) -> String {
    let tree = dir.join("cache");
    copy_tree(&repo_root().join("fixtures/tilelang/cache"), &tree).unwrap();
    tree.display().to_string()
}

#[test]
fn a_tilelang_cache_builds_into_its_kernels_and_fits_the_gpus_they_were_compiled_for() {
    let dir = tempfile::tempdir().unwrap();
    let tree = fixture_in(dir.path());
    let image = format!("oci:{}:tl", dir.path().join("layout").display());

    let built = gkm_ok(&["build", &tree, "-t", &image], dir.path());
    eprintln!("gkm build:\n{built}");
    assert!(built.contains("(tilelang cache): 6 kernels, "), "{built}");
    assert!(built.contains("targets: cuda/80/32, cuda/90/32"), "{built}");

    let inspected = gkm_ok(&["inspect", &image], dir.path());
    eprintln!("gkm inspect:\n{inspected}");
    assert!(inspected.contains("Kind:        tilelang"), "{inspected}");
    assert!(inspected.contains("Entries:     6"), "{inspected}");
    assert!(
        inspected.contains("Targets:     cuda/80/32, cuda/90/32"),
        "{inspected}"
    );
    let label = |key: &str, value: &str| {
        inspected
            .lines()
            .any(|l| l.split_whitespace().eq([key, value]))
    };
    for (key, value) in [
        ("cache.tilelang.image/tilelang-version", "0.1.15"),
        ("cache.tilelang.image/host", "linux-x86_64"),
        ("cache.tilelang.image/backend", "tvm_ffi"),
    ] {
        assert!(label(key, value), "{key}: {inspected}");
    }

    check_fits(&image, dir.path(), &["H100", "A100"], &["T4"]);

    // A kernel whose library is not the one TileLang's manifest lists
    // refuses the build, naming it.
    let kernels = Path::new(&tree).join("0.1.15/linux-x86_64/kernels");
    let kernel = std::fs::read_dir(&kernels)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let library = kernel.join("executable.so");
    let mut bytes = std::fs::read(&library).unwrap();
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&library, &bytes).unwrap();
    let out = gkm_in(&["build", &tree, "-t", &image], dir.path());
    eprintln!("gkm build (torn kernel):\n{}", text(&out));
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("{} is a torn entry", library.display())),
        "{}",
        text(&out)
    );
}

/// What `hack/fixtures/tilelang_kernels.py` said compiling `kernels` for
/// `arch` against the cache at `cache`: each kernel's "hit" or "miss", and
/// the seconds it took.
fn tilelang_compile(cache: &Path, arch: &str, kernels: &[&str]) -> Value {
    let python = find_binary(Component::TileLang).unwrap_or_else(|e| panic!("{e:#}"));
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(python)
        .arg(repo_root().join("hack/fixtures/tilelang_kernels.py"))
        .arg(arch)
        .args(kernels)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TILELANG_CACHE_DIR", cache)
        .env("TILELANG_PRINT_ON_COMPILATION", "0")
        .output()
        .expect("run tilelang-python");
    assert!(
        out.status.success(),
        "tilelang_kernels.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script's JSON")
}

#[test]
fn real_tilelang_reuses_the_kernels_gkm_extracts_at_another_path_and_compiles_the_one_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let tree = fixture_in(dir.path());
    let image = format!("oci:{}:tl", dir.path().join("layout").display());
    gkm_ok(&["build", &tree, "-t", &image], dir.path());
    // Delivered somewhere else than it was compiled (/tmp/gkm-tilelang-fixtures).
    let delivered = dir.path().join("pod/home/.tilelang/cache");
    gkm_ok(
        &["extract", &image, "-o", &delivered.display().to_string()],
        dir.path(),
    );
    let kernels = ["gemm_64x64", "gemm_128x128", "gemm_64x128"];
    let warm = tilelang_compile(&delivered, "sm_90a", &kernels);
    eprintln!("TileLang against the delivered cache: {warm:#}");
    assert_eq!(warm["tilelang"], "0.1.15");
    assert_eq!(warm["kernels"]["gemm_64x64"], "hit", "{warm:#}");
    assert_eq!(warm["kernels"]["gemm_128x128"], "hit", "{warm:#}");
    assert_eq!(warm["kernels"]["gemm_64x128"], "miss", "{warm:#}");

    // The miss is TileLang's own entries, as a writable view's upper would
    // hold them: its kernel and its device binary, and the tree still
    // builds as TileLang's, two entries more.
    let image2 = format!("oci:{}:after", dir.path().join("layout").display());
    let rebuilt = gkm_ok(
        &["build", &delivered.display().to_string(), "-t", &image2],
        dir.path(),
    );
    eprintln!("gkm build (after the run):\n{rebuilt}");
    assert!(
        rebuilt.contains("(tilelang cache): 8 kernels, "),
        "{rebuilt}"
    );

    // The same kernels against an empty cache: every one compiled.
    let empty = dir.path().join("empty");
    let cold = tilelang_compile(&empty, "sm_90a", &kernels);
    eprintln!("TileLang against an empty cache: {cold:#}");
    for kernel in kernels {
        assert_eq!(cold["kernels"][kernel], "miss", "{cold:#}");
    }
    let seconds = |run: &Value, k: &str| run["seconds"][k].as_f64().unwrap();
    eprintln!(
        "delivered vs cold, the two delivered kernels: {:.2} s vs {:.2} s",
        seconds(&warm, "gemm_64x64") + seconds(&warm, "gemm_128x128"),
        seconds(&cold, "gemm_64x64") + seconds(&cold, "gemm_128x128"),
    );
}
