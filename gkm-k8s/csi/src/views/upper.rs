//! The private upper layer of a writable cache volume: where a pod's writes
//! go, how they are bounded, and how they are removed.
//!
//! A cache volume the pod does not mount read-only is an overlay whose
//! lower layer is the store's verified tree (never written) and whose upper
//! and work directories belong to that one publish:
//!
//! ```text
//! <store>/csi/uppers/<volume id>/        a tmpfs of its own (source gkm-upper:<volume id>)
//!                               upper/   what the pod wrote, created or changed
//!                               work/    overlayfs's scratch directory
//! ```
//!
//! The directory is named by the kubelet's volume id, which the [mount
//! record](gkm_k8s_node::mount_records::MountRecord) of the publish also
//! names (with the pod, the cache and the digest), so an upper can be found
//! and read while its pod runs, and a later step may keep one instead of
//! removing it.
//!
//! # The bound
//!
//! Each upper is a `tmpfs` mounted for that publish (`nosuid`, `nodev`),
//! bounded to [`WRITABLE_MAX_BYTES`] (or the less the volume's
//! `csi.gkm.io/writableMaxBytes` asks for, at most
//! [`WRITABLE_MAX_BYTES_LIMIT`]) and [`WRITABLE_MAX_INODES`] files and
//! directories: a pod that fills it gets `ENOSPC` from its writes, and the
//! node's disk is never filled. The trade-off against a loop-file ext4 (or a
//! project quota, which the store's filesystem may not offer) is memory: a
//! tmpfs holds its pages in memory (or swap). The kernel charges them to
//! the memory cgroup of the process that writes them, the pod's container,
//! so they count against its memory limit; the kubelet's ephemeral-storage
//! accounting does not see them. A loop file would cost a file on disk and a
//! filesystem to format per publish, which a publish should not wait for.
//!
//! Upper and lower are on different filesystems (tmpfs and the store's), so
//! the overlay is mounted with `xino=off` pinned: inode numbers are not
//! made unique across layers, which nothing in a kernel cache relies on.
//!
//! # Lifecycle
//!
//! `NodeUnpublishVolume` unmounts the view, then the upper's tmpfs, and
//! removes its directory. [`sweep`] (at driver start) removes every upper
//! no mounted view names: what a driver killed between mounting the upper
//! and attaching the view, or a node that restarted, left behind. A volume
//! that also names a capture has its upper in that capture's tree instead
//! (`crate::capture`'s delta uppers), which is kept and released as capture
//! trees are.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;

use super::mount::{
    GROUP_WRITABLE_DIR, GroupWritable, UpperLayers, mount_at, mount_writable_view, unmount_all,
};
use gkm_k8s_node::mountinfo::{MOUNTINFO, parse_mountinfo};

/// Where the uppers are, below the store root.
pub const UPPERS_DIR: &str = "csi/uppers";
/// The bound of an upper when the volume asks for none, in bytes.
pub const WRITABLE_MAX_BYTES: u64 = 1 << 30;
/// The most an upper may hold whatever the volume asks, in bytes.
pub const WRITABLE_MAX_BYTES_LIMIT: u64 = 10 << 30;
/// The most files and directories an upper may hold.
pub const WRITABLE_MAX_INODES: u64 = 1_000_000;
/// The mount source of a writable view is this prefix, the volume id, `:`,
/// and the digest: `gkm-cache-rw:<volume id>:sha256:<hex>`.
pub const WRITABLE_VIEW_PREFIX: &str = "gkm-cache-rw:";
/// The mount source of an upper's tmpfs is this prefix and the volume id.
pub const UPPER_SOURCE_PREFIX: &str = "gkm-upper:";
/// The directory of an upper's directory holding what the pod wrote.
pub const UPPER_DIR: &str = "upper";

/// The longest volume id an upper may be named by.
const MAX_VOLUME_ID: usize = 128;

/// The name (mount source) of the writable view of `digest` for
/// `volume_id`.
pub fn writable_view_name(volume_id: &str, digest: &gkm_core::Digest) -> String {
    format!("{WRITABLE_VIEW_PREFIX}{volume_id}:{digest}")
}

