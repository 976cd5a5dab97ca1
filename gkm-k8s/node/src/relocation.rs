//! Relocation layers: a Triton tree compiled at one path, a hit at another.
//!
//! Triton's group files record the absolute paths of a kernel's artefacts
//! (see [`gkm_core::cache::build_path`]); a tree mounted anywhere else
//! misses every kernel. A relocation layer holds only the tree's group
//! files, rewritten for one mount path by the rules of the tree's kind
//! ([`gkm_core::cache::relocated_tree`]), at their places in the tree. It
//! is stacked as a read-only lower layer above the verified tree, so the
//! pod sees the tree unchanged but for its group files, and nothing is
//! copied per pod.
//!
//! A layer is made once per (digest, mount path), at
//! `<store>/relocations/<hex>/<path key>/`, in a temporary directory beside
//! it that is then renamed into place: a layer that exists is whole, and
//! two publishes making the same layer at once both end with the one that
//! won the rename. Its files are read-only (0444) and its directories 0755.
//! A layer goes with its store entry (garbage collection removes
//! `<store>/relocations/<hex>/` when it removes the entry).

use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gkm_core::cache::CacheError;
use gkm_core::digest::Digest;

/// The directory below the store holding relocation layers.
pub const RELOCATIONS_DIR: &str = "relocations";

/// Why a relocation layer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RelocationError {
    /// The mount path is not an absolute, normal path.
    #[error("mount path {0:?} must be absolute, without `.`, `..` or a trailing `/`")]
    BadMountPath(String),
    /// The tree's group files are torn or disagree on the build path.
    #[error(transparent)]
    Tree(#[from] CacheError),
    /// The layer could not be written.
    #[error("writing the relocation layer {path}: {source}")]
    Io {
        /// What was being written.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// What a tree needs to be a hit at a mount path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relocation {
    /// Nothing: the tree was built at that path, or holds no group file.
    NotNeeded,
    /// The relocation layer to stack above the tree.
    Layer(PathBuf),
}

/// Whether `path` is a mount path a layer may be made for: absolute, and
/// made only of normal components (no `.`, `..`, empty or trailing ones).
pub fn is_mount_path(path: &str) -> bool {
    path == "/"
        || path.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
        })
}

/// The directory holding every relocation layer of the store entry
/// `digest`.
pub fn layers_of(store: &Path, digest: &Digest) -> PathBuf {
    store.join(RELOCATIONS_DIR).join(digest.hex())
}

/// Where the relocation layer of the store entry `digest` for
/// `mount_path` lives.
pub fn layer_dir(store: &Path, digest: &Digest, mount_path: &Path) -> PathBuf {
    let key = Digest::of(mount_path.as_os_str().as_bytes());
    layers_of(store, digest).join(&key.hex()[..16])
}

