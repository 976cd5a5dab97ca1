//! The TileLang kind: TileLang's kernel cache (`TILELANG_CACHE_DIR`, by
//! default `~/.tilelang/cache`): compiled kernels, autotuning results and
//! device binaries, each a directory TileLang renames whole into place
//! (layout, with the source it is read from: its `scan.rs`).
//!
//! Its entries are its own ([`TileLangEntry`]: part, TileLang version,
//! host, backend and the CUDA architectures of the cubins it holds, read
//! from the cubins themselves, also those a kernel's library embeds), its
//! fit facts those architectures (checked against a node's GPUs like a
//! Triton kernel's) and TileLang versions. A kernel whose files do not
//! match TileLang's own `manifest.json`, or a binary its `metadata.json`,
//! is refused, naming it: TileLang would delete it and compile again. Its
//! scratch: `.staging/`, where entries are written before their rename.
//!
//! **What binds it to a place.** Nothing of a path: TileLang 0.1.15 keys
//! an entry on the kernel's TIR, its target, backend and options, its own
//! version and the machine (`platform.machine()`), and files it under its
//! version and `<platform>-<machine>` directories. With
//! `TILELANG_KERNEL_CACHE_USE_LIB_STAMP=1` the key also holds the SHA-256
//! of TileLang's native libraries, their content, not their path or
//! mtime (older TileLang keyed on `libtilelang.so`'s size and mtime, which
//! no copy of a cache keeps). So a TileLang cache hits wherever
//! `TILELANG_CACHE_DIR` points, on any node of the same machine type with
//! the same TileLang ([`Kind::binds_to_a_path`] is false).

use std::collections::BTreeMap;
use std::path::Path;

use super::Kind;
use crate::cache::{CacheEntry, CacheError, CacheKind, CacheManifest, Facts};
use crate::image_layout::KindLayout;

mod entry;
mod scan;

pub use entry::{Part, TileLangEntry};

/// The TileLang kind.
pub struct TileLang;

impl CacheKind {
    /// A TileLang cache (`~/.tilelang/cache`).
    #[allow(non_upper_case_globals)]
    pub const TileLang: CacheKind = CacheKind(&TileLang);
}

/// The TileLang image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::TileLang,
    cache_dir: "io.tilelang.cache",
    manifest_dir: "io.tilelang.manifest",
    label_prefix: "cache.tilelang.image",
};

/// The label with the TileLang versions its entries were compiled by.
pub const TILELANG_VERSION_LABEL: &str = "tilelang-version";
/// The label with the hosts (`<platform>-<machine>`) its kernels were
/// compiled on: TileLang looks only under its own.
pub const HOST_LABEL: &str = "host";
/// The label with the execution backends of its kernels.
pub const BACKEND_LABEL: &str = "backend";

impl Kind for TileLang {
    fn name(&self) -> &'static str {
        "tilelang"
    }

    fn title(&self) -> &'static str {
        "a TileLang"
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
            CacheKind::TileLang,
            scan::scan(dir)?,
            Facts::none(),
        )))
    }

    /// `.staging/` and what is below it, and the temporary files TileLang
    /// writes before a rename (`.<name>.<pid>_<uuid>.tmp…`).
    fn scratch(&self, path: &str, _is_dir: bool) -> Option<&'static str> {
        let mut parts = path.split('/');
        if parts.any(|p| p == scan::STAGING) {
            return Some("TileLang's staging directory");
        }
        let name = path.rsplit('/').next().unwrap_or(path);
        (name.starts_with('.') && name.contains(".tmp")).then_some("a TileLang temporary file")
    }

    /// The entry directory: `<version>/<host>/kernels/<key>`,
    /// `<version>/<host>/autotuner/<key>` or `<version>/cuda-binaries/<key>`.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        let parts: Vec<&str> = path.split('/').collect();
        let depth = match parts.as_slice() {
            [_, scan::CUDA_BINARIES, _, _, ..] => 3,
            [_, _, scan::KERNELS | scan::AUTOTUNER, _, _, ..] => 4,
            _ => return None,
        };
        let len: usize = parts[..depth].iter().map(|p| p.len()).sum::<usize>() + depth - 1;
        Some(&path[..len])
    }

    /// False: no key names a path.
    fn binds_to_a_path(&self) -> bool {
        false
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        super::read_own_entries::<TileLangEntry>(value)
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        super::write_own_entries::<TileLangEntry>(self.name(), manifest)
    }

    /// The TileLang versions, hosts and backends of its entries: what a
    /// pod must run for them to hit.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        let entries: Vec<&TileLangEntry> = super::own_entries(manifest);
        super::joined_labels(
            LAYOUT,
            [
                (
                    TILELANG_VERSION_LABEL,
                    entries
                        .iter()
                        .map(|e| e.tilelang_version.as_str())
                        .collect::<Vec<_>>(),
                ),
                (
                    HOST_LABEL,
                    entries.iter().filter_map(|e| e.host.as_deref()).collect(),
                ),
                (
                    BACKEND_LABEL,
                    entries
                        .iter()
                        .filter(|e| e.part != Part::Binary)
                        .map(|e| e.backend.as_str())
                        .collect(),
                ),
            ],
        )
    }
}

#[cfg(test)]
mod tests;
