//! The GKM/MCV image format: media types, layer paths and label keys.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gkm_core::cache::{CacheKind, CacheManifest, Summary, VllmFormat};

use crate::error::{Error, Result};
pub use gkm_core::image_layout::{INDUCTOR, KindLayout, MANIFEST_FILE, MEGACACHE, TRITON, VLLM};

pub use crate::registry::media_types::{
    DOCKER_CONFIG, DOCKER_LAYER_GZIP, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, MANIFEST_TYPES,
    OCI_CONFIG, OCI_INDEX, OCI_LAYER_GZIP, OCI_LAYER_TAR, OCI_LAYER_ZSTD, OCI_MANIFEST,
};

/// The image title label.
pub const TITLE: &str = "org.opencontainers.image.title";

/// How a layer is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// zstd: smaller and faster to unpack, read by gkm but not by MCV or
    /// GKM's extractor.
    Zstd,
    /// gzip: the default, what MCV writes and what MCV and GKM's extractor
    /// read.
    #[default]
    Gzip,
    /// No compression.
    None,
}

impl Compression {
    /// The compression a layer media type declares.
    pub fn from_media_type(media_type: &str) -> Result<Compression> {
        match media_type {
            OCI_LAYER_ZSTD => Ok(Compression::Zstd),
            OCI_LAYER_GZIP | DOCKER_LAYER_GZIP => Ok(Compression::Gzip),
            OCI_LAYER_TAR | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
            other => Err(Error::format(
                "layer",
                format!(
                    "unsupported media type {other:?}: expected a tar, tar+gzip or tar+zstd layer"
                ),
            )),
        }
    }

    /// The OCI layer media type for this compression.
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Zstd => OCI_LAYER_ZSTD,
            Compression::Gzip => OCI_LAYER_GZIP,
            Compression::None => OCI_LAYER_TAR,
        }
    }
}

/// The labels (and manifest annotations) of a cache image. `build_path`
/// is where the tree was compiled ([`gkm_core::cache::tree_build_path`]),
/// labelled `<prefix>/build-path` when known.
pub fn cache_labels(
    title: &str,
    manifest: &CacheManifest,
    cache_size_bytes: u64,
    build_path: Option<&Path>,
) -> BTreeMap<String, String> {
    let layout = KindLayout::of(manifest.kind());
    let mut labels = BTreeMap::new();
    labels.insert(TITLE.to_string(), title.to_string());
    labels.insert(
        layout.key("entry-count"),
        manifest.entries().len().to_string(),
    );
    labels.insert(layout.key("cache-size-bytes"), cache_size_bytes.to_string());
    labels.insert(layout.key("summary"), manifest.summary_label());
    if let Some(format) = manifest.format_label() {
        labels.insert(layout.key("format"), format);
    }
    if let Some(path) = build_path {
        labels.insert(layout.key(BUILD_PATH), path.display().to_string());
    }
    labels.extend(torch_labels(manifest));
    labels.extend(kserve_labels(manifest));
    labels
}

/// The label (after the kind's prefix) with the Triton versions a PyTorch
/// cache's kernels state, comma-separated.
pub const TRITON_VERSION: &str = "triton-version";
/// The label with the torch version the builder declared.
pub const DECLARED_TORCH_VERSION: &str = "declared-torch-version";
/// The label with the CPU ISA the builder declared.
pub const DECLARED_CPU_ISA: &str = "declared-cpu-isa";
/// The label with a PyTorch cache's entries per part, as compact JSON.
pub const ENTRY_COUNTS: &str = "entry-counts";

/// The labels only PyTorch's caches (Inductor, Mega-Cache) carry: the
/// Triton versions read from the kernels' metadata, the entries per part,
/// and what the builder declared (`declared-*`: gkm did not read it).
pub fn torch_labels(manifest: &CacheManifest) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let Some(torch) = manifest
        .torch
        .as_ref()
        .filter(|_| manifest.kind().is_torch())
    else {
        return labels;
    };
    let layout = KindLayout::of(manifest.kind());
    let versions = manifest.triton_versions();
    if !versions.is_empty() {
        labels.insert(layout.key(TRITON_VERSION), versions.join(","));
    }
    labels.insert(layout.key(ENTRY_COUNTS), torch.counts_label());
    if let Some(version) = &torch.declared_torch_version {
        labels.insert(layout.key(DECLARED_TORCH_VERSION), version.clone());
    }
    if let Some(isa) = &torch.declared_cpu_isa {
        labels.insert(layout.key(DECLARED_CPU_ISA), isa.clone());
    }
    labels
}

/// The label (after the kind's prefix) naming where a cache was compiled.
pub const BUILD_PATH: &str = "build-path";

/// The prefix of the labels that tell KServe's kernel manager how to mount
/// a vLLM cache.
pub const KSERVE_PREFIX: &str = "io.kserve.km";

