//! The vLLM kind: a vLLM `torch_compile_cache` (layouts: see the
//! [`cache`](crate::cache) module), its kernels filed by hash directory
//! and layout, with MCV's records of its artefacts.
//!
//! Its own beyond Triton's rules: its images lay out the cache root
//! whichever of its directories is built ([`Kind::offset_from_root`]), its
//! `manifest.json` lists kernels in MCV's groups ([`Kind::read_entries`],
//! [`Kind::write_manifest`]), and its summary label names CUDA
//! architectures `sm_XY` when it holds Inductor standalone artefacts.

use std::path::{Path, PathBuf};

use super::Kind;
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, VllmFormat};
use crate::image_layout::KindLayout;

pub(crate) mod artefacts;
mod manifest_json;
pub(crate) mod scan;

/// The vLLM kind.
pub struct Vllm;

impl CacheKind {
    /// A vLLM `torch_compile_cache`.
    #[allow(non_upper_case_globals)]
    pub const Vllm: CacheKind = CacheKind(&Vllm);
}

/// The vLLM image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::Vllm,
    cache_dir: "io.vllm.cache",
    manifest_dir: "io.vllm.manifest",
    label_prefix: "cache.vllm.image",
};

impl Kind for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn title(&self) -> &'static str {
        "a vLLM"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        scan::EXPECTED
    }

    fn recognise(&self, dir: &Path) -> Result<bool, CacheError> {
        Ok(scan::offset_from_root(dir)?.is_some())
    }

    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        scan::scan(dir)
    }

    fn offset_from_root(&self, dir: &Path) -> Result<Option<PathBuf>, CacheError> {
        scan::offset_from_root(dir)
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        manifest_json::read_groups(value)
    }

    fn read_records(&self, manifest: &mut CacheManifest, bytes: &[u8]) {
        manifest.artefacts = manifest_json::artefacts_of(bytes);
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        let groups = manifest_json::groups(&manifest.entries, &manifest.artefacts);
        crate::cache::manifest_json::write(manifest, &groups)
    }

    fn summary_label(&self, manifest: &CacheManifest) -> String {
        let summary = manifest.summary();
        let binary = manifest
            .entries
            .iter()
            .any(|e| e.cache_format == Some(VllmFormat::Binary));
        if binary {
            manifest_json::sm_summary_label(&summary)
        } else {
            summary.to_label()
        }
    }
}
