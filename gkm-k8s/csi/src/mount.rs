//! Read-only bind mounts, and finding what is mounted where (read from
//! `/proc/self/mountinfo` with [`gkm_k8s_node::mountinfo`]).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, UnmountFlags};

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

/// Whether the filesystem at `path` is mounted read-only.
pub fn is_read_only(path: &Path) -> io::Result<bool> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_flag.contains(StatVfsMountFlags::RDONLY))
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
        for layout in [gkm_core::image_layout::TRITON, gkm_core::image_layout::VLLM] {
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
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

/// Bind-mount `source` onto `target` (an existing directory), read-only,
/// `nosuid`, `nodev`. A bind mount takes the read-only flag only on a
/// remount, so this is two calls; if the second fails the first is undone.
pub fn bind_read_only(source: &Path, target: &Path) -> io::Result<()> {
    rustix::mount::mount_bind(source, target)?;
    let flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    if let Err(e) = rustix::mount::mount_remount(target, flags, c"") {
        let _ = rustix::mount::unmount(target, UnmountFlags::empty());
        return Err(e.into());
    }
    Ok(())
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
