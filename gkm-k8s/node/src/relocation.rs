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
//! won the rename. Its files are read-only (0444) and its directories 0755;
//! they reach the disk with one `syncfs` before the rename, not one `fsync`
//! a file. A mount path is at most [`MOUNT_PATH_MAX_BYTES`] long.
//!
//! What a layer would take is known before anything is written
//! ([`plan_layer`], [`NewLayer::bytes`]), and the layers on the node are
//! counted ([`count_layers`]), so a caller can bound them before it writes
//! one. A layer no view stacks goes ([`remove_unused_layers`]: the CSI
//! driver reads which views stack which layer from its mount records), and
//! a layer goes with its store entry: garbage collection removes
//! `<store>/relocations/<hex>/` when it removes the entry
//! ([`remove_layers`]), and a quarantine moves it into the quarantined
//! entry ([`quarantine_layers`]), which goes once no pod mounts it; a
//! mounted view keeps the layers it stacks either way.

use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use gkm_core::cache::CacheError;
use gkm_core::digest::Digest;

/// The directory below the store holding relocation layers.
pub const RELOCATIONS_DIR: &str = "relocations";

/// The longest mount path a layer is made for, in bytes: every group file
/// of a layer holds it once for each of its kernel's files, and a path
/// this long is still far within `PATH_MAX`.
pub const MOUNT_PATH_MAX_BYTES: usize = 1024;

/// A layer's files are counted in blocks of this size, and each directory
/// as one block, as most filesystems allocate them.
pub const LAYER_BLOCK: u64 = 4096;

/// The prefix of a layer being made (a temporary directory beside it).
const STAGING_PREFIX: &str = ".making-";

/// The name of the directory a quarantined entry keeps its layers in.
pub const QUARANTINED_LAYERS: &str = "relocations";

/// Why a relocation layer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RelocationError {
    /// The mount path is not an absolute, normal path.
    #[error("mount path {0:?} must be absolute, without `.`, `..` or a trailing `/`")]
    BadMountPath(String),
    /// The mount path is longer than [`MOUNT_PATH_MAX_BYTES`].
    #[error("a mount path of {0} bytes is longer than the {MOUNT_PATH_MAX_BYTES} bytes allowed")]
    MountPathTooLong(usize),
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

/// What [`plan_layer`] found, before anything is written.
#[derive(Debug)]
pub enum Planned {
    /// No layer is needed.
    NotNeeded,
    /// The layer is made already.
    Exists(PathBuf),
    /// The layer to make.
    New(NewLayer),
}

/// A relocation layer not written yet: where it goes and its files.
#[derive(Debug)]
pub struct NewLayer {
    dir: PathBuf,
    groups: Vec<(PathBuf, Vec<u8>)>,
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

/// Moves every relocation layer of the store entry `digest` into
/// `quarantined`, the entry's directory once quarantined (below the same
/// store root), as [`QUARANTINED_LAYERS`]: the digest's next extraction
/// gets layers made afresh from its new tree, a view that stacks one of
/// the old layers keeps it (a rename changes nothing it sees), and the
/// layers go with the quarantined entry once no pod mounts it.
pub fn quarantine_layers(store: &Path, digest: &Digest, quarantined: &Path) -> io::Result<()> {
    match fs::rename(
        layers_of(store, digest),
        quarantined.join(QUARANTINED_LAYERS),
    ) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the relocation layers below `store` that no view stacks: each
/// whose digest and mount path no entry of `in_use` names, of a digest
/// `kept` does not name (a digest some view may stack any layer of), made
/// before `made_before` (a layer made for a publish that has not recorded
/// its mount yet is younger). The layers removed.
pub fn remove_unused_layers(
    store: &Path,
    in_use: &[(&Digest, &Path)],
    kept: &[&Digest],
    made_before: SystemTime,
) -> io::Result<Vec<PathBuf>> {
    let used: HashSet<PathBuf> = in_use
        .iter()
        .map(|(digest, path)| layer_dir(store, digest, path))
        .collect();
    let kept: HashSet<PathBuf> = kept.iter().map(|d| layers_of(store, d)).collect();
    let mut removed = Vec::new();
    for digest in read_dir_or_empty(&store.join(RELOCATIONS_DIR))? {
        let digest = digest?.path();
        if kept.contains(&digest) {
            continue;
        }
        for layer in read_dir_or_empty(&digest)? {
            let layer = layer?;
            let path = layer.path();
            if layer.file_name().as_bytes().starts_with(b".") || used.contains(&path) {
                continue;
            }
            if layer.metadata()?.modified()? < made_before {
                fs::remove_dir_all(&path)?;
                removed.push(path);
            }
        }
    }
    Ok(removed)
}

/// How many relocation layers there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerCount {
    /// Of the digest asked about.
    pub of_digest: u64,
    /// On the node: of every digest.
    pub on_node: u64,
}

/// Counts the relocation layers below `store`: those of `digest`, and all
/// of them (layers being made are not counted).
pub fn count_layers(store: &Path, digest: &Digest) -> io::Result<LayerCount> {
    let mut count = LayerCount::default();
    for entry in read_dir_or_empty(&store.join(RELOCATIONS_DIR))? {
        let entry = entry?;
        let layers = read_dir_or_empty(&entry.path())?
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().as_bytes().starts_with(b"."))
            .count() as u64;
        count.on_node += layers;
        if entry.file_name().as_bytes() == digest.hex().as_bytes() {
            count.of_digest = layers;
        }
    }
    Ok(count)
}

