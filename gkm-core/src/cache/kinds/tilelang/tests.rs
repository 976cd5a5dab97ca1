//! The TileLang kind on the real TileLang cache in `fixtures/tilelang`
//! (`hack/fixtures/tilelang.sh`: GEMM kernels compiled without a GPU for
//! sm_90a and sm_80), and on copies of it broken as a crash, a hand or an
//! attacker would break them.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::cache::{self, CacheError};

const VERSION: &str = "0.1.15";
const HOST: &str = "linux-x86_64";

/// A copy of the fixture, which a test may break.
fn fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    gkm_testenv::copy_tree(
        &gkm_testenv::repo_root().join("fixtures/tilelang/cache"),
        dir.path(),
    )
    .unwrap();
    dir
}

fn entries(manifest: &CacheManifest) -> Vec<&TileLangEntry> {
    super::super::own_entries(manifest)
}

/// The entry directories of `part` in the tree at `root`.
fn dirs(root: &Path, part: &str) -> Vec<PathBuf> {
    let dir = match part {
        "cuda-binaries" => root.join(VERSION).join(part),
        _ => root.join(VERSION).join(HOST).join(part),
    };
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    found.sort();
    found
}

fn refusal(root: &Path) -> CacheError {
    cache::scan(root).unwrap_err()
}

#[test]
fn a_real_tilelang_cache_is_its_kernels_and_binaries_by_their_cubins_architecture() {
    let dir = fixture();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(manifest.kind(), CacheKind::TileLang);
    let found = entries(&manifest);
    let kernels: Vec<_> = found.iter().filter(|e| e.part == Part::Kernel).collect();
    let binaries: Vec<_> = found.iter().filter(|e| e.part == Part::Binary).collect();
    assert_eq!((kernels.len(), binaries.len()), (3, 3), "{found:?}");
    for kernel in &kernels {
        assert_eq!(kernel.tilelang_version, VERSION);
        assert_eq!(kernel.host.as_deref(), Some(HOST));
        assert_eq!(kernel.backend, "tvm_ffi");
        assert!(kernel.key.starts_with("0.1.15/linux-x86_64/kernels/"));
    }
    for binary in &binaries {
        assert_eq!(binary.backend, "cubin");
        assert_eq!(binary.host, None);
    }
    // The SMs of the cubins the kernels' libraries embed: two for sm_90a,
    // one for sm_80, and the binaries the same.
    let mut archs: Vec<String> = kernels
        .iter()
        .map(|k| k.archs.iter().map(|a| a.as_str().to_string()).collect())
        .collect();
    archs.sort();
    assert_eq!(archs, ["80", "90", "90"]);
    assert_eq!(manifest.fit().targets.to_string(), "cuda/80/32, cuda/90/32");
    assert_eq!(manifest.fit().frameworks["tilelang"], [VERSION]);
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
    // No key names a path: it is found wherever TILELANG_CACHE_DIR points.
    assert_eq!(cache::tree_build_path(dir.path()).unwrap(), None);
}

#[test]
fn a_writable_views_upper_is_new_entries_and_tilelangs_staging() {
    let rules = CacheKind::TileLang.rules();
    for scratch in [
        "0.1.15/linux-x86_64/.staging",
        "0.1.15/linux-x86_64/.staging/d999_123_ab12cd34/params.json",
        "0.1.15/.staging/cuda-binaries/1ac9.123.ab/kernel.cubin",
        "0.1.15/linux-x86_64/kernels/d999/.kernel.123_ab.tmp.cubin",
    ] {
        assert!(rules.scratch(scratch, false).is_some(), "{scratch}");
    }
    for (file, entry) in [
        (
            "0.1.15/linux-x86_64/kernels/d999/executable.so",
            "0.1.15/linux-x86_64/kernels/d999",
        ),
        (
            "0.1.15/linux-x86_64/autotuner/4f2e/best_config.json",
            "0.1.15/linux-x86_64/autotuner/4f2e",
        ),
        (
            "0.1.15/cuda-binaries/1ac9/metadata.json",
            "0.1.15/cuda-binaries/1ac9",
        ),
    ] {
        assert_eq!(rules.scratch(file, false), None, "{file}");
        assert_eq!(rules.entry_of(file), Some(entry), "{file}");
    }
    assert_eq!(rules.entry_of("0.1.15/linux-x86_64/kernels"), None);
}

#[test]
fn a_kernel_that_does_not_match_tilelangs_manifest_is_refused_naming_it() {
    let dir = fixture();
    let root = dir.path();
    let kernel = dirs(root, "kernels").remove(0);
    let library = kernel.join("executable.so");
    let bytes = fs::read(&library).unwrap();

    // A byte changed (a torn copy, a tampered library): TileLang deletes
    // the entry and compiles again.
    let mut changed = bytes.clone();
    let last = changed.len() - 1;
    changed[last] ^= 1;
    fs::write(&library, &changed).unwrap();
    let err = refusal(root);
    assert!(matches!(err, CacheError::TornEntry { .. }), "{err}");
    let said = err.to_string();
    assert!(said.contains("executable.so"), "{said}");
    assert!(said.contains("its manifest says"), "{said}");
    assert!(said.contains("compile it again"), "{said}");

    // Missing: no backend's library.
    fs::remove_file(&library).unwrap();
    assert!(refusal(root).to_string().contains("no kernel library"));
    fs::write(&library, &bytes).unwrap();

    // A file the manifest does not list, and a manifest that is not one.
    fs::write(kernel.join("notes.txt"), "x").unwrap();
    assert!(matches!(refusal(root), CacheError::Foreign { .. }));
    fs::remove_file(kernel.join("notes.txt")).unwrap();
    let manifest = kernel.join("manifest.json");
    let listed = fs::read(&manifest).unwrap();
    fs::write(&manifest, b"{\"version\": 2, \"files\": {}}").unwrap();
    assert!(refusal(root).to_string().contains("version 2"));
    fs::write(&manifest, b"[1, 2").unwrap();
    assert!(
        refusal(root)
            .to_string()
            .contains("not TileLang's kernel manifest")
    );
    fs::write(&manifest, &listed).unwrap();
    assert!(cache::scan(root).is_ok());
}

