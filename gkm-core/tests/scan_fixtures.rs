//! Scanning the real Triton and vLLM caches in `shared/fixtures/caches`.

mod common;

use common::{CUDA_KEY, kernel, vllm, vllm_format};
use gkm_core::cache::{self, CacheError, CacheKind, VllmFormat};
use gkm_testenv::{copy_tree, copy_tree_in_order, fixture_cache};

#[test]
fn cuda_triton_cache() {
    let manifest = cache::scan(&fixture_cache("triton-vector-add-cuda-sm75")).unwrap();
    assert_eq!(manifest.kind(), CacheKind::Triton);
    // Three key directories, one of them a kernel: the launcher and
    // cuda_utils directories are not kernels.
    let [entry] = manifest.entries() else {
        panic!("one kernel expected: {manifest:?}")
    };
    assert_eq!(kernel(entry).name.as_deref(), Some("add_kernel"));
    assert_eq!(entry.key(), CUDA_KEY);
    assert_eq!(
        kernel(entry).hash,
        "edbea4c0734897ca19ec52852fcc847e552b3b1cfff92cc3deff0b695cdd636f"
    );
    assert_eq!(
        (
            kernel(entry).num_warps,
            kernel(entry).num_stages,
            kernel(entry).debug
        ),
        (4, 3, false)
    );
    // The metadata says null; the PTX says `.version 8.4`.
    assert_eq!(kernel(entry).ptx_version, Some(84));
    assert_eq!(manifest.summary().to_string(), "cuda/75/32");
    insta::assert_snapshot!(String::from_utf8(manifest.to_json()).unwrap());
    insta::assert_snapshot!(manifest.summary().to_label(), @r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32,"ptx_version":84}]}"#);
}

#[test]
fn rocm_triton_cache() {
    let manifest = cache::scan(&fixture_cache("triton-vector-add-rocm-gfx90a")).unwrap();
    let [entry] = manifest.entries() else {
        panic!("one kernel expected: {manifest:?}")
    };
    assert_eq!(kernel(entry).triton_version.as_deref(), Some("3.2.0"));
    assert_eq!(kernel(entry).ptx_version, None);
    assert_eq!(manifest.summary().to_string(), "hip/gfx90a/64");
    insta::assert_snapshot!(manifest.summary().to_label(), @r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64,"triton_version":"3.2.0"}]}"#);
}

#[test]
fn vllm_cache_from_any_of_its_roots() {
    let root = fixture_cache("vllm-torch-compile-inductor");
    let manifest = cache::scan(&root).unwrap();
    assert_eq!(manifest.kind(), CacheKind::Vllm);
    assert_eq!(vllm_format(&manifest), Some(VllmFormat::Triton));
    let names: Vec<_> = manifest
        .entries()
        .iter()
        .map(|e| kernel(e).name.as_deref().unwrap_or(""))
        .collect();
    assert_eq!(names.len(), 6, "{names:?}");
    assert!(
        manifest
            .entries()
            .iter()
            .all(|e| vllm(e).vllm_hash.as_deref() == Some("d4ec7c2a7d")
                && vllm(e).cache_format == Some(VllmFormat::Triton))
    );
    assert_eq!(manifest.summary().to_string(), "hip/gfx90a/64");
    insta::assert_snapshot!(String::from_utf8(manifest.to_json()).unwrap());

    let compile_cache = root.join("torch_compile_cache");
    assert_eq!(cache::scan(&compile_cache).unwrap(), manifest);
    assert_eq!(
        cache::scan(&compile_cache.join("d4ec7c2a7d")).unwrap(),
        manifest
    );
}

#[test]
fn manifests_read_back() {
    for name in [
        "triton-vector-add-cuda-sm75",
        "triton-vector-add-rocm-gfx90a",
        "vllm-torch-compile-inductor",
    ] {
        let manifest = cache::scan(&fixture_cache(name)).unwrap();
        let read = cache::CacheManifest::from_json(&manifest.to_json()).unwrap();
        assert_eq!(read, manifest, "{name}");
    }
}

#[test]
fn same_tree_same_manifest_whatever_the_creation_order() {
    for name in ["triton-vector-add-cuda-sm75", "vllm-torch-compile-inductor"] {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        copy_tree(&fixture_cache(name), a.path()).unwrap();
        copy_tree_in_order(&fixture_cache(name), b.path(), true).unwrap();
        let (ma, mb) = (
            cache::scan(a.path()).unwrap(),
            cache::scan(b.path()).unwrap(),
        );
        assert_eq!(ma.to_json(), mb.to_json(), "{name}");
        assert_eq!(ma, cache::scan(&fixture_cache(name)).unwrap(), "{name}");
    }
}

#[test]
fn extracted_image_layout() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(
        &fixture_cache("triton-vector-add-rocm-gfx90a"),
        &dir.path().join("io.triton.cache"),
    )
    .unwrap();
    let manifest = cache::scan(dir.path()).unwrap();
    assert_eq!(
        manifest,
        cache::scan(&fixture_cache("triton-vector-add-rocm-gfx90a")).unwrap()
    );
}

#[test]
fn a_kernel_directory_is_not_a_cache_root() {
    let key = fixture_cache("triton-vector-add-cuda-sm75").join(CUDA_KEY);
    let err = cache::scan(&key).unwrap_err();
    let CacheError::NotACache { path, expected } = &err else {
        panic!("{err}")
    };
    assert_eq!(path, &key);
    assert!(
        expected.contains("__grp__<kernel>.json") && expected.contains("torch_compile_cache"),
        "{err}"
    );
}
