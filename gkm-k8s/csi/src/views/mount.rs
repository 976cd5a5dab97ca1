//! Read-only views of a tree that stay read-only wherever their mount is
//! copied, writable copy-on-write views whose writes go to a private upper
//! layer ([`mount_writable_view`]), and finding what is mounted where (read from
//! `/proc/self/mountinfo` with [`gkm_k8s_node::mountinfo`]).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::mount::UnmountFlags;

use gkm_k8s_node::mountinfo::{MOUNTINFO, MountInfo, parse_mountinfo};

/// The topmost mount at exactly `path`, if `path` is a mount point.
pub fn mount_at(path: &Path) -> io::Result<Option<MountInfo>> {
    let path = match fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let content = fs::read_to_string(MOUNTINFO)?;
    Ok(parse_mountinfo(&content)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// Whether `a` and `b` are the same directory (same device and inode), as a
/// bind mount and its source are.
pub fn same_directory(a: &Path, b: &Path) -> io::Result<bool> {
    let (a, b) = (fs::metadata(a)?, fs::metadata(b)?);
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// The cache tree of a store entry (`io.triton.cache/` or `io.vllm.cache/`
/// inside `<store>/sha256/<hex>/`), the directory a pod sees at its volume
/// root: a Triton cache's hash directories, a vLLM cache's
/// `torch_compile_cache/`. The image's manifest directory stays outside it.
///
/// The entry and the tree are opened with `O_PATH | O_NOFOLLOW`, so neither
/// may be a symbolic link, and the mount is made from the open descriptor
/// ([`CacheTree::mount_source`]), so nothing can swap the directory between
/// the check and the mount.
#[derive(Debug)]
pub struct CacheTree {
    fd: std::os::fd::OwnedFd,
    /// The tree's path, for messages.
    pub path: PathBuf,
}

impl CacheTree {
    /// Opens the single cache tree of the store entry `entry`.
    pub fn open(entry: &Path) -> io::Result<CacheTree> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let not_a_directory = |path: &Path, e: rustix::io::Errno| {
            if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a directory (a symbolic link or a file): refused",
                        path.display()
                    ),
                )
            } else {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("opening {}: {e}", path.display()),
                )
            }
        };
        let entry_fd =
            rustix::fs::open(entry, flags, Mode::empty()).map_err(|e| not_a_directory(entry, e))?;
        let mut found = None;
        for layout in gkm_core::image_layout::ALL {
            let path = entry.join(layout.cache_dir);
            match rustix::fs::openat(&entry_fd, layout.cache_dir, flags, Mode::empty()) {
                Ok(fd) if found.is_none() => found = Some(CacheTree { fd, path }),
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} holds more than one cache tree", entry.display()),
                    ));
                }
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(not_a_directory(&path, e)),
            }
        }
        found.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} holds no cache tree ({}/ or {}/)",
                    entry.display(),
                    gkm_core::image_layout::TRITON.cache_dir,
                    gkm_core::image_layout::VLLM.cache_dir
                ),
            )
        })
    }

    /// The path to mount from: the open descriptor in `/proc/self/fd`.
    pub fn mount_source(&self) -> PathBuf {
        fd_path(&self.fd)
    }
}

/// An empty directory the driver keeps as the second layer of every
/// read-only view (an overlay with no upper layer needs two lower ones),
/// held open so that the path cannot be swapped under a mount.
#[derive(Debug)]
pub struct EmptyLayer {
    dir: OpenDir,
    path: PathBuf,
}

impl EmptyLayer {
    /// The directory `dir` (made if missing, mode 0555), which must be empty
    /// and not a symbolic link.
    pub fn prepare(dir: &Path) -> io::Result<EmptyLayer> {
        use rustix::fs::{Mode, OFlags};
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o555)
                .create(dir)?;
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o555))?;
        let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(dir, flags, Mode::empty())
            .map_err(|e| context(e, format!("opening {}", dir.display())))?;
        let layer = EmptyLayer {
            dir: OpenDir(fd),
            path: dir.to_path_buf(),
        };
        layer.check()?;
        Ok(layer)
    }

    /// Fails when something was put into the directory: it would show in
    /// every view.
    fn check(&self) -> io::Result<()> {
        if fs::read_dir(self.source())?.next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not empty: refusing to add its files to every cache a pod mounts",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    fn source(&self) -> PathBuf {
        self.dir.source()
    }
}