/// Removes what a maker killed half-way left of the layers of `digest`
/// (their temporary directories). Only for a caller that is the only one
/// making layers in `store`.
pub fn sweep_staging(store: &Path, digest: &Digest) -> io::Result<()> {
    for entry in read_dir_or_empty(&layers_of(store, digest))? {
        let entry = entry?;
        if entry
            .file_name()
            .as_bytes()
            .starts_with(STAGING_PREFIX.as_bytes())
        {
            fs::remove_dir_all(entry.path())?;
        }
    }
    Ok(())
}

fn read_dir_or_empty(dir: &Path) -> io::Result<Box<dyn Iterator<Item = io::Result<fs::DirEntry>>>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(Box::new(entries)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Box::new(std::iter::empty())),
        Err(e) => Err(e),
    }
}

/// The relocation layer of the store entry `digest` for `mount_path`, if
/// it is made already; the mount path is checked first.
pub fn find_layer(
    store: &Path,
    digest: &Digest,
    mount_path: &str,
) -> Result<Option<PathBuf>, RelocationError> {
    if mount_path.len() > MOUNT_PATH_MAX_BYTES {
        return Err(RelocationError::MountPathTooLong(mount_path.len()));
    }
    if !is_mount_path(mount_path) {
        return Err(RelocationError::BadMountPath(mount_path.to_string()));
    }
    let dir = layer_dir(store, digest, Path::new(mount_path));
    Ok(dir.is_dir().then_some(dir))
}

/// What the verified `tree` of the store entry `digest` needs to be a hit
/// at `mount_path`: nothing, the layer made already, or the layer to make
/// (its group files read and rewritten, nothing written yet).
pub fn plan_layer(
    store: &Path,
    digest: &Digest,
    tree: &Path,
    mount_path: &str,
) -> Result<Planned, RelocationError> {
    if let Some(dir) = find_layer(store, digest, mount_path)? {
        return Ok(Planned::Exists(dir));
    }
    let dir = layer_dir(store, digest, Path::new(mount_path));
    let groups = gkm_core::cache::relocated_tree(tree, Path::new(mount_path))?;
    if groups.is_empty() {
        return Ok(Planned::NotNeeded);
    }
    Ok(Planned::New(NewLayer { dir, groups }))
}

/// The relocation layer that makes the verified `tree` of the store entry
/// `digest` a hit at `mount_path`, made now if it is not there yet
/// ([`plan_layer`], then [`NewLayer::write`]), unbounded.
pub fn ensure_layer(
    store: &Path,
    digest: &Digest,
    tree: &Path,
    mount_path: &str,
) -> Result<Relocation, RelocationError> {
    match plan_layer(store, digest, tree, mount_path)? {
        Planned::NotNeeded => Ok(Relocation::NotNeeded),
        Planned::Exists(dir) => Ok(Relocation::Layer(dir)),
        Planned::New(layer) => layer.write().map(Relocation::Layer),
    }
}

impl NewLayer {
    /// Where the layer goes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many bytes of disk the layer takes: each file's data in whole
    /// [`LAYER_BLOCK`]s, and one block for each directory, the layer's own
    /// included.
    pub fn bytes(&self) -> u64 {
        let mut dirs = BTreeSet::new();
        let mut bytes = 0u64;
        for (relative, data) in &self.groups {
            let blocks = (data.len() as u64).div_ceil(LAYER_BLOCK).max(1);
            bytes = bytes.saturating_add(blocks.saturating_mul(LAYER_BLOCK));
            dirs.extend(relative.ancestors().skip(1).map(Path::to_path_buf));
        }
        bytes.saturating_add((dirs.len() as u64).saturating_mul(LAYER_BLOCK))
    }