/// Removes every relocation layer of the store entry `digest`: the
/// agent's garbage collection calls it when it removes the entry, which
/// happens only once no mount record names the digest, so no mounted view
/// stacks one of them.
pub fn remove_layers(store: &Path, digest: &Digest) -> io::Result<()> {
    match fs::remove_dir_all(layers_of(store, digest)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The relocation layer that makes the verified `tree` of the store entry
/// `digest` a hit at `mount_path`, made now if it is not there yet.
pub fn ensure_layer(
    store: &Path,
    digest: &Digest,
    tree: &Path,
    mount_path: &str,
) -> Result<Relocation, RelocationError> {
    if !is_mount_path(mount_path) {
        return Err(RelocationError::BadMountPath(mount_path.to_string()));
    }
    let dir = layer_dir(store, digest, Path::new(mount_path));
    if dir.is_dir() {
        return Ok(Relocation::Layer(dir));
    }
    let groups = gkm_core::cache::relocated_tree(tree, Path::new(mount_path))?;
    if groups.is_empty() {
        return Ok(Relocation::NotNeeded);
    }
    let parent = dir.parent().unwrap_or(store);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RelocationError::Io { path, source }
    };
    fs::create_dir_all(parent).map_err(io(parent))?;
    let staging = tempfile::Builder::new()
        .prefix(".making-")
        .tempdir_in(parent)
        .map_err(io(parent))?;
    for (relative, bytes) in &groups {
        let path = staging.path().join(relative);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let mut file = fs::File::create(&path).map_err(io(&path))?;
        file.write_all(bytes).map_err(io(&path))?;
        file.sync_all().map_err(io(&path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).map_err(io(&path))?;
    }
    fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755))
        .map_err(io(staging.path()))?;
    match fs::rename(staging.path(), &dir) {
        Ok(()) => {
            // Renamed away: nothing is left for the guard to remove.
            let _ = staging.keep();
            Ok(Relocation::Layer(dir))
        }
        // Another publish made it first; ours goes with the guard.
        Err(_) if dir.is_dir() => Ok(Relocation::Layer(dir)),
        Err(e) => Err(io(&dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT: &str = "/home/ci/.triton/cache";

    fn tree(root: &Path) -> PathBuf {
        let key = root.join("tree/KEY");
        fs::create_dir_all(&key).unwrap();
        fs::write(key.join("k.json"), "{}").unwrap();
        fs::write(key.join("k.cubin"), "bin").unwrap();
        fs::write(
            key.join("__grp__k.json"),
            format!(
                r#"{{"child_paths": {{"k.json": "{BUILT}/KEY/k.json", "k.cubin": "{BUILT}/KEY/k.cubin"}}}}"#
            ),
        )
        .unwrap();
        root.join("tree")
    }

    #[test]
    fn mount_paths_are_absolute_and_normal() {
        for good in ["/", "/cache", "/root/.triton/cache"] {
            assert!(is_mount_path(good), "{good}");
        }
        for bad in ["", "cache", "/a/../b", "/a/./b", "/a/", "//a", "/a//b"] {
            assert!(!is_mount_path(bad), "{bad}");
        }
    }

    #[test]
    fn a_layer_holds_only_the_groups_rewritten_for_the_mount_path() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tree(tmp.path());
        let store = tmp.path().join("store");
        let digest = Digest::of(b"entry");
        let Relocation::Layer(layer) = ensure_layer(&store, &digest, &tree, "/mnt/c").unwrap()
        else {
            panic!("a layer");
        };
        assert_eq!(layer, layer_dir(&store, &digest, Path::new("/mnt/c")));
        assert_eq!(names(&layer), ["KEY"]);
        assert_eq!(names(&layer.join("KEY")), ["__grp__k.json"]);
        let doc: serde_json::Value =
            serde_json::from_slice(&fs::read(layer.join("KEY/__grp__k.json")).unwrap()).unwrap();
        assert_eq!(doc["child_paths"]["k.cubin"], "/mnt/c/KEY/k.cubin");
        let mode = fs::metadata(layer.join("KEY/__grp__k.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o444);
        // Made once: a second call finds it, and leaves no staging behind.
        assert_eq!(
            ensure_layer(&store, &digest, &tree, "/mnt/c").unwrap(),
            Relocation::Layer(layer.clone())
        );
        assert_eq!(fs::read_dir(layer.parent().unwrap()).unwrap().count(), 1);
        // They go with their entry.
        remove_layers(&store, &digest).unwrap();
        assert!(!layer.exists());
        remove_layers(&store, &digest).unwrap();
        // At its build path, or for a bad path, none.
        assert_eq!(
            ensure_layer(&store, &digest, &tree, BUILT).unwrap(),
            Relocation::NotNeeded
        );
        assert!(matches!(
            ensure_layer(&store, &digest, &tree, "/mnt/../etc"),
            Err(RelocationError::BadMountPath(_))
        ));
    }

    #[test]
    fn a_torn_tree_gets_no_layer() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tree(tmp.path());
        fs::remove_file(tree.join("KEY/k.cubin")).unwrap();
        let store = tmp.path().join("store");
        let err = ensure_layer(&store, &Digest::of(b"e"), &tree, "/mnt/c").unwrap_err();
        assert!(err.to_string().contains("k.cubin"), "{err}");
        assert!(!store.join(RELOCATIONS_DIR).exists());
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}