/// A directory held open by an `O_PATH` descriptor, named by
/// `/proc/self/fd/<n>` while it is.
#[derive(Debug)]
struct OpenDir(std::os::fd::OwnedFd);

impl OpenDir {
    fn open(dir: &Path) -> io::Result<OpenDir> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        rustix::fs::open(dir, flags, Mode::empty())
            .map(OpenDir)
            .map_err(|e| context(e, format!("opening {}", dir.display())))
    }

    fn source(&self) -> PathBuf {
        fd_path(&self.0)
    }
}

/// The path naming the open descriptor `fd` (`/proc/self/fd/<n>`), to mount
/// from.
fn fd_path(fd: &std::os::fd::OwnedFd) -> PathBuf {
    use std::os::fd::AsRawFd;
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Mounts a read-only view of the directory `tree` (a path that names it,
/// such as [`CacheTree::mount_source`]) at `target` (an existing directory),
/// named `name` (the mount's source in the mount table, by which
/// [`is_view`] knows it again).
///
/// The view is an overlay whose only layers are `tree` and the empty
/// layer: an overlay without an upper layer is a read-only filesystem, so
/// the view stays read-only wherever its mount is copied and whatever is
/// done to those copies' flags. A read-only bind mount would not: its flag
/// belongs to one mount, a copy propagated to the host (the driver runs in
/// a container whose pods directory is `Bidirectional`) has the flags its
/// source had when it was attached, and a container runtime asked for a
/// writable volume remounts its bind `rw`, which reaches the store. The
/// mount is also made detached (`fsopen`, `fsmount` with `ro`, `nosuid`,
/// `nodev`) and attached at `target` whole (`move_mount`): there is no
/// moment in which anything is mounted at `target` but the finished view,
/// and a driver killed half-way leaves nothing mounted. The overlay follows
/// no redirect or metacopy attribute of the tree.
pub fn mount_read_only_view(
    tree: &Path,
    relocation: Option<&Path>,
    empty: &EmptyLayer,
    name: &str,
    target: &Path,
) -> io::Result<()> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, fsconfig_create,
        fsconfig_set_string, fsmount, fsopen, move_mount,
    };
    empty.check()?;
    // Both layers are named by descriptors held open, so no path can be
    // swapped between here and the mount, and no character of a path
    // (`:`, `,`) can be read as an overlay option.
    let tree = OpenDir::open(tree)?;
    let relocation = relocation.map(OpenDir::open).transpose()?;
    let what = |step: &str| {
        format!(
            "mounting the read-only view {name} at {} ({step})",
            target.display()
        )
    };
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| context(e, what("fsopen overlay: is overlayfs available?")))?;
    let lower = lower_dirs(relocation.as_ref(), &tree, Some(&empty.source()));
    for (key, value) in [
        ("source", name),
        ("lowerdir", lower.as_str()),
        ("redirect_dir", "nofollow"),
        ("metacopy", "off"),
    ] {
        fsconfig_set_string(&fs, key, value)
            .map_err(|e| context(e, what(&format!("{key}={value}"))))?;
    }
    fsconfig_create(&fs).map_err(|e| context(e, what("creating the overlay")))?;
    let attrs = MountAttrFlags::MOUNT_ATTR_RDONLY
        | MountAttrFlags::MOUNT_ATTR_NOSUID
        | MountAttrFlags::MOUNT_ATTR_NODEV;
    let view = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(|e| context(e, what("fsmount")))?;
    move_mount(
        &view,
        c"",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| context(e, what("move_mount")))
}

/// An overlay's `lowerdir`, topmost first: the relocation layer when there
/// is one (its rewritten group files hide the tree's), the tree, and the
/// empty layer a view without an upper needs.
fn lower_dirs(relocation: Option<&OpenDir>, tree: &OpenDir, empty: Option<&Path>) -> String {
    relocation
        .map(OpenDir::source)
        .into_iter()
        .chain([tree.source()])
        .chain(empty.map(Path::to_path_buf))
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Whether `mount` is the read-only view named `name`.
pub fn is_view(mount: &MountInfo, name: &str) -> bool {
    mount.fs_type == "overlay" && mount.source == name && mount.is_read_only()
}

/// Whether `mount` is the writable view named `name`.
pub fn is_writable_view(mount: &MountInfo, name: &str) -> bool {
    mount.fs_type == "overlay" && mount.source == name && !mount.is_read_only()
}

/// The mode of a directory a pod's fsGroup writes: `rwxrwsr-x` (setgid, so
/// what is made in it belongs to the group too).
pub const GROUP_WRITABLE_DIR: u32 = 0o2775;

/// The upper and work directories of a writable view (an upper's
/// `upper/` and `work/`).
#[derive(Debug, Clone, Copy)]
pub struct UpperLayers<'a> {
    /// The upper layer: what the pod writes.
    pub upper: &'a Path,
    /// Overlayfs's work directory, on the same filesystem.
    pub work: &'a Path,
}