#[test]
fn a_binary_that_does_not_match_its_metadata_is_refused_naming_it() {
    let dir = fixture();
    let root = dir.path();
    let binary = dirs(root, "cuda-binaries").remove(0);
    let cubin = binary.join("kernel.cubin");
    let bytes = fs::read(&cubin).unwrap();
    fs::write(&cubin, &bytes[..bytes.len() / 2]).unwrap();
    let said = refusal(root).to_string();
    assert!(said.contains("its metadata.json says"), "{said}");
    fs::write(&cubin, &bytes).unwrap();

    let metadata = binary.join("metadata.json");
    let meta = fs::read_to_string(&metadata).unwrap();
    fs::write(
        &metadata,
        meta.replace(
            "tilelang.cuda-binary-cache.v1",
            "tilelang.cuda-binary-cache.v0",
        ),
    )
    .unwrap();
    assert!(refusal(root).to_string().contains("cuda-binary-cache.v0"));
    fs::remove_file(&metadata).unwrap();
    assert!(refusal(root).to_string().contains("no metadata.json"));
    fs::write(&metadata, &meta).unwrap();

    // A second binary where TileLang writes one.
    fs::write(binary.join("kernel.ptx"), ".target sm_90a").unwrap();
    assert!(refusal(root).to_string().contains("2 binaries"));
    fs::remove_file(binary.join("kernel.ptx")).unwrap();
    assert!(cache::scan(root).is_ok());
}

#[test]
fn what_tilelang_does_not_write_is_refused_and_staging_is_not_an_entry() {
    let dir = fixture();
    let root = dir.path();
    // TileLang's staging directories, with a crashed writer's leftovers.
    let staging = root.join(VERSION).join(HOST).join(".staging/d999_1_ab");
    fs::create_dir_all(&staging).unwrap();
    fs::write(staging.join("params.json"), "{}").unwrap();
    fs::create_dir_all(root.join(VERSION).join(".staging/cuda-binaries")).unwrap();
    assert_eq!(cache::scan(root).unwrap().entries().len(), 6);

    for (path, said) in [
        ("0.1.15/ascend-binaries/ab", "Ascend NPU binaries"),
        (
            "0.1.15/linux-x86_64/cutlass",
            "a directory TileLang does not write",
        ),
        ("not-a-version/kernels", "not a TileLang version directory"),
    ] {
        let made = root.join(path);
        // The shallowest directory the case adds, removed after it.
        let added = made
            .ancestors()
            .filter(|a| a.starts_with(root) && !a.exists())
            .last()
            .unwrap()
            .to_path_buf();
        fs::create_dir_all(&made).unwrap();
        let err = refusal(root);
        assert!(matches!(err, CacheError::Foreign { .. }), "{path}: {err}");
        assert!(err.to_string().contains(said), "{path}: {err}");
        fs::remove_dir_all(&added).unwrap();
    }
    assert!(cache::scan(root).is_ok());

    // An autotuning result without its pickled function is torn.
    let tuning = root.join(VERSION).join(HOST).join("autotuner/4f2e");
    let kernel = dirs(root, "kernels").remove(0);
    gkm_testenv::copy_tree(&kernel, &tuning).unwrap();
    fs::remove_file(tuning.join("manifest.json")).unwrap();
    for file in ["best_config.json", "latency.json"] {
        fs::write(tuning.join(file), "{}").unwrap();
    }
    assert!(refusal(root).to_string().contains("no function.pkl"));
    fs::write(tuning.join("function.pkl"), b"\x80\x05N.").unwrap();
    let manifest = cache::scan(root).unwrap();
    let tuned = entries(&manifest)
        .into_iter()
        .find(|e| e.part == Part::Tuning)
        .unwrap();
    assert_eq!(tuned.key, "0.1.15/linux-x86_64/autotuner/4f2e");
    assert!(!tuned.archs.is_empty());
}

#[test]
fn a_library_holding_rocm_code_is_refused_rather_than_taken_for_a_cpu_kernel() {
    let dir = fixture();
    let root = dir.path();
    let binary = dirs(root, "cuda-binaries").remove(0);
    let cubin = binary.join("kernel.cubin");
    let mut bytes = fs::read(&cubin).unwrap();
    // e_machine EM_AMDGPU (224).
    bytes[18..20].copy_from_slice(&224u16.to_le_bytes());
    fs::write(&cubin, &bytes).unwrap();
    let digest = crate::digest::Digest::of(&bytes);
    let metadata = binary.join("metadata.json");
    let meta: serde_json::Value = serde_json::from_slice(&fs::read(&metadata).unwrap()).unwrap();
    let old = meta["sha256"].as_str().unwrap().to_string();
    let text = fs::read_to_string(&metadata)
        .unwrap()
        .replace(&old, digest.hex());
    fs::write(&metadata, text).unwrap();
    assert!(refusal(root).to_string().contains("ROCm code"));
}
