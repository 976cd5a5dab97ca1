//! Read-only bind mounts, and finding what is mounted where
//! (`/proc/self/mountinfo`).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, UnmountFlags};

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// The directory of the source filesystem mounted (for a bind mount, the
    /// source directory relative to its filesystem's root).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The per-mount options (`ro,nosuid,nodev,relatime`).
    pub options: String,
    /// The filesystem type.
    pub fs_type: String,
}

impl MountInfo {
    /// Whether the mount is read-only.
    pub fn is_read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }
}

/// Parse `/proc/self/mountinfo` content; malformed lines are skipped.
///
/// ```
/// use gkm_k8s::csi::mount::parse_mountinfo;
/// let m = parse_mountinfo(
///     "42 27 254:0 /store/sha256/ab /var/lib/kubelet/pods/p/my\\040vol ro,nosuid,nodev,relatime - ext4 /dev/vda rw\n",
/// );
/// assert_eq!(m[0].mount_point.to_str(), Some("/var/lib/kubelet/pods/p/my vol"));
/// assert!(m[0].is_read_only());
/// ```
pub fn parse_mountinfo(content: &str) -> Vec<MountInfo> {
    content
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            if sep < 6 || fields.len() < sep + 2 {
                return None;
            }
            Some(MountInfo {
                root: PathBuf::from(unescape(fields[3])),
                mount_point: PathBuf::from(unescape(fields[4])),
                options: fields[5].to_string(),
                fs_type: fields[sep + 1].to_string(),
            })
        })
        .collect()
}

/// Undo the kernel's octal escapes (`\040` for a space…).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = s.get(i + 1..i + 4)
            && octal.bytes().all(|b| (b'0'..=b'7').contains(&b))
            && let Ok(v) = u8::from_str_radix(octal, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The topmost mount at exactly `path`, if `path` is a mount point.
pub fn mount_at(path: &Path) -> io::Result<Option<MountInfo>> {
    let path = match fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let content = fs::read_to_string("/proc/self/mountinfo")?;
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
        for layout in [gkm_oci::labels::TRITON, gkm_oci::labels::VLLM] {
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
                    gkm_oci::labels::TRITON.cache_dir,
                    gkm_oci::labels::VLLM.cache_dir
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
    fn mountinfo_lines() {
        let content = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
42 27 254:0 /tmp/src /tmp/dst ro,nosuid,nodev,relatime - ext4 /dev/vda rw,discard
garbage line
";
        let m = parse_mountinfo(content);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/proc"));
        assert_eq!(m[0].fs_type, "proc");
        assert!(!m[0].is_read_only());
        assert_eq!(m[1].root, PathBuf::from("/tmp/src"));
        assert!(m[1].is_read_only());
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape(r"a\040b\011c\134d"), "a b\tc\\d");
        assert_eq!(unescape(r"trailing\04"), r"trailing\04");
        assert_eq!(unescape(r"\"), r"\");
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
