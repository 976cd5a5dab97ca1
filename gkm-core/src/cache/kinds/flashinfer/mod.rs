//! The FlashInfer kind: FlashInfer's cache (`FLASHINFER_CACHE_DIR`, by
//! default `~/.cache/flashinfer`): its JIT-built modules, one per
//! workspace of a FlashInfer version and CUDA architecture, and its
//! autotune store (layout, with the source lines it is read from: its
//! `scan.rs`).
//!
//! Its entries are its own ([`FlashInferEntry`]: a module's name, CUDA
//! architecture, CUDA runtime and FlashInfer version; a tuning's operation,
//! environment and GPU), its fit facts their targets (a module's
//! architecture, checked against a node's GPUs like a Triton kernel's) and
//! versions. Its scratch: the locks and ninja files of `cached_ops/tmp/`,
//! `flashinfer_jit.log`, the store's `.autotune_*.tmp` files.
//!
//! **What binds it to a place.** A module's `build.ninja` names absolute
//! paths: its outputs below the cache root, the installed FlashInfer's
//! sources and include directories, `CUDA_HOME`. FlashInfer writes it anew
//! for the current paths on every load and lets ninja decide, and ninja
//! rebuilds what its command line or `.ninja_log` no longer matches: at
//! another path every module is built again. That cannot be rewritten
//! (ninja's log holds hashes of the command lines), so a FlashInfer cache is
//! labelled with the root it was built at ([`Kind::build_path`]) and
//! delivered only there ([`Kind::relocated`] refuses any other path, saying
//! what makes it portable).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Kind;
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, Facts};
use crate::image_layout::KindLayout;

mod entry;
mod scan;

pub use entry::{FlashInferEntry, Part};

/// The FlashInfer kind.
pub struct FlashInfer;

impl CacheKind {
    /// A FlashInfer cache (`~/.cache/flashinfer`).
    #[allow(non_upper_case_globals)]
    pub const FlashInfer: CacheKind = CacheKind(&FlashInfer);
}

/// The FlashInfer image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::FlashInfer,
    cache_dir: "io.flashinfer.cache",
    manifest_dir: "io.flashinfer.manifest",
    label_prefix: "cache.flashinfer.image",
};

impl Kind for FlashInfer {
    fn name(&self) -> &'static str {
        "flashinfer"
    }

    fn title(&self) -> &'static str {
        "a FlashInfer"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        scan::EXPECTED
    }

    fn recognise(&self, dir: &Path) -> Result<bool, CacheError> {
        scan::recognise(dir)
    }

    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        if !scan::recognise(dir)? {
            return Ok(None);
        }
        let scanned = scan::scan(dir)?;
        Ok(Some(CacheManifest::of_kind(
            CacheKind::FlashInfer,
            scanned.entries,
            Facts::none(),
        )))
    }

    /// `cached_ops/tmp/` (locks, `flashinfer_jit.ninja`), `*.lock`,
    /// `flashinfer_jit.log` and the store's `.autotune_*.tmp` files.
    fn scratch(&self, path: &str, is_dir: bool) -> Option<&'static str> {
        let mut parts = path.rsplit('/');
        let name = parts.next().unwrap_or(path);
        let parent = parts.next();
        if is_dir && name == "tmp" && parent == Some("cached_ops") {
            Some("FlashInfer's directory of locks and ninja files")
        } else if is_dir {
            None
        } else if name.ends_with(".lock") {
            Some("a lock file")
        } else if name == "flashinfer_jit.log" {
            Some("FlashInfer's JIT log")
        } else if scan::is_tuning_temp(name) {
            Some("an autotune store temporary file")
        } else {
            None
        }
    }

    /// The cache root its modules' `build.ninja` name.
    fn build_path(&self, root: &Path) -> Result<Option<PathBuf>, CacheError> {
        Ok(scan::scan(root)?.built_at)
    }

    /// Nothing to rewrite at the path it was built at; refused at any
    /// other, saying what makes it portable.
    fn relocated(&self, root: &Path, to: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
        super::ninja::refuse_elsewhere(
            scan::scan(root)?.built_at,
            to,
            "FlashInfer cache path",
            "that path, the FlashInfer install and CUDA_HOME",
            |_| {
                "(FLASHINFER_WORKSPACE_BASE set so that FLASHINFER_CACHE_DIR is that path) with \
                 the builder's FlashInfer install and CUDA_HOME, or ship FlashInfer's AOT \
                 package (flashinfer-jit-cache), which loads without ninja"
                    .to_string()
            },
        )
    }

    /// True: FlashInfer runs ninja on every load, which compares the
    /// modules' mtimes with their sources', headers' and its own log's.
    fn keeps_mtimes(&self) -> bool {
        true
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        super::read_own_entries::<FlashInferEntry>(value)
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        super::write_own_entries::<FlashInferEntry>(self.name(), manifest)
    }

    /// The FlashInfer and CUDA versions its entries record.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        super::joined_labels(
            LAYOUT,
            [
                ("flashinfer-version", manifest.versions_of("flashinfer")),
                ("cuda-version", manifest.versions_of("cuda")),
            ],
        )
    }
}

#[cfg(test)]
mod tests;