/// The volume id a writable view's mount source names, if it is one.
pub fn volume_of_view(source: &str) -> Option<&str> {
    let rest = source.strip_prefix(WRITABLE_VIEW_PREFIX)?;
    rest.split_once(':').map(|(volume, _)| volume)
}

/// Whether `volume_id` can name a directory: letters, digits, `-`, `_` and
/// `.`, not starting with `.`, at most 128 characters. The kubelet's ids of
/// inline volumes (`csi-<hex>`) are.
pub fn is_upper_name(volume_id: &str) -> bool {
    !volume_id.is_empty()
        && volume_id.len() <= MAX_VOLUME_ID
        && !volume_id.starts_with('.')
        && volume_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The upper of one publish: a bounded tmpfs holding `upper/` and `work/`.
#[derive(Debug)]
pub struct Upper {
    /// The tmpfs's mount point, `<store>/csi/uppers/<volume id>`.
    pub dir: PathBuf,
}

impl Upper {
    /// The upper directory of `volume_id` below the store root `root`
    /// (`None` when the volume id cannot name one).
    pub fn path(root: &Path, volume_id: &str) -> Option<PathBuf> {
        is_upper_name(volume_id).then(|| root.join(UPPERS_DIR).join(volume_id))
    }

    /// Makes a fresh upper for `volume_id` below `root`, bounded to
    /// `max_bytes`, its `upper/` owned by `root:group` and mode `2775` (so
    /// the group writes, and what it makes inherits the group) when the pod
    /// has an fsGroup, `root:root 0755` otherwise. Whatever an earlier
    /// publish of the same volume left there is removed first.
    pub fn make(
        root: &Path,
        volume_id: &str,
        max_bytes: u64,
        group: Option<u32>,
    ) -> io::Result<Upper> {
        let dir = Upper::path(root, volume_id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("volume id {volume_id:?} cannot name an upper directory"),
            )
        })?;
        remove(&dir)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let options = format!("size={max_bytes},nr_inodes={WRITABLE_MAX_INODES},mode=0700");
        let options = std::ffi::CString::new(options).map_err(io::Error::other)?;
        let source = format!("{UPPER_SOURCE_PREFIX}{volume_id}");
        let mounted = rustix::mount::mount(
            source.as_str(),
            &dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            options.as_c_str(),
        );
        if let Err(e) = mounted {
            let _ = fs::remove_dir(&dir);
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("mounting the tmpfs of upper {}: {e}", dir.display()),
            ));
        }
        let upper = Upper { dir };
        let made = upper.make_layers(group);
        if let Err(e) = made {
            let _ = remove(&upper.dir);
            return Err(e);
        }
        Ok(upper)
    }

    /// Makes the layers of an upper in `dir`, a capture tree already
    /// mounted and bounded (a delta capture's), with
    /// the ownership [`Upper::make`] gives them.
    pub fn make_in(dir: &Path, group: Option<u32>) -> io::Result<Upper> {
        let upper = Upper {
            dir: dir.to_path_buf(),
        };
        upper.make_layers(group)?;
        Ok(upper)
    }

    fn make_layers(&self, group: Option<u32>) -> io::Result<()> {
        let upper = self.upper();
        fs::create_dir(&upper)?;
        fs::create_dir(self.work())?;
        match group {
            Some(gid) => {
                std::os::unix::fs::chown(&upper, Some(0), Some(gid))?;
                fs::set_permissions(&upper, fs::Permissions::from_mode(GROUP_WRITABLE_DIR))?;
            }
            None => fs::set_permissions(&upper, fs::Permissions::from_mode(0o755))?,
        }
        Ok(())
    }

    /// The upper layer: what the pod wrote.
    pub fn upper(&self) -> PathBuf {
        self.dir.join(UPPER_DIR)
    }

    /// Overlayfs's work directory.
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    /// Mounts the writable view of the directory `tree` (relocated by
    /// `relocation`) at `target` on this upper, named `name`, writable by `group`
    /// ([`mount_writable_view`]); how many directories were made writable.
    pub fn mount_view(
        &self,
        tree: &Path,
        relocation: Option<&Path>,
        group: Option<GroupWritable<'_>>,
        name: &str,
        target: &Path,
    ) -> io::Result<usize> {
        let (upper, work) = (self.upper(), self.work());
        let layers = UpperLayers {
            upper: &upper,
            work: &work,
        };
        mount_writable_view(tree, relocation, layers, group, name, target)
    }
}

