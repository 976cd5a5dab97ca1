//! What the kinds whose tools build their entries with ninja share
//! (FlashInfer's JIT modules, TVM-FFI's): every load writes a module's
//! `build.ninja` for the current paths and runs ninja, which rebuilds what
//! its `.ninja_log` (hashes of the command lines) no longer matches. So such
//! a cache is bound to the root its modules were built at: every module of
//! a tree must say the same one, and a view anywhere else is refused.

use std::path::{Path, PathBuf};

use crate::cache::CacheError;

/// Records that `module` was built at the cache root `built`, refusing it
/// when the modules before it (`first`) say another (`what` names the
/// kind's cache: `FlashInfer cache build path`).
pub(crate) fn same_root(
    first: &mut Option<PathBuf>,
    built: PathBuf,
    module: &Path,
    what: &'static str,
) -> Result<(), CacheError> {
    match first {
        Some(first) if *first != built => Err(CacheError::Invalid {
            what,
            reason: format!(
                "{} was built at {}, the modules before it at {}",
                module.display(),
                built.display(),
                first.display()
            ),
        }),
        _ => {
            *first = Some(built);
            Ok(())
        }
    }
}

/// Nothing to rewrite for a tree built at `built_at` viewed at `to` (or
/// bound to no root); refused at any other path: `what` names the kind's
/// cache path, `names` what its `build.ninja` names there, `how` what
/// else a pod needs besides mounting it at the build root (`root` given).
pub(crate) fn refuse_elsewhere(
    built_at: Option<PathBuf>,
    to: &Path,
    what: &'static str,
    names: &str,
    how: impl FnOnce(&Path) -> String,
) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
    match built_at {
        Some(built) if built != to => Err(CacheError::Invalid {
            what,
            reason: format!(
                "its modules were built at {} and would be built again at {}: their \
                 build.ninja names {names}, and ninja rebuilds what its .ninja_log no longer \
                 matches; mount it at {} {}",
                built.display(),
                to.display(),
                built.display(),
                how(&built)
            ),
        }),
        _ => Ok(Vec::new()),
    }
}
