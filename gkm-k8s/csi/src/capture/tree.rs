//! Capture trees: the writable, pod-private directory a workload compiles
//! its kernel cache into (`csi.gkm.io/GKMCacheCapture: <capture>`), and
//! that tree read-only for the capture Job
//! (`csi.gkm.io/capturedPodUID: <workload pod uid>` as well).
//!
//! Each workload pod gets its own tree,
//! `<store>/captures/<namespace>/<capture>/<pod uid>`, a `tmpfs` the kernel
//! bounds to [`CAPTURE_MAX_BYTES`] (or the less the volume's
//! `csi.gkm.io/captureMaxBytes` asks for) and [`CAPTURE_MAX_INODES`]
//! (`nosuid`, `nodev`; its pages count against the workload's memory), so a workload cannot fill the node's disk whatever it writes,
//! and what it wrote is kept when it ends (only the bind mount into the pod
//! goes with it). The namespace in that path is always the pod's own, as
//! the kubelet vouches for it: a pod can read back only a tree of its own
//! namespace, so a Job of another namespace finds nothing. A read-only
//! request is only ever given the tree read-only, and only one that
//! exists: a capture Job never makes an empty tree.
//!
//! [`CaptureTrees::release`](super::CaptureTrees::release) unmounts and removes a
//! tree; [`super::release`] calls it once nothing will capture the tree,
//! and [`super::admission`] says which trees are made at all.
//!
//! # Trees outlive the driver
//!
//! A tree is a mount, and a mount lives in a mount namespace: one made in
//! the driver container's own namespace would go with the container, and a
//! driver restarted between a workload's end and its capture Job's read
//! would lose every tree no pod still had mounted. So the chart mounts
//! `<store>/captures` into the driver with `mountPropagation:
//! Bidirectional`: each tree the driver mounts below it propagates to the
//! host's mount namespace and stays there when the driver goes. A driver
//! started again finds the trees in its mount table ([`mounted_trees`],
//! read from `/proc/self/mountinfo`, sizes from `statfs`), so the caps and
//! the release of trees carry on where they were; nothing else about a tree
//! is kept in the driver's memory. At start the driver warns when
//! `<store>/captures` is not a shared mount ([`trees_propagate`]).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;
use tonic::Status;

use super::admission::GrantedTree;
use crate::views::mount::{mount_at, same_directory, unmount_all};
use gkm_k8s_node::captures::{CaptureName, is_pod_uid};
use gkm_k8s_node::mountinfo::{MOUNTINFO, parse_mountinfo};
use gkm_k8s_node::names::is_dns1123_subdomain;

/// The most a workload's capture tree may hold, in bytes.
pub const CAPTURE_MAX_BYTES: u64 = 10 << 30;
/// The least a workload's capture tree may be bounded to, in bytes: a
/// smaller `csi.gkm.io/captureMaxBytes` is refused, so the byte caps also
/// bound the count of trees (mounts) on the node.
pub const CAPTURE_MIN_BYTES: u64 = 1 << 20;
/// The most files and directories a workload's capture tree may hold.
pub const CAPTURE_MAX_INODES: u64 = 1_000_000;
pub use gkm_k8s_node::captures::CAPTURES_DIR;
/// The mount source of every capture tree's `tmpfs`, and so of a
/// workload's bind mount of its tree.
pub const TREE_SOURCE: &str = "gkm-capture";

/// The mount source of a capture Job's read-only view of pod `uid`'s tree
/// of `namespace`'s `capture`.
pub fn view_name(namespace: &str, capture: &str, uid: &str) -> String {
    format!("{TREE_SOURCE}:{namespace}/{capture}/{uid}")
}

/// A pod uid: what the kubelet passes, or what a Job names (letters,
/// digits, `-`; at most 64).
pub(crate) fn check_uid(uid: &str, what: &str) -> Result<(), Status> {
    if !is_pod_uid(uid) {
        return Err(Status::invalid_argument(format!(
            "{what} {uid:?} is not a pod uid"
        )));
    }
    Ok(())
}

/// Where the capture trees of `namespace`'s `capture` are, below the store
/// root `root`; each pod's is named by its uid.
pub fn capture_dir(root: &Path, namespace: &str, capture: &str) -> PathBuf {
    root.join(CAPTURES_DIR).join(namespace).join(capture)
}

