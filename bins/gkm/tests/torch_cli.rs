//! `gkm build`, `inspect`, `check` and `extract` on PyTorch's caches as a
//! user runs them: the real Inductor cache and Mega-Cache blob in
//! `fixtures/torch/` (compiled by torch 2.11.0 on the CPU, AVX2 kernels;
//! see its PROVENANCE).

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gkm_testenv::{Registry, tree_files};

mod support;

/// `fixtures/torch/` of this repository.
fn torch_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/torch")
}

fn gkm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gkm"))
        .args(args)
        .env("DOCKER_CONFIG", "/nonexistent-gkm-test-docker-config")
        .output()
        .expect("run gkm")
}

fn ok(args: &[&str]) -> String {
    let out = gkm(args);
    assert!(
        out.status.success(),
        "gkm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn inspect_json(image: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["inspect", "--json", image])).expect("inspect prints JSON")
}

#[test]
fn an_inductor_cache_builds_into_an_image_inspect_shows_with_its_parts_and_declared_facts() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:v1", dir.path().join("layout").display());
    let cache = torch_fixture().join("inductor");
    ok(&[
        "build",
        cache.to_str().unwrap(),
        "-t",
        &image,
        "--torch-version",
        "2.11.0+cu130",
        "--cpu-isa",
        "avx2",
    ]);
    let doc = inspect_json(&image);
    assert_eq!(doc["kind"], "inductor");
    assert_eq!(doc["declaredTorchVersion"], "2.11.0+cu130");
    assert_eq!(doc["declaredCpuIsa"], "avx2");
    // Two input shapes, two FX graphs (PROVENANCE: 2 FX graph and 2
    // AOTAutograd misses, 12 C++ kernels built, ISA probes included).
    assert_eq!(doc["entryCounts"]["fxgraph"], 2);
    assert_eq!(doc["entryCounts"]["aotautograd"], 2);
    assert_eq!(doc["entryCounts"]["cpp"], 12);
    assert_eq!(
        doc["labels"]["cache.inductor.image/declared-cpu-isa"],
        "avx2"
    );
    let text = ok(&["inspect", &image]);
    assert!(
        text.contains("Torch:       2.11.0+cu130 (declared)"),
        "{text}"
    );
    assert!(text.contains("CPU ISA:     avx2 (declared)"), "{text}");

    // What extract gives back is the tree, byte for byte.
    let out = dir.path().join("extracted");
    ok(&["extract", &image, "-o", out.to_str().unwrap()]);
    assert_eq!(tree_files(&out).unwrap(), tree_files(&cache).unwrap());
}

#[test]
fn a_mega_cache_blob_builds_into_an_image_whose_extract_gives_the_blob_back() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:v1", dir.path().join("layout").display());
    let blob = torch_fixture().join("mega-cache.bin");
    ok(&[
        "build",
        blob.to_str().unwrap(),
        "-t",
        &image,
        "--cpu-isa",
        "avx2",
    ]);
    let doc = inspect_json(&image);
    assert_eq!(doc["kind"], "megacache");
    assert_eq!(doc["entryCounts"]["inductor"], 2);
    assert_eq!(doc["entryCounts"]["aot_autograd"], 2);
    assert_eq!(doc["declaredTorchVersion"], serde_json::Value::Null);
    let out = dir.path().join("extracted");
    ok(&["extract", &image, "-o", out.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(out.join("mega-cache.bin")).unwrap(),
        std::fs::read(&blob).unwrap()
    );
}

#[test]
fn a_cpu_only_cache_fits_a_node_whose_cpu_isa_is_the_declared_one() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:v1", dir.path().join("layout").display());
    let blob = torch_fixture().join("mega-cache.bin");
    ok(&[
        "build",
        blob.to_str().unwrap(),
        "-t",
        &image,
        "--cpu-isa",
        "avx2",
    ]);

    let fits = ok(&["check", &image, "--cpu-isa", "avx2"]);
    assert!(fits.contains("CPU avx2: compatible"), "{fits}");

    let other = gkm(&["check", &image, "--cpu-isa", "avx512"]);
    assert_eq!(other.status.code(), Some(3), "an incompatible node exits 3");
    let text = String::from_utf8_lossy(&other.stdout);
    assert!(
        text.contains("declared built for avx2; Inductor picks avx512"),
        "{text}"
    );

    // Without a declared ISA, no node is known to fit.
    let undeclared = format!("oci:{}:v2", dir.path().join("layout").display());
    ok(&["build", blob.to_str().unwrap(), "-t", &undeclared]);
    let out = gkm(&["check", &undeclared, "--cpu-isa", "avx2"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no declared CPU ISA"));
}

#[test]
fn a_declared_cpu_isa_inductor_does_not_name_or_a_foreign_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:v1", dir.path().join("layout").display());
    let cache = torch_fixture().join("inductor");
    let out = gkm(&[
        "build",
        cache.to_str().unwrap(),
        "-t",
        &image,
        "--cpu-isa",
        "avx3",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"avx3\" is not an ISA Inductor picks"),
        "{err}"
    );

    // An Inductor tree with a file Inductor does not write is refused,
    // naming it, and no image is written.
    let tree = dir.path().join("inductor");
    gkm_testenv::copy_tree(&cache, &tree).unwrap();
    std::fs::write(tree.join("fxgraph/notes.txt"), b"x").unwrap();
    let out = gkm(&["build", tree.to_str().unwrap(), "-t", &image]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fxgraph/notes.txt") && err.contains("not part of an Inductor cache"),
        "{err}"
    );
    assert!(!dir.path().join("layout").exists());
}

