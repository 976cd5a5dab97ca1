//! The TVM-FFI kind: the cache of `tvm_ffi.cpp`'s JIT builds
//! (`TVM_FFI_CACHE_DIR`, by default `~/.cache/tvm-ffi`), which SGLang's JIT
//! kernels and other `tvm_ffi.cpp.load_inline` users fill: one ninja build
//! directory a module (layout, with the source lines it is read from: its
//! `scan.rs`).
//!
//! Its entries are its own ([`TvmFfiEntry`]: the module's name, backend,
//! GPU architectures, CUDA runtime and the `tvm_ffi` install it was built
//! against), its fit facts their architectures (checked against a node's
//! GPUs like a Triton kernel's) and, for a cache of C++ modules only, the
//! CPU. Its scratch: each module's `lock` and ninja's depfiles.
//!
//! **What binds it to a place.** A module's key (its directory's hash)
//! holds only its sources, functions and extra flags, but TVM-FFI writes
//! `build.ninja` anew on every load and ninja rebuilds whatever command
//! line changed, and that file names absolute paths: the inline sources
//! below the cache root, the `tvm_ffi` install (`-I…/tvm_ffi/include`),
//! `CUDA_HOME`, and the `-gencode` flags of `TVM_FFI_CUDA_ARCH_LIST` (or of
//! the first GPU, when unset). At another path every inline module is
//! built again; ninja's log holds hashes of the command lines, so that
//! cannot be rewritten. A TVM-FFI cache is labelled with the root it was
//! built at ([`Kind::build_path`]) and delivered only there
//! ([`Kind::relocated`] refuses any other path, saying what makes it hit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{CpuFit, Fit, Kind, cpu_labels, cpu_of_labels, entries_fit};
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, Facts, Summary};
use crate::image_layout::KindLayout;

mod entry;
mod scan;

pub use entry::{ModuleBackend, TvmFfiEntry};

/// The TVM-FFI kind.
pub struct TvmFfi;

impl CacheKind {
    /// A TVM-FFI cache (`~/.cache/tvm-ffi`).
    #[allow(non_upper_case_globals)]
    pub const TvmFfi: CacheKind = CacheKind(&TvmFfi);
}

/// The TVM-FFI image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::TvmFfi,
    cache_dir: "io.tvm-ffi.cache",
    manifest_dir: "io.tvm-ffi.manifest",
    label_prefix: "cache.tvm-ffi.image",
};

/// The label with the `tvm_ffi` installs its modules were built against:
/// a pod finds them built only with the same install at the same path.
pub const INSTALL_LABEL: &str = "install";
/// The label with the backends of its modules (`cpu`, `cuda`, `hip`).
pub const BACKEND_LABEL: &str = "backend";
/// The label with the CUDA runtimes its CUDA modules link.
pub const CUDA_VERSION_LABEL: &str = "cuda-version";

impl Kind for TvmFfi {
    fn name(&self) -> &'static str {
        "tvm-ffi"
    }

    fn title(&self) -> &'static str {
        "a TVM-FFI"
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
            CacheKind::TvmFfi,
            scan::scan(dir)?.entries,
            Facts::none(),
        )))
    }

    /// A module's `lock` and ninja's depfiles (`*.o.d`, read and removed by
    /// ninja after each compile).
    fn scratch(&self, path: &str, is_dir: bool) -> Option<&'static str> {
        let name = path.rsplit('/').next().unwrap_or(path);
        if is_dir {
            None
        } else if name == scan::LOCK && path.contains('/') {
            Some("a TVM-FFI build lock")
        } else if name.ends_with(".o.d") {
            Some("a ninja depfile")
        } else {
            None
        }
    }

    /// The module directory: the first component.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        path.split_once('/').map(|(module, _)| module)
    }

    /// The cache root its inline modules' `build.ninja` name their sources
    /// below.
    fn build_path(&self, root: &Path) -> Result<Option<PathBuf>, CacheError> {
        Ok(scan::scan(root)?.built_at)
    }

    /// Nothing to rewrite at the path it was built at; refused at any
    /// other, saying what makes it hit.
    fn relocated(&self, root: &Path, to: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
        super::ninja::refuse_elsewhere(
            scan::scan(root)?.built_at,
            to,
            "TVM-FFI cache path",
            "their sources there (with the tvm_ffi install, CUDA_HOME and the CUDA \
             architectures)",
            |built| {
                format!(
                    "(TVM_FFI_CACHE_DIR={}) with the builder's tvm_ffi install, CUDA_HOME and \
                     TVM_FFI_CUDA_ARCH_LIST",
                    built.display()
                )
            },
        )
    }

    /// Its modules' GPU targets and, when it holds C++ modules and no GPU
    /// module, the CPU (host code of the machine it was built on).
    fn fit(&self, manifest: &CacheManifest) -> Fit {
        entries_fit(manifest).with_cpu(cpu_modules(manifest))
    }

    fn fit_of_labels(&self, summary: Summary, labels: &BTreeMap<String, String>) -> Fit {
        Fit::of_targets(summary).with_cpu(cpu_of_labels(LAYOUT, labels))
    }

    /// True: TVM-FFI runs ninja on every load, which compares the
    /// modules' mtimes with their sources', headers' and its own log's.
    fn keeps_mtimes(&self) -> bool {
        true
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        super::read_own_entries::<TvmFfiEntry>(value)
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        super::write_own_entries::<TvmFfiEntry>(self.name(), manifest)
    }

    /// The `tvm_ffi` installs, backends and CUDA runtimes of its modules,
    /// and how many C++ modules it holds: what a pod must run for them to
    /// hit.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        let entries: Vec<&TvmFfiEntry> = super::own_entries(manifest);
        let mut labels = super::joined_labels(
            LAYOUT,
            [
                (
                    INSTALL_LABEL,
                    entries
                        .iter()
                        .filter_map(|e| e.install.as_deref())
                        .collect::<Vec<_>>(),
                ),
                (
                    BACKEND_LABEL,
                    entries.iter().map(|e| e.backend.as_str()).collect(),
                ),
                (
                    CUDA_VERSION_LABEL,
                    entries
                        .iter()
                        .filter_map(|e| e.cuda_version.as_deref())
                        .collect(),
                ),
            ],
        );
        if let Some(cpu) = cpu_modules(manifest) {
            labels.extend(cpu_labels(LAYOUT, &cpu));
        }
        labels
    }
}

/// The C++ modules of `manifest`, as CPU kernels whose ISA is not known
/// (TVM-FFI builds with `-O2` for the machine's baseline); `None` when it
/// holds none.
fn cpu_modules(manifest: &CacheManifest) -> Option<CpuFit> {
    let count = super::own_entries::<TvmFfiEntry>(manifest)
        .iter()
        .filter(|e| e.backend == ModuleBackend::Cpu)
        .count() as u64;
    (count > 0).then(|| CpuFit::read(Some(count), None))
}

#[cfg(test)]
mod tests;
