//! The DeepGEMM kind on trees laid out as DeepGEMM 2.6 writes them
//! (`gkm_testenv::deepgemm`; the source lines each path comes from are in
//! [`super::scan`] and [`super::key`]).

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use gkm_testenv::deepgemm::{
    KERNELS, NAME, NVRTC_SM100F, ROOT, deepgemm_tree, kernel_dir, real_cubin, write_kernel,
};

use super::*;
use crate::cache::{self, CacheError};

fn declared(root: &str) -> Declared {
    Declared {
        deepgemm_root: Some(root.into()),
        ..Default::default()
    }
}

#[test]
fn a_deepgemm_cache_is_scanned_into_its_kernels_by_their_cubins_architecture() {
    let dir = tempfile::tempdir().unwrap();
    deepgemm_tree(dir.path());

    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::DeepGemm);
    let found = entries(&manifest);
    assert_eq!(found.len(), 2, "{found:?}");
    for (n, digest) in KERNELS {
        let kernel = found.iter().find(|k| k.digest == digest).unwrap();
        assert_eq!(kernel.name, NAME, "N = {n}");
        assert_eq!(kernel.key, format!("cache/kernel.{NAME}.{digest}"));
        assert_eq!(kernel.arch.as_str(), "90a");
        assert_eq!(kernel.compiler, None);
    }
    assert_eq!(manifest.fit().targets.to_string(), "cuda/90a/32");
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );

    // What a writable view's upper holds: DeepGEMM's compile directories
    // are scratch, a new kernel is its directory.
    let rules = CacheKind::DeepGemm.rules();
    assert!(rules.scratch("tmp", true).is_some());
    assert!(rules.scratch("tmp/5d0c/kernel.cu", false).is_some());
    let new = format!("cache/kernel.{NAME}.{}/kernel.cubin", KERNELS[0].1);
    assert_eq!(rules.scratch(&new, false), None);
    assert_eq!(
        rules.entry_of(&new),
        Some(format!("cache/kernel.{NAME}.{}", KERNELS[0].1).as_str())
    );
    // Its keys name no path below the cache: it is found at any path.
    assert_eq!(cache::tree_build_path(dir.path()).unwrap(), None);
    assert!(
        cache::relocated_tree(dir.path(), Path::new("/cache"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn every_key_is_checked_against_the_declared_deep_gemm_install() {
    let dir = tempfile::tempdir().unwrap();
    deepgemm_tree(dir.path());
    let scanned = cache::scan(dir.path()).unwrap();

    // Undeclared: refused, saying what to declare.
    let err = scanned
        .clone()
        .declare(dir.path(), &Declared::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("every key names the deep_gemm install") && err.contains("--deepgemm-root"),
        "{err}"
    );

    let mut manifest = scanned.clone();
    manifest.declare(dir.path(), &declared(ROOT)).unwrap();
    for kernel in entries(&manifest) {
        assert_eq!(kernel.compiler.as_deref(), Some("NVCC12.9"), "{kernel:?}");
        assert_eq!(kernel.deepgemm_root.as_deref(), Some(ROOT));
        assert_eq!(kernel.arch.as_str(), "90a");
    }
    let fit = manifest.fit();
    assert_eq!(fit.targets.to_string(), "cuda/90a/32");
    assert_eq!(fit.frameworks["cuda"], ["12.9"]);
    let labels = DeepGemm.labels(&manifest);
    assert_eq!(labels["cache.deepgemm.image/deepgemm-root"], ROOT);
    assert_eq!(labels["cache.deepgemm.image/compiler"], "NVCC12.9");
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );

    // The same cache said to come from a venv elsewhere: its keys are not
    // that install's, so it would never hit there.
    let moved = "/opt/venv/lib/python3.12/site-packages/deep_gemm";
    let err = scanned
        .clone()
        .declare(dir.path(), &declared(moved))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("deep_gemm at {moved}"))
            && err.contains(&format!("kernel.{NAME}."))
            && err.contains("compile every kernel again"),
        "{err}"
    );
    // Options of other kinds are refused, naming them.
    let torch = Declared {
        torch_version: Some("2.11.0".into()),
        ..declared(ROOT)
    };
    let err = scanned
        .clone()
        .declare(dir.path(), &torch)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "--torch-version describes Inductor and Mega-Cache caches, not a DeepGEMM cache"
        ),
        "{err}"
    );
    // A kernel whose source changed since it was compiled: its key no
    // longer matches.
    let source = kernel_dir(dir.path(), KERNELS[1].1).join("kernel.cu");
    fs::write(&source, "// edited\n").unwrap();
    let err = scanned
        .clone()
        .declare(dir.path(), &declared(ROOT))
        .unwrap_err()
        .to_string();
    assert!(err.contains(KERNELS[1].1), "{err}");
}

