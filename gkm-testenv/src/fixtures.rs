//! Where the shared cache fixtures are: `shared/fixtures/caches`, beside
//! the repository (`../shared` of its root).

use std::path::{Path, PathBuf};

/// The repository's root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The directory of the real cache fixtures, `../shared/fixtures/caches`
/// from the repository's root.
pub fn fixture_caches() -> PathBuf {
    repo_root().join("../shared/fixtures/caches")
}

/// The fixture cache `name` (a directory of [`fixture_caches`]). Panics,
/// naming the path, when it is not there: a test cannot run without it.
pub fn fixture_cache(name: &str) -> PathBuf {
    let path = fixture_caches().join(name);
    assert!(
        path.is_dir(),
        "fixture cache {} is missing: the tests read ../shared beside the repository",
        path.display()
    );
    path
}