/// The tree of pod `uid` for `namespace`'s `capture` below the store root
/// `root`, the three checked to be names (so the path stays below it).
pub fn released_tree(
    root: &Path,
    namespace: &str,
    capture: &str,
    uid: &str,
) -> Result<PathBuf, Status> {
    if !gkm_k8s_node::names::is_dns1123_label(namespace) || !is_dns1123_subdomain(capture) {
        return Err(Status::invalid_argument(format!(
            "{namespace}/{capture} does not name a GKMCacheCapture"
        )));
    }
    check_uid(uid, "the pod uid")?;
    Ok(capture_dir(root, namespace, capture).join(uid))
}

/// Whether the capture tree `tree` is a delta tree: it holds the record of
/// the base a writable cache view keeping its upper there showed
/// ([`super::delta`]).
pub fn is_delta_tree(tree: &Path) -> bool {
    tree.join(gkm_k8s_node::captures::DELTA_RECORD_FILE)
        .is_file()
}

/// Makes the tree at `tree`, bounded to `max_bytes`, unless it is mounted
/// already.
pub fn make_tree(tree: &Path, max_bytes: u64) -> io::Result<()> {
    if mount_at(tree)?.is_some() {
        return Ok(());
    }
    fs::create_dir_all(tree)?;
    let options = format!("size={max_bytes},nr_inodes={CAPTURE_MAX_INODES},mode=0777");
    let options = std::ffi::CString::new(options).map_err(io::Error::other)?;
    rustix::mount::mount(
        TREE_SOURCE,
        tree,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        options.as_c_str(),
    )?;
    // Whatever user the workload runs as compiles into it.
    fs::set_permissions(tree, fs::Permissions::from_mode(0o777))?;
    Ok(())
}

/// A capture tree mounted on the node, as the mount table shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedTree {
    /// Its capture, pod and size.
    pub granted: GrantedTree,
    /// Where it is mounted.
    pub path: PathBuf,
    /// Whether a pod has it mounted: its workload (a bind of the tree) or a
    /// capture Job (a read-only view of it).
    pub in_use: bool,
    /// Whether a pod has a view of it: a read-only one (a capture Job's, or
    /// any pod's of the namespace naming it), or a writable cache view
    /// keeping its upper there. The view holds the tree's `tmpfs`, and its
    /// pages, until that pod goes, whatever happens to the tree.
    pub viewed: bool,
}

