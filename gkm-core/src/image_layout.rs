//! Where a cache kind's tree and manifest sit in its image layer (and so in
//! a node store entry), and its label prefix: the GKM/MCV layout, shared by
//! the image builder, the extractor and the CSI driver.

use std::collections::BTreeMap;

use crate::cache::CacheKind;

/// The paths and label keys of one cache kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindLayout {
    /// The kind.
    pub kind: CacheKind,
    /// The layer directory holding the cache tree (`io.triton.cache`).
    pub cache_dir: &'static str,
    /// The layer directory holding `manifest.json` (`io.triton.manifest`).
    pub manifest_dir: &'static str,
    /// The label prefix (`cache.triton.image`).
    pub label_prefix: &'static str,
}

/// The Triton layout.
pub const TRITON: KindLayout = KindLayout {
    kind: CacheKind::Triton,
    cache_dir: "io.triton.cache",
    manifest_dir: "io.triton.manifest",
    label_prefix: "cache.triton.image",
};

/// The vLLM layout.
pub const VLLM: KindLayout = KindLayout {
    kind: CacheKind::Vllm,
    cache_dir: "io.vllm.cache",
    manifest_dir: "io.vllm.manifest",
    label_prefix: "cache.vllm.image",
};

/// The PyTorch Inductor layout.
pub const INDUCTOR: KindLayout = KindLayout {
    kind: CacheKind::Inductor,
    cache_dir: "io.inductor.cache",
    manifest_dir: "io.inductor.manifest",
    label_prefix: "cache.inductor.image",
};

/// The PyTorch Mega-Cache layout.
pub const MEGACACHE: KindLayout = KindLayout {
    kind: CacheKind::MegaCache,
    cache_dir: "io.megacache.cache",
    manifest_dir: "io.megacache.manifest",
    label_prefix: "cache.megacache.image",
};

/// Every layout.
pub const ALL: [KindLayout; 4] = [TRITON, VLLM, INDUCTOR, MEGACACHE];

/// The name of the manifest file in the manifest directory.
pub const MANIFEST_FILE: &str = "manifest.json";

impl KindLayout {
    /// The layout of a cache kind.
    pub fn of(kind: CacheKind) -> KindLayout {
        match kind {
            CacheKind::Triton => TRITON,
            CacheKind::Vllm => VLLM,
            CacheKind::Inductor => INDUCTOR,
            CacheKind::MegaCache => MEGACACHE,
        }
    }

    /// The layout whose cache or manifest directory is the first path
    /// component `top`.
    pub fn for_top_dir(top: &str) -> Option<KindLayout> {
        ALL.into_iter()
            .find(|l| l.cache_dir == top || l.manifest_dir == top)
    }

    /// The layout whose labels `labels` carries, if any.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<KindLayout> {
        ALL.into_iter()
            .find(|l| labels.contains_key(&l.key("summary")))
    }

    /// A label key under this kind's prefix (`cache.triton.image/<name>`).
    pub fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.label_prefix)
    }

    /// The layer path of `manifest.json`.
    pub fn manifest_path(&self) -> String {
        format!("{}/{MANIFEST_FILE}", self.manifest_dir)
    }
}
