//! The CuTe DSL kind on the real CuTe DSL cache in `fixtures/cutedsl`
//! (`hack/fixtures/cutedsl.sh`: elementwise kernels compiled without a GPU
//! for sm_90a and sm_80), and on copies of it broken as a crash, a hand or
//! an attacker would break them.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::cache;

/// A copy of the fixture, which a test may break.
fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    gkm_testenv::copy_tree(
        &gkm_testenv::repo_root().join("fixtures/cutedsl/cache"),
        dir.path(),
    )
    .unwrap();
    dir
}

fn entries(manifest: &CacheManifest) -> Vec<&CuteDslEntry> {
    super::super::own_entries(manifest)
}

/// The compiled functions' files in the tree at `root`, sorted.
fn functions(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    found
}

fn refusal(root: &Path) -> String {
    cache::scan(root).unwrap_err().to_string()
}

#[test]
fn a_real_cutedsl_cache_is_its_compiled_functions_by_architecture() {
    let dir = fixture();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::CuteDsl);
    let found = entries(&manifest);
    assert_eq!(found.len(), 3, "{found:?}");
    let archs: Vec<String> = found.iter().map(|e| e.arch.to_string()).collect();
    assert_eq!(archs.iter().filter(|a| *a == "90a").count(), 2, "{archs:?}");
    assert_eq!(archs.iter().filter(|a| *a == "80").count(), 1, "{archs:?}");
    for entry in &found {
        assert!(
            entry.key.starts_with("cute_dsl_") && entry.key.ends_with(".mlir"),
            "{entry:?}"
        );
        assert_eq!(entry.cuda_version.as_deref(), Some("13.4"), "{entry:?}");
    }
    let fit = manifest.fit();
    assert_eq!(fit.targets.to_string(), "cuda/80/32, cuda/90a/32");
    assert_eq!(fit.frameworks["cuda"], ["13.4"]);
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
    assert_eq!(
        CuteDsl.labels(&manifest)["cache.cutedsl.image/cuda-version"],
        "13.4"
    );
    // Found wherever CUTE_DSL_CACHE_DIR points: nothing to relocate.
    assert_eq!(cache::tree_build_path(dir.path()).unwrap(), None);
    assert!(
        cache::relocated_tree(dir.path(), Path::new("/elsewhere"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn its_temporary_directories_and_parsed_facts_are_scratch_and_accepted() {
    let dir = fixture();
    let tmp = dir
        .path()
        .join("tmp.pid_31_0d9c7c1e-54f2-4c8e-9d47-7e7b8c1c2a10");
    fs::create_dir(&tmp).unwrap();
    fs::write(tmp.join("cute_dsl_half.mlir"), b"ML\xefR").unwrap();
    fs::create_dir(dir.path().join("pyir_class_facts")).unwrap();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(entries(&manifest).len(), 3);
    assert!(
        CuteDsl
            .scratch("tmp.pid_31_x/cute_dsl_half.mlir", false)
            .is_some()
    );
    assert!(
        CuteDsl
            .scratch("pyir_class_facts/ab.v1.facts", false)
            .is_some()
    );
    let function = "cute_dsl_0eba14eb20a674d297c932cd72bc07113544644fc3e842b8e69430a42395b055.mlir";
    assert!(CuteDsl.scratch(function, false).is_none());
    assert_eq!(CuteDsl.entry_of(function), Some(function));
}

#[test]
fn what_cutedsl_does_not_write_is_refused_naming_it() {
    let dir = fixture();
    let notes = dir.path().join("notes.txt");
    fs::write(&notes, b"mine").unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains(&format!(
            "{} is not part of a CuTe DSL cache",
            notes.display()
        )) && err.contains("not a compiled function's file"),
        "{err}"
    );
    fs::remove_file(&notes).unwrap();
    let sub = dir.path().join("kernels");
    fs::create_dir(&sub).unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains(&sub.display().to_string())
            && err.contains("a directory CuTe DSL does not write"),
        "{err}"
    );
}

#[test]
fn a_torn_or_tampered_function_is_refused_naming_it() {
    let torn_by = |break_it: &dyn Fn(&Path), expect: &str| {
        let dir = fixture();
        let file = functions(dir.path())[0].clone();
        break_it(&file);
        let err = refusal(dir.path());
        assert!(
            err.contains(&format!("{} is a torn entry", file.display())) && err.contains(expect),
            "{expect}: {err}"
        );
    };
    torn_by(&|f| fs::write(f, b"ML").unwrap(), "shorter than its CRC32");
    torn_by(
        &|f| {
            let bytes = fs::read(f).unwrap();
            fs::write(f, &bytes[..bytes.len() - 100]).unwrap();
        },
        "its CRC32 does not match its bytecode",
    );
    torn_by(
        &|f| {
            let mut bytes = fs::read(f).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0xff;
            fs::write(f, &bytes).unwrap();
        },
        "its CRC32 does not match its bytecode",
    );
    torn_by(
        &|f| {
            let mut bytes = fs::read(f).unwrap();
            bytes[0] = b'X';
            fs::write(f, &bytes).unwrap();
        },
        "not MLIR bytecode",
    );
}