/// Mounts a writable, copy-on-write view of the directory `tree` (a path
/// that names it, such as [`CacheTree::mount_source`]) at `target`, named
/// `name`: an overlay whose only lower layer is `tree`, never written, and
/// whose upper and work directories are `layers`, private to this view.
///
/// The options are pinned, whatever the kernel's defaults: `index=off`,
/// `metacopy=off` (a changed file is copied up whole, so the upper alone
/// holds everything the pod wrote), `redirect_dir=off` (a renamed lower
/// directory is copied, not redirected), `xino=off` (upper and lower are on
/// different filesystems, see [`super::upper`]); `userxattr` is not set (the
/// driver is privileged, the overlay keeps its attributes in `trusted.*`).
/// The mount is `nosuid`, `nodev`.
///
/// With `group` (the pod's fsGroup and the directories of `tree`, listed
/// by [`directories_below`] within a bound), every directory of `tree` is made
/// `root:group`, mode `2775`, in the view before it is attached, so that a
/// pod running as any user of that group writes anywhere in it: each such
/// change copies the directory (not its files) up. The store's files stay
/// `0644 root` in the view: a pod replaces one (unlink, create, rename in a
/// directory it writes), it does not write into it. Returns how many
/// directories were made writable.
///
/// Like [`mount_read_only_view`], the view is made detached and attached
/// whole: nothing is mounted at `target` but the finished view.
pub fn mount_writable_view(
    tree: &Path,
    relocation: Option<&Path>,
    layers: UpperLayers<'_>,
    group: Option<GroupWritable<'_>>,
    name: &str,
    target: &Path,
) -> io::Result<usize> {
    use rustix::mount::{
        FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, fsconfig_create,
        fsconfig_set_string, fsmount, fsopen, move_mount,
    };
    let tree = OpenDir::open(tree)?;
    let relocation = relocation.map(OpenDir::open).transpose()?;
    let upper_dir = OpenDir::open(layers.upper)?;
    let work_dir = OpenDir::open(layers.work)?;
    let what = |step: &str| {
        format!(
            "mounting the writable view {name} at {} ({step})",
            target.display()
        )
    };
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| context(e, what("fsopen overlay: is overlayfs available?")))?;
    let lower = lower_dirs(relocation.as_ref(), &tree, None);
    let upper_path = upper_dir.source().display().to_string();
    let work_path = work_dir.source().display().to_string();
    for (key, value) in [
        ("source", name),
        ("lowerdir", lower.as_str()),
        ("upperdir", upper_path.as_str()),
        ("workdir", work_path.as_str()),
        ("index", "off"),
        ("metacopy", "off"),
        ("redirect_dir", "off"),
        ("xino", "off"),
    ] {
        fsconfig_set_string(&fs, key, value)
            .map_err(|e| context(e, what(&format!("{key}={value}"))))?;
    }
    fsconfig_create(&fs).map_err(|e| context(e, what("creating the overlay")))?;
    let attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    let view = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(|e| context(e, what("fsmount")))?;
    let made_writable = match group {
        Some(group) => open_directories_to_group(&view, group).map_err(|e| {
            let gid = group.gid;
            io::Error::new(e.kind(), what(&format!("directories for group {gid}: {e}")))
        })?,
        None => 0,
    };
    move_mount(
        &view,
        c"",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| context(e, what("move_mount")))?;
    Ok(made_writable)
}

/// The directories below `tree` (not `tree` itself), as paths relative to
/// it, when there are at most `max` of them; `None` when there are more
/// (the walk stops there). No symbolic link is followed. What a writable
/// view for a pod with an fsGroup makes writable by the group
/// ([`GroupWritable`]).
pub fn directories_below(tree: &Path, max: usize) -> io::Result<Option<Vec<PathBuf>>> {
    let mut found = Vec::new();
    let mut next = 0;
    let mut dir = Some(PathBuf::new());
    while let Some(rel) = dir {
        for entry in fs::read_dir(tree.join(&rel))? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            if found.len() == max {
                return Ok(None);
            }
            found.push(rel.join(entry.file_name()));
        }
        dir = found.get(next).cloned();
        next += 1;
    }
    Ok(Some(found))
}

