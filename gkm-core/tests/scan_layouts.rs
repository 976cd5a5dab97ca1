//! Scanning cache layouts without a real fixture (vLLM's binary, unpacked
//! and aot_compile layouts), built from the real fixtures' kernels, and what
//! scanning says about trees that are not caches.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;

use common::{CUDA_KEY, artefact, cuda_kernel_json, kernel, vllm, vllm_format, write};
use gkm_core::cache::kinds::vllm as vllm_kind;
use gkm_core::cache::{self, CacheError, CacheManifest, VllmFormat};
use gkm_testenv::{copy_tree, fixture_cache};

/// The ROCm fixture's kernel metadata.
fn rocm_kernel_json() -> Vec<u8> {
    fs::read(
        fixture_cache("triton-vector-add-rocm-gfx90a")
            .join("MCELTMXFCSPAMZYLZ3C3WPPYYVTVR4QOYNE52X3X6FIH7Z6N6X5A/add_kernel.json"),
    )
    .unwrap()
}

#[test]
fn binary_layout_reads_kernels_bundled_in_artefacts() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir
        .path()
        .join("torch_compile_cache/0a1b2c3d4e/rank_0_0/backbone");
    write(
        &prefix.join("cache_key_factors.json"),
        br#"{"code_hash":"c","env":{"VLLM_TARGET_DEVICE":"cuda"}}"#,
    );
    let (cuda, rocm) = (cuda_kernel_json(), rocm_kernel_json());
    write(
        &prefix.join("artifact_compile_range_1_8192_subgraph_0"),
        &artefact(&[&cuda, &cuda]),
    );
    write(
        &prefix.join("artifact_compile_range_1_8192_subgraph_1"),
        &artefact(&[&rocm]),
    );
    write(
        &prefix.join("computation_graph.py"),
        b"{\"hash\": \"not a kernel\"}",
    );

    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(vllm_format(&manifest), Some(VllmFormat::Binary));
    let keys: Vec<_> = manifest.entries().iter().map(|e| e.key()).collect();
    assert_eq!(
        keys,
        [
            "rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0",
            "rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_1"
        ]
    );
    assert!(
        manifest
            .entries()
            .iter()
            .all(|e| vllm(e).cache_format == Some(VllmFormat::Binary))
    );
    // The CUDA metadata records no PTX version and a blob has no .ptx file.
    assert_eq!(manifest.summary().to_string(), "cuda/75/32, hip/gfx90a/64");
    // MCV names CUDA architectures sm_XY in a binary cache's summary label.
    assert_eq!(
        manifest.summary_label(),
        r#"{"targets":[{"backend":"cuda","arch":"sm_75","warp_size":32},{"backend":"hip","arch":"gfx90a","warp_size":64,"triton_version":"3.2.0"}]}"#
    );
    assert_eq!(
        cache::Summary::from_label(&manifest.summary_label()).unwrap(),
        manifest.summary()
    );
    // MCV's `binary` record of the prefix directory sits in the group.
    let json: serde_json::Value = serde_json::from_slice(&manifest.to_json()).unwrap();
    let group = &json["vllm"][0];
    assert_eq!(group["vllmHash"], "0a1b2c3d4e");
    assert_eq!(group["cacheFormat"], "binary");
    assert_eq!(group["triton"].as_array().unwrap().len(), 2);
    assert_eq!(
        group["binary"],
        serde_json::json!([{
            "rank": "rank_0_0",
            "prefix": "backbone",
            "artifact_count": 2,
            "artifact_names": [
                "artifact_compile_range_1_8192_subgraph_0",
                "artifact_compile_range_1_8192_subgraph_1"
            ],
            "code_hash": "c",
            "cache_save_format": "binary",
            "target_device": "cuda",
            "env": {"VLLM_TARGET_DEVICE": "cuda"}
        }])
    );
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
}

#[test]
fn unpacked_artefacts_hold_triton_cache_directories() {
    let dir = tempfile::tempdir().unwrap();
    let artefact = dir
        .path()
        .join("torch_compile_cache/5e6f/rank_1_0/backbone/artifact_shape_None_subgraph_0");
    copy_tree(
        &fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY),
        &artefact.join("triton/0").join(CUDA_KEY),
    )
    .unwrap();
    fs::create_dir_all(artefact.join("fxgraph/ab")).unwrap();

    let manifest = cache::scan(&dir.path().join("torch_compile_cache")).unwrap();
    assert_eq!(vllm_format(&manifest), Some(VllmFormat::Binary));
    let [entry] = manifest.entries() else {
        panic!("{manifest:?}")
    };
    assert_eq!(entry.key(), CUDA_KEY);
    assert_eq!(vllm(entry).vllm_hash.as_deref(), Some("5e6f"));
    assert_eq!(
        kernel(entry).ptx_version,
        Some(84),
        "read from the kernel's .ptx"
    );
}

