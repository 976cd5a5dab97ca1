//! A writable view of a read-only cache tree, laid into a directory the
//! workload may write (an `emptyDir`): what `gkm view FROM INTO` does in an
//! init container, for delivery paths whose tree is mounted read-only or
//! shared (image volumes, PVCs).
//!
//! The view holds:
//! - a directory, writable by the pod, for every directory of the tree, so
//!   a workload makes new kernel directories, lock files and temporary
//!   files anywhere in it;
//! - a symbolic link to the tree's file for every other file, so nothing is
//!   copied and the tree itself is never written (a workload replacing a
//!   file replaces the link in its own view);
//! - a real file for every file that binds the tree to an absolute path,
//!   rewritten for the path the workload sees the view at, by the rules of
//!   the tree's kind ([`kind_of_tree`], [`Kind::build_path`](crate::cache::Kind::build_path),
//!   [`Kind::relocated`](crate::cache::Kind::relocated)): for every kind gkm
//!   knows, Triton's group files (`__grp__<kernel>.json`, also those of an
//!   Inductor tree's `triton/` or a vLLM tree), which name their children by
//!   absolute path.
//!
//! Refused, naming the entry: a link of the tree that leads out of it, and
//! a torn entry (the kind decides both what is torn and where the tree was
//! built). Laying a view again over one laid before (a restarted init
//! container) replaces each entry with the same one and keeps what the
//! workload added.
//!
//! A tree filled into a claim by gkm keeps its files at `.gkm/current`, its
//! root holding links into it; the view is laid from there (see
//! [`tree_root`]).

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use crate::cache::{CacheError, kind_of_tree};

/// Where a claim filled by gkm keeps the tree it serves, below its root.
pub const CLAIM_TREE: &str = ".gkm/current";

/// Mode of the view's directories (the setgid bit an `fsGroup` volume gives
/// is kept): the pod's user and group write in them.
const DIR_MODE: u32 = 0o775;

/// Mode of the relocated files the view writes.
const GROUP_MODE: u32 = 0o664;

/// Why a view could not be laid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ViewError {
    /// A file or directory could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        error: io::Error,
    },
    /// A link of the tree leads out of it.
    #[error("{entry}: a link to {target}, outside the tree {tree}")]
    LinkOut {
        /// The link, below the tree.
        entry: PathBuf,
        /// Where it leads.
        target: PathBuf,
        /// The tree.
        tree: PathBuf,
    },
    /// The tree is not one a view can be laid of (a torn group, groups built
    /// at two paths, a group file that is not one).
    #[error("{tree}: {source}")]
    Tree {
        /// The tree.
        tree: PathBuf,
        /// What is wrong with it.
        source: CacheError,
    },
    /// The arguments cannot make a view.
    #[error("{0}")]
    Usage(String),
}

/// What laying a view did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewStats {
    /// The tree the view shows (the source, or its claim tree).
    pub tree: PathBuf,
    /// Where the tree was built (`None`: nothing in it binds to a path).
    pub built_at: Option<PathBuf>,
    /// The path the view's relocated files name.
    pub mount_path: PathBuf,
    /// Directories made (or found made).
    pub dirs: u64,
    /// Files linked to the tree's.
    pub links: u64,
    /// Files written relocated for [`ViewStats::mount_path`] (Triton's
    /// group files).
    pub groups: u64,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ViewError + '_ {
    move |error| ViewError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// The tree a view of `from` shows: `from/.gkm/current` when `from` is a
/// claim gkm filled, else `from` itself.
pub fn tree_root(from: &Path) -> PathBuf {
    let claim = from.join(CLAIM_TREE);
    if claim.is_dir() {
        claim
    } else {
        from.to_path_buf()
    }
}