/// The directories of a writable view its pod's fsGroup writes.
#[derive(Debug, Clone, Copy)]
pub struct GroupWritable<'a> {
    /// The pod's fsGroup.
    pub gid: u32,
    /// Every directory of the tree, relative to it
    /// ([`directories_below`]).
    pub dirs: &'a [PathBuf],
}

/// Makes every directory of `group` `root:gid`, mode
/// [`GROUP_WRITABLE_DIR`], in the detached view `view` (each change copies
/// the directory up); how many.
fn open_directories_to_group(
    view: &std::os::fd::OwnedFd,
    group: GroupWritable<'_>,
) -> io::Result<usize> {
    use rustix::fs::{AtFlags, Gid, Mode, Uid, chmodat, chownat};
    let mode = Mode::from_raw_mode(GROUP_WRITABLE_DIR as rustix::fs::RawMode);
    for rel in group.dirs {
        chownat(
            view,
            rel,
            Some(Uid::ROOT),
            Some(Gid::from_raw(group.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| context(e, format!("chown {}", rel.display())))?;
        chmodat(view, rel, mode, AtFlags::empty())
            .map_err(|e| context(e, format!("chmod {}", rel.display())))?;
    }
    Ok(group.dirs.len())
}

/// Bind-mounts `source` onto `target`, with the flags `source`'s mount has
/// (a capture tree's tmpfs is `nosuid`, `nodev`): a bind takes its source's
/// flags, here and in every copy that propagates.
pub fn bind(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, target).map_err(|e| {
        context(
            e,
            format!(
                "bind-mounting {} onto {}",
                source.display(),
                target.display()
            ),
        )
    })
}

fn context(e: rustix::io::Errno, what: String) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Unmount everything stacked at `target`; how many mounts were removed
/// (0 when it was not a mount point or does not exist).
pub fn unmount_all(target: &Path) -> io::Result<usize> {
    let mut removed = 0;
    // A bound on stacked mounts, so a mount that keeps coming back cannot
    // loop forever.
    for _ in 0..16 {
        if mount_at(target)?.is_none() {
            return Ok(removed);
        }
        rustix::mount::unmount(target, UnmountFlags::empty())?;
        removed += 1;
    }
    Err(io::Error::other(format!(
        "{} is still a mount point after {removed} unmounts",
        target.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_tree_is_a_real_directory_inside_the_entry() {
        let store = tempfile::tempdir().expect("tempdir");
        let entry = store.path().join("sha256/ab");
        fs::create_dir_all(entry.join("io.triton.cache/HASH")).expect("tree");
        fs::create_dir_all(entry.join("io.triton.manifest")).expect("manifest dir");
        let tree = CacheTree::open(&entry).expect("opened");
        assert_eq!(tree.path, entry.join("io.triton.cache"));
        assert!(
            tree.mount_source().join("HASH").is_dir(),
            "the descriptor names the tree"
        );

        // A symbolic link where the tree should be is refused, wherever it points.
        let linked = store.path().join("sha256/cd");
        fs::create_dir_all(&linked).expect("entry");
        std::os::unix::fs::symlink(
            entry.join("io.triton.cache"),
            linked.join("io.triton.cache"),
        )
        .expect("symlink");
        let err = CacheTree::open(&linked).expect_err("refused");
        assert!(err.to_string().contains("not a directory"), "{err}");
        // So is an entry that is itself a link, or one with two trees or none.
        std::os::unix::fs::symlink(&entry, store.path().join("sha256/ef")).expect("symlink");
        assert!(CacheTree::open(&store.path().join("sha256/ef")).is_err());
        fs::create_dir_all(entry.join("io.vllm.cache")).expect("second tree");
        let err = CacheTree::open(&entry).expect_err("two trees");
        assert!(err.to_string().contains("more than one"), "{err}");
        let empty = store.path().join("sha256/00");
        fs::create_dir_all(&empty).expect("entry");
        let err = CacheTree::open(&empty).expect_err("no tree");
        assert!(err.to_string().contains("holds no cache tree"), "{err}");
    }

    #[test]
    fn missing_path_is_no_mount() {
        assert_eq!(
            mount_at(Path::new("/nonexistent/gkm/target")).expect("mount_at"),
            None
        );
        assert!(mount_at(Path::new("/proc")).expect("mount_at").is_some());
    }
}