#[test]
fn aot_compile_layout_reads_the_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let compile_cache = dir.path().join("torch_compile_cache");
    let aot = compile_cache.join("torch_aot_compile/1f0359061970579f");
    write(
        &aot.join("rank_0_0/model"),
        &artefact(&[&rocm_kernel_json()]),
    );
    write(
        &aot.join("rank_1_0/model"),
        &artefact(&[&rocm_kernel_json()]),
    );
    // A triton-layout entry next to it: the cache mixes layouts.
    copy_tree(
        &fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY),
        &compile_cache
            .join("77aa/rank_0_0/triton_cache")
            .join(CUDA_KEY),
    )
    .unwrap();
    fs::create_dir_all(compile_cache.join("modelinfos")).unwrap();

    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(vllm_format(&manifest), Some(VllmFormat::AotCompile));
    let found: Vec<_> = manifest
        .entries()
        .iter()
        .map(|e| {
            (
                vllm(e).vllm_hash.as_deref().unwrap(),
                e.key(),
                vllm(e).cache_format.unwrap(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            ("1f0359061970579f", "rank_0_0/model", VllmFormat::AotCompile),
            ("1f0359061970579f", "rank_1_0/model", VllmFormat::AotCompile),
            ("77aa", CUDA_KEY, VllmFormat::Triton),
        ]
    );
    assert_eq!(manifest.summary().to_string(), "cuda/75/32, hip/gfx90a/64");
    // No binary artefacts: architectures keep their bare form, as MCV's.
    assert_eq!(manifest.summary_label(), manifest.summary().to_label());
    // MCV's `aot_compile` records, one per rank's model file.
    let json: serde_json::Value = serde_json::from_slice(&manifest.to_json()).unwrap();
    let aot_group = json["vllm"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["cacheFormat"] == "aot_compile")
        .unwrap();
    let size = fs::metadata(aot.join("rank_0_0/model")).unwrap().len();
    assert_eq!(
        aot_group["aot_compile"][0],
        serde_json::json!({"hash": "1f0359061970579f", "rank": "rank_0_0",
            "model_file": "model", "file_size": size})
    );
    assert_eq!(aot_group["aot_compile"].as_array().unwrap().len(), 2);
    assert_eq!(
        CacheManifest::from_json(&manifest.to_json()).unwrap(),
        manifest
    );
    // So is torch_aot_compile on its own, and one AOT hash directory.
    let aot_root = cache::scan(&compile_cache.join("torch_aot_compile")).unwrap();
    assert_eq!(vllm_format(&aot_root), Some(VllmFormat::AotCompile));
    assert_eq!(aot_root.entries().len(), 2);
    let alone = cache::scan(&aot).unwrap();
    assert_eq!(vllm_format(&alone), Some(VllmFormat::AotCompile));
    assert_eq!(alone.entries().len(), 2);
}

#[test]
fn not_a_cache_names_the_directory_and_what_was_expected() {
    let dir = tempfile::tempdir().unwrap();
    let err = cache::scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::NotACache { path, .. } if path == dir.path()),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    assert!(
        msg.contains("Triton cache") && msg.contains("vLLM cache"),
        "{msg}"
    );

    // A torch_compile_cache without rank directories.
    fs::create_dir_all(dir.path().join("torch_compile_cache/abc/inductor_cache")).unwrap();
    let err = cache::scan(dir.path()).unwrap_err();
    let CacheError::NotACache { path, expected } = &err else {
        panic!("{err}")
    };
    assert_eq!(path, &dir.path().join("torch_compile_cache"));
    assert!(expected.contains("rank_<rank>_<dp_rank>"), "{err}");

    // A file.
    let file = dir.path().join("f");
    fs::write(&file, b"x").unwrap();
    assert!(matches!(
        cache::scan(&file),
        Err(CacheError::NotACache { .. })
    ));
    // Nothing there.
    assert!(matches!(
        cache::scan(&dir.path().join("missing")),
        Err(CacheError::Io { .. })
    ));
}