    /// Writes the layer (in a temporary directory beside it, synced and
    /// renamed into place); its directory. When another maker renamed the
    /// same layer into place first, that one is kept and ours removed.
    pub fn write(self) -> Result<PathBuf, RelocationError> {
        let NewLayer { dir, groups } = self;
        let parent = dir.parent().unwrap_or(&dir).to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RelocationError::Io { path, source }
        };
        fs::create_dir_all(&parent).map_err(io(&parent))?;
        let staging = tempfile::Builder::new()
            .prefix(STAGING_PREFIX)
            .tempdir_in(&parent)
            .map_err(io(&parent))?;
        for (relative, bytes) in &groups {
            let path = staging.path().join(relative);
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir).map_err(io(dir))?;
            }
            let mut file = fs::File::create(&path).map_err(io(&path))?;
            file.write_all(bytes).map_err(io(&path))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o444)).map_err(io(&path))?;
        }
        fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755))
            .map_err(io(staging.path()))?;
        // One sync of the filesystem for the whole layer, before it is
        // renamed into place: a layer that exists is whole on disk.
        let top = fs::File::open(staging.path()).map_err(io(staging.path()))?;
        rustix::fs::syncfs(&top).map_err(|e| io(staging.path())(e.into()))?;
        match fs::rename(staging.path(), &dir) {
            Ok(()) => {
                // Renamed away: nothing is left for the guard to remove.
                let _ = staging.keep();
                Ok(dir)
            }
            // Another publish made it first; ours goes with the guard.
            Err(_) if dir.is_dir() => Ok(dir),
            Err(e) => Err(io(&dir)(e)),
        }
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
    fn layers_are_counted_sized_before_writing_and_quarantined_with_their_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tree(tmp.path());
        let store = tmp.path().join("store");
        let (digest, other) = (Digest::of(b"entry"), Digest::of(b"other"));
        let Planned::New(layer) = plan_layer(&store, &digest, &tree, "/mnt/a").unwrap() else {
            panic!("a layer to make");
        };
        // One group file, its key directory and the layer's own: a block
        // each.
        assert_eq!(layer.bytes(), 3 * LAYER_BLOCK);
        assert!(!store.exists(), "nothing written while planning");
        layer.write().unwrap();
        for (digest, path) in [(&digest, "/mnt/b"), (&other, "/mnt/a")] {
            ensure_layer(&store, digest, &tree, path).unwrap();
        }
        // What a maker killed half-way leaves is not a layer, and is swept.
        let left = layers_of(&store, &digest).join(".making-x");
        fs::create_dir_all(&left).unwrap();
        assert_eq!(
            count_layers(&store, &digest).unwrap(),
            LayerCount {
                of_digest: 2,
                on_node: 3
            }
        );
        sweep_staging(&store, &digest).unwrap();
        assert!(!left.exists());
        assert!(matches!(
            plan_layer(&store, &digest, &tree, "/mnt/a").unwrap(),
            Planned::Exists(_)
        ));
        let long = format!("/{}", "a".repeat(MOUNT_PATH_MAX_BYTES));
        assert!(matches!(
            plan_layer(&store, &digest, &tree, &long),
            Err(RelocationError::MountPathTooLong(n)) if n == MOUNT_PATH_MAX_BYTES + 1
        ));
        // A quarantine takes the digest's layers into the quarantined entry.
        let quarantined = store.join("quarantine/entry.1");
        fs::create_dir_all(&quarantined).unwrap();
        quarantine_layers(&store, &digest, &quarantined).unwrap();
        assert!(!layers_of(&store, &digest).exists());
        assert_eq!(
            names(&quarantined.join(QUARANTINED_LAYERS)).len(),
            2,
            "both layers kept in the quarantined entry"
        );
        assert_eq!(count_layers(&store, &digest).unwrap().on_node, 1);
        quarantine_layers(&store, &digest, &quarantined).unwrap();
    }

    #[test]
    fn only_layers_no_view_stacks_and_made_a_while_ago_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tree(tmp.path());
        let store = tmp.path().join("store");
        let digest = Digest::of(b"entry");
        for path in ["/mnt/a", "/mnt/b"] {
            ensure_layer(&store, &digest, &tree, path).unwrap();
        }
        let in_use = [(&digest, Path::new("/mnt/b"))];
        let long_ago = SystemTime::UNIX_EPOCH;
        assert!(
            remove_unused_layers(&store, &in_use, &[], long_ago)
                .unwrap()
                .is_empty(),
            "a layer made since is kept"
        );
        let later = SystemTime::now() + std::time::Duration::from_secs(60);
        assert!(
            remove_unused_layers(&store, &in_use, &[&digest], later)
                .unwrap()
                .is_empty(),
            "every layer of a digest kept whole is kept"
        );
        let removed = remove_unused_layers(&store, &in_use, &[], later).unwrap();
        assert_eq!(removed, [layer_dir(&store, &digest, Path::new("/mnt/a"))]);
        assert!(layer_dir(&store, &digest, Path::new("/mnt/b")).is_dir());
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