/// Lays into `into` a writable view of the read-only tree at `from` (see
/// the [module](self)), its group files naming `mount_path`, the path the
/// workload sees `into` at (`None`: `into` itself). Links name the tree's
/// files by `from` as given, so the workload mounts the source at the same
/// path as the process that lays the view.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
/// std::fs::create_dir_all(from.join("KEY"))?;
/// std::fs::write(from.join("KEY/k.cubin"), b"x")?;
/// std::fs::write(
///     from.join("KEY/__grp__k.json"),
///     br#"{"child_paths": {"k.cubin": "/build/cache/KEY/k.cubin"}}"#,
/// )?;
/// let stats = gkm_core::view::lay_view(&from, &into, Some("/root/.triton/cache".as_ref()))?;
/// assert_eq!((stats.dirs, stats.links, stats.groups), (1, 1, 1));
/// let group = std::fs::read_to_string(into.join("KEY/__grp__k.json"))?;
/// assert!(group.contains("/root/.triton/cache/KEY/k.cubin"));
/// # Ok(()) }
/// ```
pub fn lay_view(
    from: &Path,
    into: &Path,
    mount_path: Option<&Path>,
) -> Result<ViewStats, ViewError> {
    let tree = tree_root(from);
    let mount_path = mount_path.unwrap_or(into).to_path_buf();
    if !mount_path.is_absolute() {
        return Err(ViewError::Usage(format!(
            "the mount path {} is not absolute",
            mount_path.display()
        )));
    }
    let canonical = fs::canonicalize(&tree).map_err(io_at(&tree))?;
    if !canonical.is_dir() {
        return Err(ViewError::Usage(format!(
            "{} is not a directory",
            tree.display()
        )));
    }
    if resolved_ancestor(into)?.starts_with(&canonical) {
        return Err(ViewError::Usage(format!(
            "{} is inside the tree {}: lay the view into another directory",
            into.display(),
            tree.display()
        )));
    }
    fs::create_dir_all(into).map_err(io_at(into))?;
    let tree_error = |source| ViewError::Tree {
        tree: tree.clone(),
        source,
    };
    let rules = kind_of_tree(&tree).map_err(tree_error)?.rules();
    let built_at = rules.build_path(&tree).map_err(tree_error)?;
    let relocated = match &built_at {
        Some(built) if *built != mount_path => {
            rules.relocated(&tree, &mount_path).map_err(tree_error)?
        }
        _ => Vec::new(),
    };
    let mut layer = Layer {
        tree: &tree,
        canonical: &canonical,
        into,
        relocated: relocated.into_iter().collect(),
        stats: ViewStats::default(),
    };
    layer.dir(Path::new(""))?;
    let stats = layer.stats;
    Ok(ViewStats {
        tree,
        built_at,
        mount_path,
        ..stats
    })
}

/// `path` with every link resolved, as far as it exists (the rest kept).
fn resolved_ancestor(path: &Path) -> Result<PathBuf, ViewError> {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        match fs::canonicalize(existing) {
            Ok(resolved) => return Ok(missing.iter().rev().fold(resolved, |p, n| p.join(n))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(io_at(path)(e));
                };
                missing.push(name.to_os_string());
                existing = if parent.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    parent
                };
            }
            Err(e) => return Err(io_at(path)(e)),
        }
    }
}

/// One laying of a view.
struct Layer<'a> {
    /// The tree as given (links name its files by it).
    tree: &'a Path,
    /// The tree, every link resolved (what links must stay in).
    canonical: &'a Path,
    /// The view's root.
    into: &'a Path,
    /// The files that bind to a path, by their path below the tree, as
    /// they read at the mount path (empty: the tree is seen where it was
    /// built).
    relocated: BTreeMap<PathBuf, Vec<u8>>,
    stats: ViewStats,
}

impl Layer<'_> {
    /// Lays the tree's directory `rel` (below the tree) and what it holds.
    fn dir(&mut self, rel: &Path) -> Result<(), ViewError> {
        let at = self.into.join(rel);
        // The view's root is the volume's (an emptyDir's mode and owner are
        // the kubelet's): only the directories below it are the view's.
        if !rel.as_os_str().is_empty() {
            make_dir(&at)?;
            self.stats.dirs += 1;
        }
        let source = self.tree.join(rel);
        let mut entries = Vec::new();
        for entry in fs::read_dir(&source).map_err(io_at(&source))? {
            let entry = entry.map_err(io_at(&source))?;
            let kind = entry.file_type().map_err(io_at(&entry.path()))?;
            entries.push((entry.file_name(), kind));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind) in entries {
            let rel = rel.join(&name);
            if kind.is_dir() {
                self.dir(&rel)?;
            } else if kind.is_symlink() {
                self.check_link(&rel)?;
                self.link(&rel)?;
            } else if let Some(bytes) = self.relocated.remove(&rel) {
                self.write(&rel, &bytes)?;
            } else {
                self.link(&rel)?;
            }
        }
        Ok(())
    }

    /// Refuses the tree's link `rel` when it leads out of the tree.
    fn check_link(&self, rel: &Path) -> Result<(), ViewError> {
        let link = self.tree.join(rel);
        let target = fs::read_link(&link).map_err(io_at(&link))?;
        let resolved = fs::canonicalize(&link);
        match resolved {
            Ok(resolved) if resolved.starts_with(self.canonical) => Ok(()),
            _ => Err(ViewError::LinkOut {
                entry: rel.to_path_buf(),
                target,
                tree: self.tree.to_path_buf(),
            }),
        }
    }

    /// Links the view's `rel` to the tree's.
    fn link(&mut self, rel: &Path) -> Result<(), ViewError> {
        let target = self.tree.join(rel);
        let at = self.into.join(rel);
        if fs::read_link(&at).is_ok_and(|t| t == target) {
            self.stats.links += 1;
            return Ok(());
        }
        let temporary = temporary(&at);
        let _ = fs::remove_file(&temporary);
        symlink(&target, &temporary).map_err(io_at(&temporary))?;
        fs::rename(&temporary, &at).map_err(io_at(&at))?;
        self.stats.links += 1;
        Ok(())
    }

    /// Writes the tree's file `rel` into the view as `bytes`: relocated for
    /// the mount path.
    fn write(&mut self, rel: &Path, bytes: &[u8]) -> Result<(), ViewError> {
        let at = self.into.join(rel);
        let temporary = temporary(&at);
        let _ = fs::remove_file(&temporary);
        fs::write(&temporary, bytes).map_err(io_at(&temporary))?;
        fs::set_permissions(&temporary, fs::Permissions::from_mode(GROUP_MODE))
            .map_err(io_at(&temporary))?;
        fs::rename(&temporary, &at).map_err(io_at(&at))?;
        self.stats.groups += 1;
        Ok(())
    }
}

