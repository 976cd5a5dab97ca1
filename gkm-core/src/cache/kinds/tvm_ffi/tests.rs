//! The TVM-FFI kind on the real TVM-FFI cache in `fixtures/tvm-ffi`
//! (`hack/fixtures/tvm-ffi.sh`: two C++ modules, a CUDA module for sm_90a
//! and one for sm_80, built without a GPU at
//! `/tmp/gkm-tvm-ffi-fixtures/cache`), and on copies of it broken as a
//! crash, a hand or an attacker would break them.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::cache;

/// Where the fixture was built.
const BUILT_AT: &str = "/tmp/gkm-tvm-ffi-fixtures/cache";

/// A copy of the fixture, which a test may break.
fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    gkm_testenv::copy_tree(
        &gkm_testenv::repo_root().join("fixtures/tvm-ffi/cache"),
        dir.path(),
    )
    .unwrap();
    dir
}

fn entries(manifest: &CacheManifest) -> Vec<&TvmFfiEntry> {
    super::super::own_entries(manifest)
}

/// The directory of module `name` in the tree at `root`.
fn module(root: &Path, name: &str) -> PathBuf {
    fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let dir = p.file_name().unwrap().to_string_lossy();
            dir.rsplit_once('_').map(|(module, _)| module == name) == Some(true)
        })
        .unwrap()
}

fn refusal(root: &Path) -> String {
    cache::scan(root).unwrap_err().to_string()
}

#[test]
fn a_real_tvm_ffi_cache_is_its_modules_by_backend_and_architecture() {
    let dir = fixture();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::TvmFfi);
    let found = entries(&manifest);
    let by_name = |name: &str| *found.iter().find(|e| e.name == name).unwrap();
    assert_eq!(found.len(), 4, "{found:?}");
    for cpp in ["add_one", "negate"] {
        let entry = by_name(cpp);
        assert_eq!(entry.backend, ModuleBackend::Cpu);
        assert!(entry.archs.is_empty() && entry.cuda_version.is_none());
        assert!(entry.key.starts_with(&format!("{cpp}_")), "{entry:?}");
    }
    let scale = by_name("scale");
    assert_eq!(scale.backend, ModuleBackend::Cuda);
    assert_eq!(scale.archs, ["90a".parse().unwrap()]);
    assert_eq!(scale.cuda_version.as_deref(), Some("13"));
    assert_eq!(by_name("shift").archs, ["80".parse().unwrap()]);
    let install = scale.install.as_deref().unwrap();
    assert!(install.ends_with("/site-packages/tvm_ffi"), "{install}");
    assert!(found.iter().all(|e| e.sources.is_empty()));

    // It fits by its CUDA modules' architectures; the C++ modules are
    // counted, and decide only in a cache without a GPU module.
    let fit = manifest.fit();
    assert_eq!(fit.targets.to_string(), "cuda/80/32, cuda/90a/32");
    assert_eq!(fit.judged_by_cpu(), None);
    assert_eq!(fit.cpu.as_ref().and_then(|c| c.kernels), Some(2));
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
    let labels = TvmFfi.labels(&manifest);
    assert_eq!(labels["cache.tvm-ffi.image/backend"], "cpu,cuda");
    assert_eq!(labels["cache.tvm-ffi.image/cuda-version"], "13");
    assert_eq!(labels["cache.tvm-ffi.image/install"], install);
    assert_eq!(labels["cache.tvm-ffi.image/cpp-kernel-count"], "2");
}

#[test]
fn a_cache_of_cpp_modules_only_is_judged_by_the_cpu() {
    let dir = fixture();
    for name in ["scale", "shift"] {
        fs::remove_dir_all(module(dir.path(), name)).unwrap();
    }
    let manifest = cache::scan(dir.path()).unwrap();
    let fit = manifest.fit();
    assert!(fit.targets.targets.is_empty());
    assert_eq!(fit.judged_by_cpu().and_then(|c| c.kernels), Some(2));
    let labels = TvmFfi.labels(&manifest);
    let summary = manifest.summary();
    assert_eq!(TvmFfi.fit_of_labels(summary, &labels), fit);
}