/// The cache root a vLLM cache is mounted at in a KServe pod, as
/// `VAR=VALUE`.
pub const KSERVE_VLLM_CACHE_ROOT: &str = "VLLM_CACHE_ROOT=/home/kserve/.cache/vllm";

/// The `io.kserve.km/*` labels MCV writes on a vLLM cache image: the
/// framework and cache type, the hash directories (comma-separated,
/// sorted), where below the cache root to mount (`torch_compile_cache`, or
/// `torch_compile_cache/torch_aot_compile` when the first hash directory is
/// an `aot_compile` one) and the cache root variable. None for a Triton
/// cache or a vLLM cache with no hash directory.
pub fn kserve_labels(manifest: &CacheManifest) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if manifest.kind() != CacheKind::Vllm {
        return labels;
    }
    let entries = manifest.entries();
    let key = |name: &str| format!("{KSERVE_PREFIX}/{name}");
    labels.insert(key("framework"), "vllm".to_string());
    labels.insert(key("cache-type"), "torch-compile".to_string());
    let hashes: BTreeSet<&str> = entries
        .iter()
        .filter_map(|e| e.vllm_hash.as_deref())
        .chain(manifest.artefacts.iter().map(|a| a.vllm_hash.as_str()))
        .filter(|h| !h.is_empty())
        .collect();
    let Some(first) = hashes.first().copied() else {
        return labels;
    };
    let aot = entries.iter().any(|e| {
        e.vllm_hash.as_deref() == Some(first) && e.cache_format == Some(VllmFormat::AotCompile)
    }) || manifest
        .artefacts
        .iter()
        .any(|a| a.vllm_hash == first && !a.aot_compile.is_empty());
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

/// What the labels say about a cache image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CacheLabels {
    /// The cache kind.
    pub kind: CacheKind,
    /// The image title, if labelled.
    pub title: Option<String>,
    /// Number of kernels (`entry-count`).
    pub entry_count: Option<u64>,
    /// Bytes of cache files (`cache-size-bytes`).
    pub cache_size_bytes: Option<u64>,
    /// The distinct targets.
    pub summary: Summary,
    /// The vLLM format label, if any.
    pub format: Option<String>,
    /// Where the tree was compiled (`build-path`), if labelled: the path
    /// its Triton group files record.
    pub build_path: Option<String>,
    /// PyTorch caches: the Triton versions the kernels state
    /// (`triton-version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub triton_version: Option<String>,
    /// PyTorch caches: the declared torch version
    /// (`declared-torch-version`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_torch_version: Option<String>,
    /// PyTorch caches: the declared CPU ISA (`declared-cpu-isa`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared_cpu_isa: Option<String>,
    /// PyTorch caches: entries per part (`entry-counts`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry_counts: Option<BTreeMap<String, u64>>,
}

impl CacheLabels {
    /// Read the cache labels from image labels or manifest annotations.
    ///
    /// Fails, naming the label, when the summary is missing or malformed or a
    /// count is not a number.
    pub fn read(labels: &BTreeMap<String, String>) -> Result<CacheLabels> {
        let layout = KindLayout::from_labels(labels).ok_or_else(|| {
            let keys: Vec<String> = gkm_core::image_layout::ALL
                .into_iter()
                .map(|l| l.key("summary"))
                .collect();
            Error::format(
                "image labels",
                format!(
                    "no summary label ({}): not a kernel cache image",
                    keys.join(", ")
                ),
            )
        })?;
        let summary_key = layout.key("summary");
        let summary =
            Summary::from_label(labels.get(&summary_key).map(String::as_str).unwrap_or(""))
                .map_err(|e| Error::format(format!("label {summary_key}"), e))?;
        let number = |name: &str| -> Result<Option<u64>> {
            let key = layout.key(name);
            labels
                .get(&key)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|e| Error::format(format!("label {key}"), e))
                })
                .transpose()
        };
        Ok(CacheLabels {
            kind: layout.kind,
            title: labels.get(TITLE).cloned(),
            entry_count: number("entry-count")?,
            cache_size_bytes: number("cache-size-bytes")?,
            summary,
            format: labels.get(&layout.key("format")).cloned(),
            build_path: labels.get(&layout.key(BUILD_PATH)).cloned(),
            triton_version: labels.get(&layout.key(TRITON_VERSION)).cloned(),
            declared_torch_version: labels.get(&layout.key(DECLARED_TORCH_VERSION)).cloned(),
            declared_cpu_isa: labels.get(&layout.key(DECLARED_CPU_ISA)).cloned(),
            entry_counts: labels
                .get(&layout.key(ENTRY_COUNTS))
                .map(|v| {
                    serde_json::from_str(v).map_err(|e| {
                        Error::format(format!("label {}", layout.key(ENTRY_COUNTS)), e)
                    })
                })
                .transpose()?,
        })
    }
}