/// The name an entry of the view is made at before it is renamed to `at`.
fn temporary(at: &Path) -> PathBuf {
    let mut name = at.file_name().unwrap_or_default().to_os_string();
    name.push(".gkm-view");
    at.with_file_name(name)
}

/// Makes the view's directory `at` (kept when it is one), writable by the
/// pod's user and group, keeping the setgid bit it inherited.
fn make_dir(at: &Path) -> Result<(), ViewError> {
    match fs::symlink_metadata(at) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            // A link or file where the tree has a directory (a view laid
            // of another tree): the directory wins.
            fs::remove_file(at).map_err(io_at(at))?;
            fs::create_dir(at).map_err(io_at(at))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir(at).map_err(io_at(at))?;
        }
        Err(error) => {
            return Err(ViewError::Io {
                path: at.to_path_buf(),
                error,
            });
        }
    }
    let mode = fs::metadata(at).map_err(io_at(at))?.permissions().mode();
    let wanted = (mode & 0o7000) | DIR_MODE;
    if mode & 0o7777 != wanted {
        fs::set_permissions(at, fs::Permissions::from_mode(wanted)).map_err(io_at(at))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const BUILT: &str = "/build/cache";

    /// A Triton key directory `key` below `root` with a kernel and its
    /// group, built at `BUILT/<place>`.
    fn kernel(root: &Path, place: &str, key: &str) {
        let dir = root.join(place).join(key);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("k.cubin"), b"cubin").unwrap();
        fs::write(dir.join("k.json"), b"{}").unwrap();
        let base = Path::new(BUILT).join(place).join(key);
        let group = serde_json::json!({"child_paths": {
            "k.cubin": base.join("k.cubin"), "k.json": base.join("k.json")}});
        fs::write(dir.join("__grp__k.json"), group.to_string()).unwrap();
    }

    fn snapshot(root: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
        let mut out = Vec::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let bytes = if meta.is_file() {
                    fs::read(&path).unwrap()
                } else {
                    Vec::new()
                };
                if meta.is_dir() {
                    pending.push(path.clone());
                }
                out.push((path, bytes, meta.mode()));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_view_links_every_file_and_relocates_every_group_to_the_mount_path() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        kernel(&from, "torch/triton", "BBB");
        fs::write(from.join("torch/fxgraph"), b"graph").unwrap();
        let before = snapshot(&from);

        let stats = lay_view(&from, &into, Some(Path::new("/root/.cache"))).unwrap();
        assert_eq!(stats.built_at.as_deref(), Some(Path::new(BUILT)));
        assert_eq!(
            (stats.dirs, stats.links, stats.groups),
            (4, 5, 2),
            "{stats:?}"
        );
        assert_eq!(
            fs::read_link(into.join("AAA/k.cubin")).unwrap(),
            from.join("AAA/k.cubin")
        );
        assert_eq!(fs::read(into.join("torch/fxgraph")).unwrap(), b"graph");
        let group: serde_json::Value =
            serde_json::from_slice(&fs::read(into.join("torch/triton/BBB/__grp__k.json")).unwrap())
                .unwrap();
        assert_eq!(
            group["child_paths"]["k.cubin"],
            "/root/.cache/torch/triton/BBB/k.cubin"
        );
        assert!(
            !fs::symlink_metadata(into.join("AAA/__grp__k.json"))
                .unwrap()
                .is_symlink()
        );
        // The pod writes in the view; the tree is untouched.
        fs::write(into.join("AAA/new.cubin"), b"new").unwrap();
        fs::create_dir(into.join("NEW")).unwrap();
        assert_eq!(snapshot(&from), before);
        let mode = fs::metadata(into.join("torch/triton/BBB")).unwrap().mode();
        assert_eq!(mode & 0o777, DIR_MODE);
    }

    #[test]
    fn the_views_root_keeps_the_mode_its_volume_gave_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        // An emptyDir: world-writable, owned by whoever made it, which the
        // view's user may not change.
        fs::create_dir(&into).unwrap();
        fs::set_permissions(&into, fs::Permissions::from_mode(0o1777)).unwrap();
        lay_view(&from, &into, None).unwrap();
        assert_eq!(fs::metadata(&into).unwrap().mode() & 0o7777, 0o1777);
    }

    #[test]
    fn laying_a_view_again_gives_the_same_view_and_keeps_what_the_pod_wrote() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        lay_view(&from, &into, None).unwrap();
        fs::write(into.join("AAA/new.cubin"), b"new").unwrap();
        let first = snapshot(&into);
        // A half-laid view: a link gone, a group file cut short.
        fs::remove_file(into.join("AAA/k.json")).unwrap();
        fs::write(into.join("AAA/__grp__k.json"), b"{").unwrap();
        let stats = lay_view(&from, &into, None).unwrap();
        assert_eq!(snapshot(&into), first);
        assert_eq!(stats.mount_path, into);
        let group = fs::read_to_string(into.join("AAA/__grp__k.json")).unwrap();
        assert!(
            group.contains(&format!("{}/AAA/k.json", into.display())),
            "{group}"
        );
    }

    #[test]
    fn a_tree_seen_where_it_was_built_keeps_its_groups_as_links() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        let stats = lay_view(&from, &into, Some(Path::new(BUILT))).unwrap();
        assert_eq!((stats.links, stats.groups), (3, 0));
        assert!(
            fs::symlink_metadata(into.join("AAA/__grp__k.json"))
                .unwrap()
                .is_symlink()
        );
    }

    #[test]
    fn a_link_out_of_the_tree_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        fs::write(tmp.path().join("secret"), b"s").unwrap();
        symlink("../../secret", from.join("AAA/k.ptx")).unwrap();
        let err = lay_view(&from, &into, None).unwrap_err().to_string();
        assert!(
            err.contains("AAA/k.ptx") && err.contains("outside"),
            "{err}"
        );
        fs::remove_file(from.join("AAA/k.ptx")).unwrap();
        // A link within the tree is shown as a link to it.
        symlink("k.cubin", from.join("AAA/k.ptx")).unwrap();
        lay_view(&from, &into, None).unwrap();
        assert_eq!(fs::read(into.join("AAA/k.ptx")).unwrap(), b"cubin");
    }

    #[test]
    fn a_torn_group_is_refused_naming_the_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("from"), tmp.path().join("into"));
        kernel(&from, "", "AAA");
        fs::remove_file(from.join("AAA/k.cubin")).unwrap();
        let err = lay_view(&from, &into, None).unwrap_err().to_string();
        assert!(err.contains("k.cubin") && err.contains("missing"), "{err}");
    }

    #[test]
    fn a_claim_filled_by_gkm_is_viewed_from_its_current_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, into) = (tmp.path().join("claim"), tmp.path().join("into"));
        kernel(&from.join(".gkm/sha256-1"), "", "AAA");
        symlink("sha256-1", from.join(".gkm/current")).unwrap();
        symlink(".gkm/current/AAA", from.join("AAA")).unwrap();
        let stats = lay_view(&from, &into, Some(Path::new("/cache"))).unwrap();
        assert_eq!((stats.dirs, stats.links, stats.groups), (1, 2, 1));
        assert!(!into.join(".gkm").exists());
        assert_eq!(
            fs::read_link(into.join("AAA/k.cubin")).unwrap(),
            from.join(".gkm/current/AAA/k.cubin")
        );
    }

    #[test]
    fn a_view_into_its_own_tree_or_at_a_relative_path_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let from = tmp.path().join("from");
        kernel(&from, "", "AAA");
        let err = lay_view(&from, &from.join("v"), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("inside the tree"), "{err}");
        let err = lay_view(&from, &tmp.path().join("v"), Some(Path::new("rel")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not absolute"), "{err}");
    }
}