#[test]
fn an_nvrtc_kernel_for_the_sm100_family_is_found_with_its_cuda_home() {
    let dir = tempfile::tempdir().unwrap();
    write_kernel(dir.path(), 4096, NVRTC_SM100F, "cuda-100-32");
    let scanned = cache::scan(dir.path()).unwrap();
    assert_eq!(entries(&scanned)[0].arch.as_str(), "100a");

    let mut manifest = scanned.clone();
    manifest.declare(dir.path(), &declared(ROOT)).unwrap();
    let kernel = entries(&manifest)[0];
    assert_eq!(kernel.compiler.as_deref(), Some("NVRTC13.0"));
    assert_eq!(kernel.arch.as_str(), "100f");
    assert_eq!(manifest.fit().targets.to_string(), "cuda/100f/32");

    let elsewhere = Declared {
        cuda_home: Some("/opt/cuda-13.0".into()),
        ..declared(ROOT)
    };
    let err = scanned
        .clone()
        .declare(dir.path(), &elsewhere)
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA_HOME /opt/cuda-13.0"), "{err}");
}

fn refusal(root: &Path) -> CacheError {
    cache::scan(root).unwrap_err()
}

#[test]
fn what_deepgemm_does_not_write_and_torn_kernels_are_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    deepgemm_tree(root);
    let kernel = kernel_dir(root, KERNELS[0].1);

    // A file DeepGEMM does not write (SGLang's proposed warm-up marker, say).
    let marker = root.join("warmup_complete.json");
    fs::write(&marker, b"{}").unwrap();
    let err = refusal(root).to_string();
    assert!(
        err.contains(&format!(
            "{} is not part of a DeepGEMM cache",
            marker.display()
        )),
        "{err}"
    );
    fs::remove_file(&marker).unwrap();

    let notes = kernel.join("notes.txt");
    fs::write(&notes, b"mine").unwrap();
    assert!(
        refusal(root)
            .to_string()
            .contains(&notes.display().to_string())
    );
    fs::remove_file(&notes).unwrap();

    let misnamed = root.join("cache/kernel.sm90_fp8_gemm_1d2d.xyz");
    fs::create_dir_all(&misnamed).unwrap();
    let err = refusal(root).to_string();
    assert!(err.contains("kernel.<name>.<32 hex digits>"), "{err}");
    fs::remove_dir(&misnamed).unwrap();

    // Torn: no cubin (DeepGEMM would stop), a truncated one, one that is
    // not a CUDA cubin.
    let cubin = kernel.join("kernel.cubin");
    let bytes = fs::read(&cubin).unwrap();
    fs::remove_file(&cubin).unwrap();
    let err = refusal(root);
    assert!(matches!(err, CacheError::TornEntry { .. }), "{err}");
    assert!(
        err.to_string().contains("Corrupted JIT cache directory"),
        "{err}"
    );
    fs::write(&cubin, &bytes[..bytes.len() / 2]).unwrap();
    assert!(refusal(root).to_string().contains("truncated"));
    // A real x86-64 library (one Inductor built).
    let library = gkm_testenv::repo_root().join(
        "fixtures/torch/inductor/ht/chtw5l77yxhgzkni3bo4jtkxyxriuzy6rjaji72aehdvpmcb6iex.main.so",
    );
    fs::copy(library, &cubin).unwrap();
    assert!(refusal(root).to_string().contains("not a CUDA cubin"));
    fs::write(&cubin, real_cubin("cuda-90-32")).unwrap();
    assert!(cache::scan(root).is_ok());
}
