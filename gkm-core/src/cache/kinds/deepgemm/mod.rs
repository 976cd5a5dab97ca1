//! The DeepGEMM kind: DeepGEMM's JIT cache (`DG_JIT_CACHE_DIR`, by default
//! `~/.deep_gemm`; vLLM points it at `$VLLM_CACHE_ROOT/deep_gemm`), one
//! directory per compiled kernel (layout, with the source lines it is read
//! from: its `scan.rs`).
//!
//! Its entries are its own ([`DeepGemmEntry`]: a kernel's name, key digest,
//! CUDA architecture, and once checked the compiler and `deep_gemm`
//! install its key names), its fit facts their architectures (checked
//! against a node's GPUs like a Triton kernel's) and compilers' CUDA
//! versions. Its scratch: `tmp/`, where DeepGEMM compiles.
//!
//! **What binds it to a place.** Not the cache's own path: its keys name
//! no path below the cache root, so a DeepGEMM cache is found wherever
//! `DG_JIT_CACHE_DIR` points ([`Kind::binds_to_a_path`] is false). But every key
//! hashes the compiler's command line, which names the installed
//! `deep_gemm` package's `include/` directory (and for NVRTC,
//! `CUDA_HOME`): with `deep_gemm` installed anywhere else every kernel
//! misses. The tree does not record that install, so a DeepGEMM cache is
//! built only with it declared (`--deepgemm-root`), every key checked
//! against it ([`key::binding`]) and the image labelled with it
//! ([`Kind::declare`]); a key that does not match is refused, naming the
//! kernel.

use std::collections::BTreeMap;
use std::path::Path;

use super::Kind;
use crate::cache::declared::{Declaration, Declared};
use crate::cache::files::{read_head, torn};
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, Facts};
use crate::image_layout::KindLayout;

mod entry;
mod key;
mod scan;

pub use entry::DeepGemmEntry;

/// The DeepGEMM kind.
pub struct DeepGemm;

impl CacheKind {
    /// A DeepGEMM cache (`~/.deep_gemm`).
    #[allow(non_upper_case_globals)]
    pub const DeepGemm: CacheKind = CacheKind(&DeepGemm);
}

/// The DeepGEMM image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::DeepGemm,
    cache_dir: "io.deepgemm.cache",
    manifest_dir: "io.deepgemm.manifest",
    label_prefix: "cache.deepgemm.image",
};

/// The label with the `deep_gemm` package directory the keys name.
pub const DEEPGEMM_ROOT_LABEL: &str = "deepgemm-root";
/// The label with the compilers the keys name (`NVCC12.9`).
pub const COMPILER_LABEL: &str = "compiler";
/// DeepGEMM's own default `CUDA_HOME` (`deep_gemm/__init__.py`,
/// `_find_cuda_home`).
const DEFAULT_CUDA_HOME: &str = "/usr/local/cuda";
/// The largest `kernel.cu` read.
const MAX_SOURCE: u64 = 16 << 20;