/// Bytes the upper at `dir` holds (its tmpfs's used blocks); 0 when it is
/// not mounted.
pub fn used_bytes(dir: &Path) -> u64 {
    if is_upper_mount(dir) {
        tmpfs_used_bytes(dir)
    } else {
        0
    }
}

/// Bytes the filesystem at `dir` holds (its used blocks); 0 when it cannot
/// be read. Only asked of a `tmpfs` of the driver's (an upper, a capture
/// tree).
pub fn tmpfs_used_bytes(dir: &Path) -> u64 {
    match rustix::fs::statvfs(dir) {
        Ok(st) => st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize,
        Err(_) => 0,
    }
}

/// Whether `dir` is an upper's `tmpfs`.
pub fn is_upper_mount(dir: &Path) -> bool {
    matches!(mount_at(dir), Ok(Some(m)) if m.source.starts_with(UPPER_SOURCE_PREFIX))
}

/// Unmounts the upper at `dir` and removes it (nothing to do when it is
/// gone). Only called once no view names it.
pub fn remove(dir: &Path) -> io::Result<()> {
    unmount_all(dir).map_err(|e| {
        io::Error::new(e.kind(), format!("unmounting upper {}: {e}", dir.display()))
    })?;
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("removing upper {}: {e}", dir.display()),
        )),
    }
}

/// Removes, below the store root `root`, every upper no mounted writable
/// view names (read from this process's mount table); the volume ids of
/// those removed.
pub fn sweep(root: &Path) -> io::Result<Vec<String>> {
    let mountinfo = fs::read_to_string(MOUNTINFO)?;
    sweep_against(root, &mountinfo)
}

/// [`sweep`] against the mount table `mountinfo`.
pub fn sweep_against(root: &Path, mountinfo: &str) -> io::Result<Vec<String>> {
    let live = live_volumes(mountinfo);
    let dir = root.join(UPPERS_DIR);
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if live.contains(&name) {
            continue;
        }
        remove(&entry.path())?;
        removed.push(name);
    }
    Ok(removed)
}

/// The volume ids whose writable view is mounted in `mountinfo`.
pub fn live_volumes(mountinfo: &str) -> Vec<String> {
    parse_mountinfo(mountinfo)
        .into_iter()
        .filter(|m| m.fs_type == "overlay")
        .filter_map(|m| volume_of_view(&m.source).map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_view_names_its_volume() {
        let digest = gkm_core::Digest::of(b"cache");
        let name = writable_view_name("csi-0a1b", &digest);
        assert_eq!(volume_of_view(&name), Some("csi-0a1b"));
        assert_eq!(volume_of_view(&format!("gkm-cache:{digest}")), None);
    }

    #[test]
    fn only_plain_names_name_an_upper() {
        assert!(is_upper_name("csi-9f3e2b"));
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "../x",
            ".hidden",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(!is_upper_name(bad), "{bad:?}");
            assert_eq!(Upper::path(Path::new("/store"), bad), None);
        }
    }

    #[test]
    fn the_sweep_keeps_uppers_a_mounted_view_names() {
        let store = tempfile::tempdir().expect("tempdir");
        for volume in ["csi-live", "csi-dead"] {
            fs::create_dir_all(store.path().join(UPPERS_DIR).join(volume).join("upper"))
                .expect("upper");
        }
        let digest = gkm_core::Digest::of(b"cache");
        let mountinfo = format!(
            "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n\
             301 22 0:41 / /pods/p1/mount rw,nosuid,nodev - overlay {} rw\n",
            writable_view_name("csi-live", &digest)
        );
        let removed = sweep_against(store.path(), &mountinfo).expect("sweep");
        assert_eq!(removed, ["csi-dead"]);
        assert!(
            store
                .path()
                .join(UPPERS_DIR)
                .join("csi-live/upper")
                .is_dir()
        );
        assert!(!store.path().join(UPPERS_DIR).join("csi-dead").exists());
    }
}
