//! `gkm build`, `inspect` and `check` on a DeepGEMM cache as a user runs
//! them: a `~/.deep_gemm` laid out as DeepGEMM 2.6 writes it
//! (`gkm_testenv::deepgemm`; DeepGEMM compiles only with a GPU), two
//! kernels for sm_90a compiled by NVCC 12.9 with `deep_gemm` installed
//! where the `vllm/vllm-openai` image installs it.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_testenv::deepgemm::{KERNELS, ROOT, deepgemm_tree, kernel_dir};

mod support;

use support::{check_fits, gkm_in, gkm_ok, text};

#[test]
fn a_deepgemm_cache_builds_with_its_install_declared_and_fits_its_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("deep_gemm");
    deepgemm_tree(&root);
    let tree = root.to_str().unwrap();
    let image = format!("oci:{}:dg", dir.path().join("layout").display());

    // Without the install its keys name: refused, saying what to declare.
    let out = gkm_in(&["build", tree, "-t", &image], dir.path());
    eprintln!("gkm build (undeclared):\n{}", text(&out));
    assert!(!out.status.success());
    assert!(text(&out).contains("--deepgemm-root"), "{}", text(&out));

    // Declared elsewhere than it was compiled: no key matches.
    let moved = "/opt/venv/lib/python3.12/site-packages/deep_gemm";
    let out = gkm_in(
        &["build", tree, "-t", &image, "--deepgemm-root", moved],
        dir.path(),
    );
    eprintln!("gkm build (another install):\n{}", text(&out));
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("deep_gemm at {moved}")),
        "{}",
        text(&out)
    );

    let built = gkm_ok(
        &["build", tree, "-t", &image, "--deepgemm-root", ROOT],
        dir.path(),
    );
    eprintln!("gkm build:\n{built}");
    assert!(
        built.contains("(deepgemm cache): 2 kernels, ") && built.contains("targets: cuda/90a/32"),
        "{built}"
    );

    let inspected = gkm_ok(&["inspect", &image], dir.path());
    eprintln!("gkm inspect:\n{inspected}");
    assert!(inspected.contains("Kind:        deepgemm"), "{inspected}");
    assert!(
        inspected.contains("Targets:     cuda/90a/32"),
        "{inspected}"
    );
    let label = |key: &str, value: &str| {
        inspected
            .lines()
            .any(|l| l.split_whitespace().eq([key, value]))
    };
    assert!(
        label("cache.deepgemm.image/deepgemm-root", ROOT),
        "{inspected}"
    );
    assert!(
        label("cache.deepgemm.image/compiler", "NVCC12.9"),
        "{inspected}"
    );

    check_fits(&image, dir.path(), &["H100"], &["A100"]);

    // A torn kernel refuses the build, naming it.
    let cubin = kernel_dir(&root, KERNELS[0].1).join("kernel.cubin");
    std::fs::remove_file(&cubin).unwrap();
    let out = gkm_in(
        &["build", tree, "-t", &image, "--deepgemm-root", ROOT],
        dir.path(),
    );
    eprintln!("gkm build (torn kernel):\n{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "{} is a torn entry",
            kernel_dir(&root, KERNELS[0].1).display()
        )),
        "{}",
        text(&out)
    );
}
