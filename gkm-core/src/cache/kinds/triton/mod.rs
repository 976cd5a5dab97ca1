//! The Triton kind: a Triton cache (`~/.triton/cache`, `TRITON_CACHE_DIR`),
//! one directory per cache key holding a kernel's metadata, group file and
//! compiled artefacts (layout: see the [`cache`](crate::cache) module).
//!
//! The smallest working kind, and the template a new kind copies: a unit
//! struct implementing [`Kind`] with what has no default (its
//! name, layout, recognition and scan), its `CacheKind` constant, its
//! [`LAYOUT`], and its scanner beside it (`scan.rs`). Its scratch rule
//! (`tmp.pid_*` temporaries) and the default relocation and torn-group
//! rules (Triton's group files, `cache/group.rs`) are what the other kinds
//! build on.

use std::path::Path;

use super::Kind;
use crate::cache::{CacheError, CacheKind, CacheManifest, Facts};
use crate::image_layout::KindLayout;

pub(crate) mod kernel;
pub(crate) mod scan;

/// The Triton kind.
pub struct Triton;

impl CacheKind {
    /// A Triton cache (`~/.triton/cache`).
    #[allow(non_upper_case_globals)]
    pub const Triton: CacheKind = CacheKind(&Triton);
}

/// The Triton image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::Triton,
    cache_dir: "io.triton.cache",
    manifest_dir: "io.triton.manifest",
    label_prefix: "cache.triton.image",
};

impl Kind for Triton {
    fn name(&self) -> &'static str {
        "triton"
    }

    fn title(&self) -> &'static str {
        "a Triton"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        scan::EXPECTED
    }

    /// Any directory: Triton is tried last, and its tree is
    /// what no other kind claims.
    fn recognise(&self, _dir: &Path) -> Result<bool, CacheError> {
        Ok(true)
    }

    fn fallback(&self) -> bool {
        true
    }

    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        Ok(scan::scan_root(dir)?
            .map(|entries| CacheManifest::of_kind(CacheKind::Triton, entries, Facts::none())))
    }
}

/// Prefix of the files and directories Triton writes a kernel into before
/// moving it in place (`tmp.pid_<pid>_<random>`).
pub(crate) const TEMP_PREFIX: &str = "tmp.pid_";

/// Why an upper entry is Triton's scratch: its `tmp.pid_*` temporaries.
/// The kernel directory `path` (a file below a Triton tree) is in: its
/// parent directory, `None` for a top-level file.
pub(crate) fn entry_of(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(dir, _)| dir)
}

pub(crate) fn scratch(path: &str, _is_dir: bool) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with(TEMP_PREFIX)
        .then_some("a Triton temporary file")
}