#[test]
fn launcher_and_autotune_directories_alone_are_not_a_cache() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path()
            .join("NNIRBEH2OVXHBOQBWMZABZQUTHRBNTKPWP7Q45RX7SE5JGCMEUPA/cuda_utils.so"),
        b"\x7fELF",
    );
    write(
        &dir.path().join("ABC/add_kernel.autotune.json"),
        br#"{"key":[1],"configs_timings":[]}"#,
    );
    assert!(matches!(
        cache::scan(dir.path()),
        Err(CacheError::NotACache { .. })
    ));
}

#[test]
fn bad_kernel_metadata_names_the_file_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture_cache("triton-vector-add-cuda-sm75"), dir.path()).unwrap();
    let meta = dir.path().join(CUDA_KEY).join("add_kernel.json");
    fs::write(
        &meta,
        br#"{"hash": "h", "target": {"backend": "cuda", "arch": "ampere", "warp_size": 32}}"#,
    )
    .unwrap();
    let err = cache::scan(dir.path()).unwrap_err();
    let CacheError::BadMetadata { path, reason } = &err else {
        panic!("{err}")
    };
    assert_eq!(path, &meta);
    assert!(
        reason.contains("arch") && reason.contains("ampere"),
        "{err}"
    );

    fs::write(&meta, b"{\"hash\": \"h\", \"tar").unwrap();
    let err = cache::scan(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CacheError::BadMetadata { path, .. } if path == &meta),
        "{err}"
    );

    fs::remove_file(&meta).unwrap();
    let err = cache::scan(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("__grp__add_kernel.json") && err.contains("add_kernel.json"),
        "{err}"
    );
}

#[test]
fn reads_mcv_vllm_manifests() {
    // MCV groups kernels by vLLM hash and lists binary artefacts apart.
    let json = br#"{"vllm":[
        {"vllmHash":"d4ec7c2a7d","cacheFormat":"triton","triton":[
            {"hash":"12cc","dummy_key":"CLGE","ptx_version":0,"num_stages":1,"num_warps":4,
             "backend":"rocm","arch":"gfx90a","warp_size":64}]},
        {"vllmHash":"e5f6","cacheFormat":"binary","binary":[
            {"rank":"rank_0_0","prefix":"backbone","artifact_count":2,"cache_save_format":"binary"}]},
        {"vllmHash":"a1","cacheFormat":"mega-aot","triton":null}
    ]}"#;
    let manifest = CacheManifest::from_json(json).unwrap();
    let [entry] = manifest.entries() else {
        panic!("{manifest:?}")
    };
    assert_eq!(vllm(entry).vllm_hash.as_deref(), Some("d4ec7c2a7d"));
    assert_eq!(vllm(entry).cache_format, Some(VllmFormat::Triton));
    assert_eq!(manifest.summary().to_string(), "hip/gfx90a/64");

    let err = CacheManifest::from_json(br#"{"vllm":[{"vllmHash":"a","triton":[]},{"hash":"x"}]}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("manifest.json") && err.contains("vllm[1]") && err.contains("backend"),
        "{err}"
    );
}

#[test]
fn format_label_lists_every_layout_in_mcv_order() {
    let dir = tempfile::tempdir().unwrap();
    let compile_cache = dir.path().join("torch_compile_cache");
    write(
        &compile_cache.join("torch_aot_compile/aa/rank_0_0/model"),
        &artefact(&[&rocm_kernel_json()]),
    );
    copy_tree(
        &fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY),
        &compile_cache
            .join("bb/rank_0_0/triton_cache")
            .join(CUDA_KEY),
    )
    .unwrap();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(
        vllm_kind::formats(&manifest),
        [VllmFormat::AotCompile, VllmFormat::Triton]
    );
    assert_eq!(
        vllm_kind::format_label(&manifest).as_deref(),
        Some("aot_compile,triton")
    );
    let triton = cache::scan(&fixture_cache("triton-vector-add-cuda-sm75")).unwrap();
    assert_eq!(vllm_kind::format_label(&triton), None);
}

#[test]
fn vllm_manifests_read_back_whatever_their_shape() {
    let entry = r#"{"hash":"h","backend":"cuda","arch":"75","warp_size":32,"vllm_hash":""}"#;
    for json in [
        format!(r#"{{"vllm":[{entry}]}}"#),
        format!(r#"{{"vllm":[{{"vllmHash":"","triton":[{entry}]}}]}}"#),
        format!(r#"{{"vllm":[{{"vllmHash":"x","cacheFormat":"binary","triton":[{entry}]}}]}}"#),
    ] {
        let manifest = CacheManifest::from_json(json.as_bytes()).unwrap();
        assert_eq!(
            CacheManifest::from_json(&manifest.to_json()).unwrap(),
            manifest,
            "{json}"
        );
    }
}