/// The capture trees mounted below the store root `root`, with their sizes
/// and whether a pod has them mounted, from this mount namespace's mount
/// table. Nothing mounted (or no captures directory) is an empty list.
pub fn mounted_trees(root: &Path) -> io::Result<Vec<MountedTree>> {
    let captures = match fs::canonicalize(root.join(CAPTURES_DIR)) {
        Ok(dir) => dir,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mounts = parse_mountinfo(&fs::read_to_string(MOUNTINFO)?);
    let mut trees = std::collections::BTreeMap::new();
    let mut bound = std::collections::HashSet::new();
    let mut viewed = std::collections::HashSet::new();
    for mount in &mounts {
        if mount.fs_type == "tmpfs" && mount.source == TREE_SOURCE {
            match tree_name(&captures, &mount.mount_point) {
                Some(name) => {
                    trees.insert(mount.mount_point.clone(), name);
                }
                // A workload's bind of a tree: the same filesystem.
                None => {
                    if let Ok(meta) = fs::metadata(&mount.mount_point) {
                        bound.insert(std::os::unix::fs::MetadataExt::dev(&meta));
                    }
                }
            }
        } else if mount.fs_type == "overlay" && mount.source.starts_with(TREE_SOURCE) {
            viewed.insert(mount.source.clone());
        }
    }
    let mut found = Vec::with_capacity(trees.len());
    for (path, (capture, uid)) in trees {
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            // Unmounted since the mount table was read.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let stat = rustix::fs::statfs(&path)?;
        #[allow(clippy::useless_conversion)] // u64 or not, by target
        let bytes = u64::try_from(stat.f_blocks)
            .unwrap_or(0)
            .saturating_mul(u64::try_from(stat.f_bsize).unwrap_or(0));
        let is_viewed = viewed.contains(&view_name(&capture.namespace, &capture.name, &uid));
        let in_use = is_viewed || bound.contains(&std::os::unix::fs::MetadataExt::dev(&meta));
        found.push(MountedTree {
            granted: GrantedTree {
                capture,
                uid,
                bytes,
            },
            path,
            in_use,
            viewed: is_viewed,
        });
    }
    Ok(found)
}

/// The capture and pod uid of the tree at `path`, when `path` is
/// `<captures>/<namespace>/<capture>/<uid>` with three names.
fn tree_name(captures: &Path, path: &Path) -> Option<(CaptureName, String)> {
    let rel = path.strip_prefix(captures).ok()?;
    let parts: Vec<&str> = rel.iter().map(|p| p.to_str()).collect::<Option<_>>()?;
    let [namespace, capture, uid] = parts.as_slice() else {
        return None;
    };
    released_tree(captures, namespace, capture, uid).ok()?;
    Some((CaptureName::new(*namespace, *capture), (*uid).to_string()))
}

/// The capture tree `target` shows, when it is a capture volume: a
/// workload's bind of its tree, or a capture Job's view of one.
pub fn tree_behind(root: &Path, target: &Path) -> io::Result<Option<(CaptureName, String)>> {
    let Some(mount) = mount_at(target)? else {
        return Ok(None);
    };
    if mount.fs_type == "overlay" {
        let Some(name) = mount
            .source
            .strip_prefix(TREE_SOURCE)
            .and_then(|s| s.strip_prefix(':'))
        else {
            return Ok(None);
        };
        let mut parts = name.splitn(3, '/');
        let (Some(namespace), Some(capture), Some(uid)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Ok(None);
        };
        return Ok(released_tree(root, namespace, capture, uid)
            .ok()
            .map(|_| (CaptureName::new(namespace, capture), uid.to_string())));
    }
    if mount.fs_type != "tmpfs" || mount.source != TREE_SOURCE {
        return Ok(None);
    }
    for tree in mounted_trees(root)? {
        if same_directory(&tree.path, target)? {
            return Ok(Some((tree.granted.capture, tree.granted.uid)));
        }
    }
    Ok(None)
}

/// Whether trees mounted below the store root `root` reach the host's
/// mount namespace: whether `<root>/captures` is a mount point whose mount
/// is shared (`mountPropagation: Bidirectional`). `false` when it is not a
/// mount point, or is private or only a slave.
pub fn trees_propagate(root: &Path) -> io::Result<bool> {
    let dir = root.join(CAPTURES_DIR);
    fs::create_dir_all(&dir)?;
    let dir = fs::canonicalize(dir)?;
    let content = fs::read_to_string(MOUNTINFO)?;
    // The optional fields (`shared:N`, `master:N`) come after the sixth
    // field and before the ` - ` separator; the mount point is the fifth.
    let shared = content
        .lines()
        .filter_map(|line| {
            let (fields, _) = line.split_once(" - ")?;
            let fields: Vec<&str> = fields.split(' ').collect();
            let mount_point = fields.get(4)?;
            let unescaped = mount_point.replace("\\040", " ");
            (Path::new(&unescaped) == dir)
                .then(|| fields.iter().skip(6).any(|f| f.starts_with("shared:")))
        })
        .next_back();
    Ok(shared.unwrap_or(false))
}

/// Unmounts and removes `tree` (nothing to do when it is gone).
pub fn remove_tree(tree: &Path) -> io::Result<()> {
    unmount_all(tree)?;
    match fs::remove_dir_all(tree) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_are_released() {
        let root = Path::new("/store");
        assert_eq!(
            released_tree(root, "team", "warm", "6f1c-22").expect("names"),
            Path::new("/store/captures/team/warm/6f1c-22")
        );
        for (ns, capture, uid) in [
            ("..", "warm", "u"),
            ("team", "../x", "u"),
            ("team", "warm", ".."),
        ] {
            assert!(
                released_tree(root, ns, capture, uid).is_err(),
                "{ns}/{capture}/{uid}"
            );
        }
    }
}
