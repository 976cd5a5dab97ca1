//! The CuTe DSL kind: the file cache of NVIDIA's CUTLASS Python DSL
//! (`CUTE_DSL_CACHE_DIR`, by default `$TMPDIR/<user>/cutlass_python_cache`),
//! which FlashInfer, SGLang and vLLM kernels written in CuTe DSL fill: one
//! file of MLIR bytecode a compiled function, its cubins inside (layout,
//! with the source it is read from: its `scan.rs`).
//!
//! Its entries are its own ([`CuteDslEntry`]: the CUDA architecture the
//! file records and the CUDA toolkit that compiled it), its fit facts those
//! architectures, checked against a node's GPUs like a Triton kernel's. A
//! file whose CRC32 does not match its bytecode is refused, naming it: CuTe
//! DSL would compile it again. Its scratch: the `tmp.pid_*` directories
//! files are written in before their rename, and `pyir_class_facts/`.
//!
//! **What binds it to a place.** Not its own path: CuTe DSL looks a
//! function up by a hash wherever `CUTE_DSL_CACHE_DIR` points. But the hash
//! covers the DSL's own sources and libraries, the path of the
//! `libcute_dsl_runtime.so` it links (the install prefix), `CUTE_DSL_ARCH`
//! and the function's IR, which holds the source locations of the
//! workload's Python: the same DSL install at the same path and the same
//! workload code at the same path find it; a workload whose code moved
//! compiles again. None of that is stated in the file (only its hash), so
//! gkm cannot check it on a node: it is said in `gkm inspect` and the docs
//! ([`Kind::binds_to_a_path`] is false).

use std::collections::BTreeMap;
use std::path::Path;

use super::Kind;
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, Facts};
use crate::image_layout::KindLayout;

mod entry;
mod scan;

pub use entry::CuteDslEntry;

/// The CuTe DSL kind.
pub struct CuteDsl;

impl CacheKind {
    /// A CuTe DSL cache (`CUTE_DSL_CACHE_DIR`).
    #[allow(non_upper_case_globals)]
    pub const CuteDsl: CacheKind = CacheKind(&CuteDsl);
}

/// The CuTe DSL image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::CuteDsl,
    cache_dir: "io.cutedsl.cache",
    manifest_dir: "io.cutedsl.manifest",
    label_prefix: "cache.cutedsl.image",
};

/// The label with the CUDA toolkits its functions were compiled with.
pub const CUDA_VERSION_LABEL: &str = "cuda-version";

impl Kind for CuteDsl {
    fn name(&self) -> &'static str {
        "cutedsl"
    }

    fn title(&self) -> &'static str {
        "a CuTe DSL"
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
        Ok(Some(CacheManifest::of_kind(
            CacheKind::CuteDsl,
            scan::scan(dir)?,
            Facts::none(),
        )))
    }

    /// The `tmp.pid_*` directories files are written in before their
    /// rename, and `pyir_class_facts/` (parsed source facts), with what is
    /// below them.
    fn scratch(&self, path: &str, _is_dir: bool) -> Option<&'static str> {
        let top = path.split('/').next().unwrap_or(path);
        if top.starts_with(scan::TEMP_PREFIX) {
            Some("a CuTe DSL temporary directory")
        } else if top == scan::FACTS {
            Some("CuTe DSL's cache of parsed source facts")
        } else {
            None
        }
    }

    /// The compiled function's file, at the root.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        (!path.contains('/') && path.ends_with(".mlir")).then_some(path)
    }

    /// False: its key names no path of the cache.
    fn binds_to_a_path(&self) -> bool {
        false
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        super::read_own_entries::<CuteDslEntry>(value)
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        super::write_own_entries::<CuteDslEntry>(self.name(), manifest)
    }

    /// The CUDA toolkits its functions were compiled with.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        super::joined_labels(LAYOUT, [(CUDA_VERSION_LABEL, manifest.versions_of("cuda"))])
    }
}

#[cfg(test)]
mod tests;
