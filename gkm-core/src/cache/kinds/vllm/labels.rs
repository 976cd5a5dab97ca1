//! The labels only vLLM cache images carry: the layouts they hold
//! (`cache.vllm.image/format`, as MCV writes it) and the `io.kserve.km/*`
//! labels that tell KServe's kernel manager how to mount them.

use std::collections::BTreeMap;

use super::{VllmFacts, hashes, vllm_kernels};
use crate::cache::{CacheKind, CacheManifest, VllmFormat};

/// The prefix of the labels that tell KServe's kernel manager how to mount
/// a vLLM cache.
pub const KSERVE_PREFIX: &str = "io.kserve.km";

/// The cache root a vLLM cache is mounted at in a KServe pod, as
/// `VAR=VALUE`.
pub const KSERVE_VLLM_CACHE_ROOT: &str = "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm";

/// The layouts of a vLLM cache's entries, in MCV's order (`aot_compile`,
/// `binary`, `triton`), without repeats; when no entry records one, the
/// manifest's ([`VllmFacts::format`]). Empty for a cache of another kind.
pub fn formats(manifest: &CacheManifest) -> Vec<VllmFormat> {
    if manifest.kind() != CacheKind::Vllm {
        return Vec::new();
    }
    let mut formats: Vec<VllmFormat> = vllm_kernels(manifest)
        .filter_map(|e| e.cache_format)
        .collect();
    if formats.is_empty() {
        formats.extend(manifest.facts::<VllmFacts>().and_then(|f| f.format));
    }
    formats.sort_by_key(|f| std::cmp::Reverse(*f));
    formats.dedup();
    formats
}

/// The `cache.vllm.image/format` label value as MCV writes it: the
/// layouts joined by commas (`aot_compile,triton`); `None` for a cache of
/// another kind or a vLLM one without a known layout.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let key = dir.path().join("torch_compile_cache/d4ec7c2a7d/rank_0_0/triton_cache/KEY");
/// # std::fs::create_dir_all(&key)?;
/// # std::fs::write(key.join("k.json"), br#"{"hash":"h","target":{"backend":"hip","arch":"gfx90a","warp_size":64}}"#)?;
/// # std::fs::write(key.join("__grp__k.json"), br#"{"child_paths": {}}"#)?;
/// use gkm_core::cache::kinds::vllm;
/// let manifest = gkm_core::cache::scan(dir.path())?;
/// assert_eq!(vllm::format_label(&manifest).as_deref(), Some("triton"));
/// # Ok(()) }
/// ```
pub fn format_label(manifest: &CacheManifest) -> Option<String> {
    let names: Vec<&str> = formats(manifest)
        .into_iter()
        .map(VllmFormat::as_str)
        .collect();
    (!names.is_empty()).then(|| names.join(","))
}

/// The `io.kserve.km/*` labels MCV writes on a vLLM cache image: the
/// framework and cache type, the hash directories (comma-separated,
/// sorted), where below the cache root to mount (`torch_compile_cache`, or
/// `torch_compile_cache/torch_aot_compile` when the first hash directory is
/// an `aot_compile` one) and the cache root variable. None for a cache of
/// another kind; only the first two for a vLLM cache with no hash
/// directory.
pub fn kserve_labels(manifest: &CacheManifest) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if manifest.kind() != CacheKind::Vllm {
        return labels;
    }
    let key = |name: &str| format!("{KSERVE_PREFIX}/{name}");
    labels.insert(key("framework"), "vllm".to_string());
    labels.insert(key("cache-type"), "torch-compile".to_string());
    let hashes = hashes(manifest);
    let Some(first) = hashes.first().copied() else {
        return labels;
    };
    let aot = vllm_kernels(manifest).any(|e| {
        e.vllm_hash.as_deref() == Some(first) && e.cache_format == Some(VllmFormat::AotCompile)
    }) || manifest.facts::<VllmFacts>().is_some_and(|f| {
        f.artefacts
            .iter()
            .any(|a| a.vllm_hash == first && !a.aot_compile.is_empty())
    });
    let subpath = if aot {
        "torch_compile_cache/torch_aot_compile"
    } else {
        "torch_compile_cache"
    };
    labels.insert(
        key("cache-hash"),
        hashes.into_iter().collect::<Vec<_>>().join(","),
    );
    labels.insert(key("cache-mount-subpath"), subpath.to_string());
    labels.insert(key("cache-root-env"), KSERVE_VLLM_CACHE_ROOT.to_string());
    labels
}