#[test]
fn a_cpu_only_cache_is_not_a_variant_of_a_multi_target_image() {
    let dir = tempfile::tempdir().unwrap();
    let image = format!("oci:{}:v1", dir.path().join("layout").display());
    let blob = torch_fixture().join("mega-cache.bin");
    let copy = dir.path().join("other/mega-cache.bin");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&blob, &copy).unwrap();
    let out = gkm(&[
        "build",
        blob.to_str().unwrap(),
        copy.to_str().unwrap(),
        "-t",
        &image,
        "--cpu-isa",
        "avx2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no GPU kernel"), "{err}");
    assert!(err.contains("a node gets a variant by its GPUs"), "{err}");
}

#[test]
fn a_captured_inductor_cache_is_signed_and_labelled_with_what_its_capturer_declared() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    let cache = dir.join("inductor");
    gkm_testenv::copy_tree(&torch_fixture().join("inductor"), &cache).unwrap();
    let keys = support::key_pair(&dir.join("keys"));
    let key = keys.join("cosign.key").display().to_string();
    let target = format!("{}/capture/inductor:v1", registry.addr());
    let out = support::gkm_in(
        &[
            "capture",
            cache.to_str().unwrap(),
            "-t",
            &target,
            "--key",
            &key,
            "--insecure",
            "--torch-version",
            "2.11.0",
            "--cpu-isa",
            "avx2",
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(0), "{}", support::text(&out));
    let pinned = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = support::gkm_in(&["inspect", "--json", "--insecure", &pinned], dir);
    assert!(out.status.success(), "{}", support::text(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "inductor");
    assert_eq!(doc["declaredTorchVersion"], "2.11.0");
    assert_eq!(doc["declaredCpuIsa"], "avx2");
    assert_eq!(doc["entryCounts"]["fxgraph"], 2);
}

/// The real Inductor fixture with a Triton fixture's kernel placed as
/// Inductor places it, `triton/0/<key>/`, its group recording the
/// fixture's build path (PROVENANCE: `/tmp/gkm-torch-fixtures/inductor`):
/// an Inductor cache of a GPU `torch.compile`.
fn inductor_with_triton(dest: &Path, triton_fixture: &str) {
    gkm_testenv::copy_tree(&torch_fixture().join("inductor"), dest).unwrap();
    let fixture = gkm_testenv::fixture_cache(triton_fixture);
    for key in std::fs::read_dir(&fixture).unwrap() {
        let key = key.unwrap().path();
        let key_name = key.file_name().unwrap().to_str().unwrap().to_string();
        if !key.join("__grp__add_kernel.json").exists() {
            continue;
        }
        let to = dest.join("triton/0").join(&key_name);
        std::fs::create_dir_all(&to).unwrap();
        let mut children = serde_json::Map::new();
        for file in std::fs::read_dir(&key).unwrap() {
            let name = file.unwrap().file_name().into_string().unwrap();
            if name.starts_with("__grp__") {
                continue;
            }
            std::fs::copy(key.join(&name), to.join(&name)).unwrap();
            children.insert(
                name.clone(),
                format!("/tmp/gkm-torch-fixtures/inductor/triton/0/{key_name}/{name}").into(),
            );
        }
        std::fs::write(
            to.join("__grp__add_kernel.json"),
            serde_json::to_vec(&serde_json::json!({ "child_paths": children })).unwrap(),
        )
        .unwrap();
    }
}

#[test]
fn inductor_caches_for_two_gpu_targets_make_one_multi_target_image_each_node_gets_its_variant_of() {
    let dir = tempfile::tempdir().unwrap();
    let (cuda, rocm) = (dir.path().join("cuda"), dir.path().join("rocm"));
    inductor_with_triton(&cuda, "triton-vector-add-cuda-sm75");
    inductor_with_triton(&rocm, "triton-vector-add-rocm-gfx90a");
    let image = format!("oci:{}:fleet", dir.path().join("layout").display());
    ok(&[
        "build",
        cuda.to_str().unwrap(),
        rocm.to_str().unwrap(),
        "-t",
        &image,
        "--torch-version",
        "2.11.0",
    ]);
    let doc = inspect_json(&image);
    let variants = doc["variants"].as_array().expect("a multi-target image");
    assert_eq!(variants.len(), 2);
    assert!(variants.iter().all(|v| v["kind"] == "inductor"), "{doc}");

    for (profile, variant) in [("T4", 0), ("MI210", 1)] {
        let gpus = dir.path().join(format!("gpus-{profile}.yaml"));
        std::fs::write(&gpus, format!("gpus:\n  - profile: {profile}\n")).unwrap();
        let out = ok(&["check", &image, "--gpus", gpus.to_str().unwrap(), "--json"]);
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(report["chosen"], variant, "{profile}: {report}");
    }
    // A single variant carries the Inductor root its groups were built at.
    let single = format!("oci:{}:cuda", dir.path().join("single").display());
    ok(&["build", cuda.to_str().unwrap(), "-t", &single]);
    assert_eq!(
        inspect_json(&single)["buildPath"],
        "/tmp/gkm-torch-fixtures/inductor"
    );
}