#[test]
fn it_binds_to_the_root_it_was_built_at_and_refuses_any_other() {
    let dir = fixture();
    let built = Path::new(BUILT_AT);
    assert_eq!(
        cache::tree_build_path(dir.path()).unwrap().as_deref(),
        Some(built)
    );
    assert!(cache::relocated_tree(dir.path(), built).unwrap().is_empty());
    let err = cache::relocated_tree(dir.path(), Path::new("/home/user/.cache/tvm-ffi"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "its modules were built at {BUILT_AT} and would be built again at \
             /home/user/.cache/tvm-ffi"
        )) && err.contains(&format!(
            "mount it at {BUILT_AT} (TVM_FFI_CACHE_DIR={BUILT_AT})"
        )),
        "{err}"
    );
}

#[test]
fn what_tvm_ffi_does_not_write_is_refused_naming_it() {
    let dir = fixture();
    let notes = dir.path().join("notes.txt");
    fs::write(&notes, b"mine").unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains(&format!(
            "{} is not part of a TVM-FFI cache",
            notes.display()
        )) && err.contains("a file at the root"),
        "{err}"
    );
    fs::remove_file(&notes).unwrap();

    let add_one = module(dir.path(), "add_one");
    let stray = add_one.join("run.sh");
    fs::write(&stray, b"#!/bin/sh").unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains(&stray.display().to_string())
            && err.contains("a file tvm_ffi.cpp's build does not write"),
        "{err}"
    );
    fs::remove_file(&stray).unwrap();

    let odd = dir.path().join("add_one_nothex");
    fs::create_dir(&odd).unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains(&odd.display().to_string())
            && err.contains("not a module's directory (<name>_<16 hex digits>)"),
        "{err}"
    );
}

#[test]
fn a_torn_module_is_refused_naming_what_tvm_ffi_would_build_again() {
    let torn_by = |break_it: &dyn Fn(&Path), expect: &str| {
        let dir = fixture();
        let scale = module(dir.path(), "scale");
        break_it(&scale);
        let err = refusal(dir.path());
        assert!(
            err.contains("is a torn entry") && err.contains(expect),
            "{expect}: {err}"
        );
    };
    torn_by(
        &|m| fs::write(m.join("scale.so"), b"").unwrap(),
        "a module that is empty",
    );
    torn_by(
        &|m| {
            let so = m.join("scale.so");
            let bytes = fs::read(&so).unwrap();
            fs::write(&so, &bytes[..bytes.len() / 2]).unwrap();
        },
        "that is truncated",
    );
    torn_by(
        &|m| fs::remove_file(m.join("scale.so")).unwrap(),
        "missing: TVM-FFI would build the module again",
    );
    torn_by(
        &|m| fs::remove_file(m.join(".ninja_log")).unwrap(),
        "no .ninja_log",
    );
    torn_by(
        &|m| fs::write(m.join(".ninja_log"), "# ninja log v5\n").unwrap(),
        "it does not list scale.so",
    );
    torn_by(
        &|m| fs::remove_file(m.join("cuda.cu")).unwrap(),
        "no cuda.cu: its build.ninja compiles it",
    );
    torn_by(
        &|m| {
            let ninja = m.join("build.ninja");
            let text = fs::read_to_string(&ninja).unwrap();
            fs::write(&ninja, text.replace("code=sm_90a", "code=sm_x")).unwrap();
        },
        "its device flags name sm_x, which is no GPU architecture",
    );
}

#[test]
fn modules_built_at_two_roots_are_refused_naming_both() {
    let dir = fixture();
    let negate = module(dir.path(), "negate");
    let ninja = negate.join("build.ninja");
    let text = fs::read_to_string(&ninja).unwrap();
    fs::write(&ninja, text.replace(BUILT_AT, "/srv/tvm-ffi")).unwrap();
    let err = refusal(dir.path());
    assert!(
        err.contains("/srv/tvm-ffi") && err.contains(BUILT_AT),
        "{err}"
    );
}

#[test]
fn a_pods_new_files_are_entries_of_their_module_and_locks_are_scratch() {
    assert_eq!(
        TvmFfi.entry_of("triple_0865cbcd65b12524/triple.so"),
        Some("triple_0865cbcd65b12524")
    );
    assert_eq!(TvmFfi.entry_of("stray"), None);
    assert!(
        TvmFfi
            .scratch("triple_0865cbcd65b12524/lock", false)
            .is_some()
    );
    assert!(
        TvmFfi
            .scratch("triple_0865cbcd65b12524/cpp_0.o.d", false)
            .is_some()
    );
    assert!(
        TvmFfi
            .scratch("triple_0865cbcd65b12524/triple.so", false)
            .is_none()
    );
}
