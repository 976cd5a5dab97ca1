//! Trees and fixture bytes shared by the integration tests.
#![allow(dead_code)]
// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use gkm_testenv::fixture_cache;

/// The CUDA fixture's kernel directory.
pub const CUDA_KEY: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// The CUDA fixture's `add_kernel.json`.
pub fn cuda_kernel_json() -> Vec<u8> {
    fs::read(
        fixture_cache("triton-vector-add-cuda-sm75")
            .join(CUDA_KEY)
            .join("add_kernel.json"),
    )
    .expect("reading the CUDA fixture's kernel metadata")
}

/// Write a file, creating its parent directories.
pub fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().expect("a parent")).expect("creating a directory");
    fs::write(path, bytes).expect("writing a file");
}

/// Bytes that look like a serialised artefact: binary noise around the
/// given kernel metadata documents, as pickle stores byte strings.
pub fn artefact(documents: &[&[u8]]) -> Vec<u8> {
    let mut blob = vec![0x80, 0x05, 0x95, 0x13, 0x00, 0xff, b'{', 0x8c];
    for doc in documents {
        blob.extend_from_slice(b"\x8c\x0eadd_kernel.json\x94C");
        blob.extend_from_slice(&(doc.len() as u32).to_le_bytes());
        blob.extend_from_slice(doc);
        blob.extend_from_slice(b"\x94\x00\x7f\xfe{\"hash\": \"fx-graph\", \"x\": 1}");
    }
    blob.extend_from_slice(&[0u8; 64]);
    blob
}

/// The vLLM facts of `entry`, an entry of a vLLM cache.
pub fn vllm(entry: &gkm_core::cache::CacheEntry) -> &gkm_core::cache::VllmKernel {
    entry.facts().expect("an entry of a vLLM cache")
}

/// The Triton kernel `entry` is.
pub fn kernel(entry: &gkm_core::cache::CacheEntry) -> &gkm_core::cache::TritonKernel {
    entry.kernel().expect("a Triton kernel")
}

/// The layout a vLLM manifest records.
pub fn vllm_format(
    manifest: &gkm_core::cache::CacheManifest,
) -> Option<gkm_core::cache::VllmFormat> {
    manifest
        .facts::<gkm_core::cache::VllmFacts>()
        .expect("a vLLM manifest")
        .format
}
