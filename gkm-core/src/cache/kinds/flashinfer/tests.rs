//! The FlashInfer kind on trees laid out as `flashinfer-python` 0.7.4
//! writes them (`gkm_testenv::flashinfer`; the source lines each path comes
//! from are in [`super::scan`]).

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use gkm_testenv::flashinfer::{ENV, MODULE, OP, flashinfer_tree, module_dir};

use super::*;
use crate::cache::{self, CacheError};

fn write(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap();
}

fn modules(manifest: &CacheManifest) -> Vec<&FlashInferEntry> {
    manifest
        .entries()
        .iter()
        .filter_map(CacheEntry::facts)
        .collect()
}

#[test]
fn a_flashinfer_cache_is_scanned_into_its_modules_and_tunings() {
    let dir = tempfile::tempdir().unwrap();
    let built = Path::new("/home/user/.cache/flashinfer");
    flashinfer_tree(dir.path(), built);

    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::FlashInfer);
    let entries = modules(&manifest);
    assert_eq!(entries.len(), 2, "{entries:?}");
    let module = entries.iter().find(|e| e.part == Part::Module).unwrap();
    assert_eq!(module.name, MODULE);
    assert_eq!(module.key, format!("0.7.4/90a/cached_ops/{MODULE}"));
    assert_eq!(module.flashinfer_version, "0.7.4");
    assert_eq!(module.cuda_version.as_deref(), Some("12"));
    let tuning = entries.iter().find(|e| e.part == Part::Tuning).unwrap();
    assert_eq!(tuning.key, format!("autotune/v2/{ENV}/entries/{OP}.json"));
    assert_eq!(tuning.gpu.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    assert_eq!(tuning.cuda_version.as_deref(), Some("12.8"));

    // The module fits by its architecture; the tuning names no target.
    let fit = manifest.fit();
    assert_eq!(fit.targets.to_string(), "cuda/90a/32");
    assert_eq!(fit.frameworks["flashinfer"], ["0.7.4"]);
    assert_eq!(fit.cpu, None);
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
    let labels = FlashInfer.labels(&manifest);
    assert_eq!(labels["cache.flashinfer.image/flashinfer-version"], "0.7.4");
    assert_eq!(labels["cache.flashinfer.image/cuda-version"], "12,12.8");
}

#[test]
fn a_flashinfer_cache_is_bound_to_the_path_it_was_built_at() {
    let dir = tempfile::tempdir().unwrap();
    let built = Path::new("/home/user/.cache/flashinfer");
    flashinfer_tree(dir.path(), built);
    assert_eq!(
        cache::tree_build_path(dir.path()).unwrap().as_deref(),
        Some(built)
    );
    assert!(cache::relocated_tree(dir.path(), built).unwrap().is_empty());
    let err = cache::relocated_tree(dir.path(), Path::new("/cache"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("built at /home/user/.cache/flashinfer and would be built again at /cache")
            && err.contains("FLASHINFER_WORKSPACE_BASE"),
        "{err}"
    );
}

#[test]
fn a_foreign_file_or_a_torn_module_refuses_the_cache_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let built = Path::new("/home/user/.cache/flashinfer");
    flashinfer_tree(dir.path(), built);
    let notes = module_dir(dir.path()).join("notes.txt");
    write(&notes, b"mine");
    let err = cache::scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::Foreign { path, .. } if *path == notes),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("is not part of a FlashInfer cache"),
        "{err}"
    );
    fs::remove_file(&notes).unwrap();

    let so = module_dir(dir.path()).join(format!("{MODULE}.so"));
    fs::write(&so, b"").unwrap();
    let err = cache::scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::TornEntry { path, .. } if *path == so),
        "{err}"
    );
    assert!(err.to_string().contains("that is empty"), "{err}");
    fs::remove_file(&so).unwrap();
    let err = cache::scan(dir.path()).unwrap_err().to_string();
    assert!(err.contains(&format!("no {MODULE}.so")), "{err}");

    let other = tempfile::tempdir().unwrap();
    flashinfer_tree(other.path(), built);
    fs::remove_file(module_dir(other.path()).join(".ninja_log")).unwrap();
    let err = cache::scan(other.path()).unwrap_err().to_string();
    assert!(err.contains("is a torn entry: no .ninja_log"), "{err}");
}

#[test]
fn a_workspace_of_several_architectures_is_refused_saying_how_to_build_one() {
    let dir = tempfile::tempdir().unwrap();
    flashinfer_tree(dir.path(), Path::new("/root/.cache/flashinfer"));
    fs::rename(
        dir.path().join("0.7.4/90a"),
        dir.path().join("0.7.4/80_90a"),
    )
    .unwrap();
    let err = cache::scan(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("80 and 90a together") && err.contains("FLASHINFER_CUDA_ARCH_LIST"),
        "{err}"
    );
}

#[test]
fn locks_logs_and_store_temporaries_are_scratch() {
    let kind = CacheKind::FlashInfer.rules();
    assert!(kind.scratch("0.7.4/90a/cached_ops/tmp", true).is_some());
    assert!(
        kind.scratch("0.7.4/90a/cached_ops/tmp/m.lock", false)
            .is_some()
    );
    assert!(
        kind.scratch("0.7.4/90a/flashinfer_jit.log", false)
            .is_some()
    );
    assert!(
        kind.scratch("autotune/v2/e/entries/.autotune_x1.tmp", false)
            .is_some()
    );
    assert!(kind.scratch("0.7.4/90a/cached_ops/m/m.so", false).is_none());
    assert!(
        kind.scratch("autotune/v2/e/entries/a.json", false)
            .is_none()
    );
}