impl Kind for DeepGemm {
    fn name(&self) -> &'static str {
        "deepgemm"
    }

    fn title(&self) -> &'static str {
        "a DeepGEMM"
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
            CacheKind::DeepGemm,
            scan::scan(dir)?,
            Facts::none(),
        )))
    }

    /// `tmp/` and what is below it: DeepGEMM's compile directories.
    fn scratch(&self, path: &str, _is_dir: bool) -> Option<&'static str> {
        (path == scan::TMP || path.starts_with("tmp/")).then_some("DeepGEMM's compile directory")
    }

    /// The kernel directory, `cache/kernel.<name>.<digest>`.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        let rest = path.strip_prefix("cache/")?;
        let (dir, _) = rest.split_once('/')?;
        Some(&path[..scan::CACHE.len() + 1 + dir.len()])
    }

    /// False: no key names the cache's own path (they name the
    /// `deep_gemm` install, [`Kind::declare`] checks).
    fn binds_to_a_path(&self) -> bool {
        false
    }

    /// Checks every kernel's key against the declared `deep_gemm` install
    /// (`--deepgemm-root`, and `--cuda-home` for NVRTC's keys), recording
    /// the compiler and architecture each was found with; refused without
    /// the declaration, and for a key that does not match, naming it.
    fn declare(
        &self,
        tree: &Path,
        manifest: &mut CacheManifest,
        declared: &Declared,
    ) -> Result<(), CacheError> {
        declared.refuse_beyond(
            &[Declaration::DeepGemmRoot, Declaration::CudaHome],
            self.title(),
        )?;
        let Some(root) = declared.deepgemm_root.as_deref() else {
            return Err(CacheError::Invalid {
                what: "DeepGEMM cache",
                reason: "every key names the deep_gemm install that compiled it \
                         (-I<deep_gemm>/include on the compiler's command line) and its tree \
                         does not record it: say it with --deepgemm-root (where it was compiled, \
                         python -c 'import deep_gemm, os; print(os.path.dirname(deep_gemm.__file__))'); \
                         gkm checks every key against it and labels the image with it, and a pod \
                         hits the cache only with deep_gemm installed at that path"
                    .into(),
            });
        };
        let cuda_home = declared.cuda_home.as_deref().unwrap_or(DEFAULT_CUDA_HOME);
        let mut checked = Vec::with_capacity(manifest.entries.len());
        for entry in manifest.entries.iter().filter_map(CacheEntry::facts) {
            checked.push(checked_entry(tree, entry, root, cuda_home)?);
        }
        *manifest = CacheManifest::of_kind(CacheKind::DeepGemm, checked, Facts::none());
        Ok(())
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        super::read_own_entries::<DeepGemmEntry>(value)
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        super::write_own_entries::<DeepGemmEntry>(self.name(), manifest)
    }

    /// The `deep_gemm` directories and compilers its keys name.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        let kernels = entries(manifest);
        super::joined_labels(
            LAYOUT,
            [
                (
                    DEEPGEMM_ROOT_LABEL,
                    kernels
                        .iter()
                        .filter_map(|e| e.deepgemm_root.as_deref())
                        .collect::<Vec<_>>(),
                ),
                (
                    COMPILER_LABEL,
                    kernels
                        .iter()
                        .filter_map(|e| e.compiler.as_deref())
                        .collect(),
                ),
            ],
        )
    }
}

/// The DeepGEMM entries of `manifest`, in its order.
fn entries(manifest: &CacheManifest) -> Vec<&DeepGemmEntry> {
    super::own_entries(manifest)
}

/// `entry` (of the tree at `tree`) with what its key was found to name,
/// with `deep_gemm` at `root` and CUDA at `cuda_home`.
fn checked_entry(
    tree: &Path,
    entry: &DeepGemmEntry,
    root: &str,
    cuda_home: &str,
) -> Result<DeepGemmEntry, CacheError> {
    let dir = tree.join(&entry.key);
    let code = read_head(&dir.join(scan::SOURCE), MAX_SOURCE)?;
    let sm: u32 = entry
        .arch
        .as_str()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .unwrap_or_default();
    let Some(found) = key::binding(&entry.name, &code, &entry.digest, sm, root, cuda_home) else {
        return Err(CacheError::Invalid {
            what: "DeepGEMM cache key",
            reason: format!(
                "{}: its digest is not DeepGEMM 2.6's key of its kernel.cu with deep_gemm at {root} \
                 (and CUDA_HOME {cuda_home} for NVRTC) by any NVCC or NVRTC from 12.3 to 13.9 \
                 for sm_{sm}: it was compiled with deep_gemm installed elsewhere, other DG_JIT_* \
                 settings or another DeepGEMM, and a pod would be given it and compile every \
                 kernel again; build the cache where deep_gemm is installed at the path the \
                 pods install it, and declare that path",
                dir.display()
            ),
        });
    };
    let arch = found
        .arch
        .parse()
        .map_err(|_| torn(&dir, format!("its key names sm_{}", found.arch)))?;
    Ok(DeepGemmEntry {
        arch,
        compiler: Some(found.compiler),
        deepgemm_root: Some(root.to_string()),
        ..entry.clone()
    })
}

#[cfg(test)]
mod tests;
