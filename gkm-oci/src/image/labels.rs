//! The GKM/MCV image format: media types, layer paths and label keys.

use std::collections::BTreeMap;
use std::path::Path;

use gkm_core::cache::{CacheKind, CacheManifest, Summary};

use crate::error::{Error, Result};
pub use gkm_core::cache::kinds::vllm::{KSERVE_PREFIX, KSERVE_VLLM_CACHE_ROOT, kserve_labels};
pub use gkm_core::cache::{
    DECLARED_CPU_ISA_LABEL as DECLARED_CPU_ISA,
    DECLARED_TORCH_VERSION_LABEL as DECLARED_TORCH_VERSION, ENTRY_COUNTS_LABEL as ENTRY_COUNTS,
    TRITON_VERSION_LABEL as TRITON_VERSION,
};
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

/// The labels (and manifest annotations) of a cache image: those every
/// cache image carries, then its kind's own ([`Kind::labels`]
/// (gkm_core::cache::Kind::labels): vLLM's layouts and KServe's, PyTorch's
/// facts). `build_path` is where the tree was compiled
/// ([`gkm_core::cache::tree_build_path`]), labelled `<prefix>/build-path`
/// when known.
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
    if let Some(path) = build_path {
        labels.insert(layout.key(BUILD_PATH), path.display().to_string());
    }
    labels.extend(manifest.kind().rules().labels(manifest));
    labels
}

/// The label (after the kind's prefix) naming where a cache was compiled.
pub const BUILD_PATH: &str = "build-path";

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
