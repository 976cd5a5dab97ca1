//! Where a cache kind's tree and manifest sit in its image layer (and so in
//! a node store entry), and its label prefix: the GKM/MCV layout, shared by
//! the image builder, the extractor and the CSI driver.

use std::collections::BTreeMap;

use crate::cache::CacheKind;
use crate::cache::kinds::REGISTRY;

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
pub const TRITON: KindLayout = crate::cache::kinds::triton::LAYOUT;

/// The vLLM layout.
pub const VLLM: KindLayout = crate::cache::kinds::vllm::LAYOUT;

/// The PyTorch Inductor layout.
pub const INDUCTOR: KindLayout = crate::cache::kinds::inductor::LAYOUT;

/// The PyTorch Mega-Cache layout.
pub const MEGACACHE: KindLayout = crate::cache::kinds::megacache::LAYOUT;

/// Every registered kind's layout ([`REGISTRY`]
/// order): `for layout in ALL` and `ALL.into_iter()` walk them.
pub const ALL: Layouts = Layouts;

/// The layouts of the registered kinds (see [`ALL`]).
#[derive(Debug, Clone, Copy)]
pub struct Layouts;

impl IntoIterator for Layouts {
    type Item = KindLayout;
    type IntoIter =
        std::iter::Map<std::slice::Iter<'static, CacheKind>, fn(&CacheKind) -> KindLayout>;

    fn into_iter(self) -> Self::IntoIter {
        REGISTRY.iter().map(|kind| kind.rules().layout())
    }
}

/// The name of the manifest file in the manifest directory.
pub const MANIFEST_FILE: &str = "manifest.json";

impl KindLayout {
    /// The layout of a cache kind.
    pub fn of(kind: CacheKind) -> KindLayout {
        kind.rules().layout()
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
