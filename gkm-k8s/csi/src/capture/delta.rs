//! Delta captures: a writable cache volume that also names a
//! `GKMCacheCapture` keeps what its pod wrote on top of the delivered
//! cache, so the capture Job can push it as the base image plus one layer.
//!
//! ```yaml
//! volumeAttributes:
//!   csi.gkm.io/GKMCache: base
//!   csi.gkm.io/GKMCacheCapture: warm     # in the pod's namespace
//! ```
//!
//! The view is the usual writable one ([`crate::views::upper`]), but its upper and
//! work directories live in the pod's capture tree
//! (`<store>/captures/<namespace>/<capture>/<pod uid>`, [`super::tree`])
//! instead of a tmpfs of the publish's own, with the record of the base
//! beside them, never inside what the pod wrote:
//!
//! ```text
//! <store>/captures/<namespace>/<capture>/<pod uid>/   the capture tree's tmpfs
//!                                           upper/    what the pod wrote
//!                                           work/     overlayfs's scratch directory
//!                                           delta-base.json
//! ```
//!
//! So such an upper is admitted, capped, kept after the pod ends only while
//! its capture is pending, released and found again after a driver restart
//! exactly as a capture tree is ([`super::admission`],
//! [`super::release`]); the view's mount source is the capture
//! tree's view name, by which the driver knows the tree is in use. The
//! record names the digest the view showed (the one the node store
//! published, in the cache's repository: `<repo>@sha256:<hex>`) and the path
//! its groups were built at, which the capture Job passes to
//! `gkm capture <tree>/upper --delta-base-record <tree>/delta-base.json`.

use std::fs;
use std::io;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use gkm_core::Digest;
pub use gkm_core::delta::DeltaBase;
use gkm_k8s_node::mount_records::MountRecord;
use tonic::Status;

use super::tree::{is_delta_tree, make_tree, mounted_trees, remove_tree};
use crate::views::UpperPlace;
use crate::views::mount::{CacheTree, mount_at};
use crate::views::upper::Upper;
use crate::volume::{CacheVolume, CaptureVolume, PodVolume, TreeOf, View};

use gkm_k8s_node::captures::DELTA_RECORD_FILE as RECORD_FILE;

/// The upper of a writable cache view that names a capture: the pod's
/// capture tree of it, holding the record of the view's base.
#[derive(Debug, Clone)]
pub struct DeltaUpper {
    capture: CaptureVolume,
    base: Option<DeltaBase>,
}

impl DeltaUpper {
    /// The delta upper of `req`, when it names a capture: the pod's own
    /// tree of that capture, bounded as the view is.
    pub fn of(req: &CacheVolume) -> Option<DeltaUpper> {
        let capture = req.capture.clone()?;
        let uid = req.pod.uid.clone()?;
        let View::Writable { max_bytes, .. } = req.view else {
            return None;
        };
        let capture = CaptureVolume {
            volume: PodVolume {
                volume_id: req.volume_id.clone(),
                target_path: req.target_path.clone(),
                pod: req.pod.clone(),
            },
            capture,
            tree_of: TreeOf::Own { uid },
            max_bytes,
        };
        Some(DeltaUpper {
            capture,
            base: None,
        })
    }

    /// The capture volume the view also is, as admission sees it.
    pub fn capture(&self) -> &CaptureVolume {
        &self.capture
    }
}

impl UpperPlace for DeltaUpper {
    fn view_name(&self, _: &str, _: &Digest) -> String {
        self.capture.view_name()
    }

    /// Names the base: the digest `record` publishes, in the repository of
    /// the cache's `image` (as the agent recorded it), built where `tree`'s
    /// groups say.
    fn prepare(
        &mut self,
        record: &MountRecord,
        tree: &CacheTree,
        image: Option<&str>,
    ) -> Result<(), Status> {
        let image = image.ok_or_else(|| {
            Status::failed_precondition(format!(
                "{} names a capture, but the gkm agent recorded no image for {} (an older agent): \
                 the delta's base cannot be named",
                record.volume_id, record.cache
            ))
        })?;
        let build_path = gkm_core::cache::tree_build_path(&tree.path).map_err(|e| {
            Status::failed_precondition(format!(
                "reading the build path of {} digest {}: {e}",
                record.cache, record.digest
            ))
        })?;
        self.base = Some(delta_base(image, &record.digest, build_path));
        Ok(())
    }

    /// Makes the capture tree (bounded to `max_bytes`), the record of its
    /// base and its upper; removes the tree if one of them is not made. A
    /// tree the pod already has for the capture is refused while in use (a
    /// second volume naming it), or holds a plain capture volume's files;
    /// one left by a publish that did not finish is made again.
    fn make(
        &self,
        root: &Path,
        _: &MountRecord,
        max_bytes: u64,
        group: Option<u32>,
    ) -> io::Result<Upper> {
        let base = self
            .base
            .as_ref()
            .ok_or_else(|| io::Error::other("the base of the delta capture is not named yet"))?;
        let dir = &self.capture.tree(root);
        if mount_at(dir)?.is_some() {
            let in_use = mounted_trees(root)?
                .iter()
                .any(|t| t.in_use && t.path == *dir);
            if in_use || !is_delta_tree(dir) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "the pod already has a capture tree at {} (another volume names the same capture)",
                        dir.display()
                    ),
                ));
            }
            remove_tree(dir)?;
        }
        make_tree(dir, max_bytes)?;
        super::publish::mark_published(root, &self.capture);
        let made = write_record(dir, base).and_then(|()| Upper::make_in(dir, group));
        if made.is_err() {
            let _ = remove_tree(dir);
        }
        made
    }

    /// Removes the capture tree the upper is in.
    fn discard(&self, upper: &Upper) {
        let _ = remove_tree(&upper.dir);
    }
}

/// The repository of the image reference `image` (a tag or digest dropped):
/// `registry:5000/team/base:v1` is `registry:5000/team/base`.
pub fn repository(image: &str) -> &str {
    let image = image.split_once('@').map_or(image, |(repo, _)| repo);
    let name_start = image.rfind('/').map_or(0, |i| i + 1);
    match image[name_start..].rfind(':') {
        Some(colon) => &image[..name_start + colon],
        None => image,
    }
}

/// The base record of `digest` of the cache image `image` (its spec, tag or
/// digest), built at `build_path`.
pub fn delta_base(image: &str, digest: &Digest, build_path: Option<PathBuf>) -> DeltaBase {
    DeltaBase {
        image: format!("{}@{digest}", repository(image)),
        build_path,
    }
}

/// Writes `base` as the record of the delta tree `tree`, read-only, whole
/// or not at all (written beside, then renamed).
pub fn write_record(tree: &Path, base: &DeltaBase) -> io::Result<()> {
    let json = serde_json::to_vec_pretty(base).map_err(io::Error::other)?;
    let path = tree.join(RECORD_FILE);
    let partial = tree.join(format!(".{RECORD_FILE}.partial"));
    let written = (|| {
        let mut file = fs::File::create(&partial)?;
        file.write_all(&json)?;
        file.sync_all()?;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o444))?;
        fs::rename(&partial, &path)
    })();
    written.map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", path.display())))
}

/// The record of the delta tree `tree`.
pub fn read_record(tree: &Path) -> io::Result<DeltaBase> {
    let path = tree.join(RECORD_FILE);
    let bytes = fs::read(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_is_the_published_digest_in_the_caches_repository() {
        let digest = Digest::of(b"base");
        for (image, repo) in [
            ("registry:5000/team/base:v1", "registry:5000/team/base"),
            ("registry:5000/team/base", "registry:5000/team/base"),
            ("team/base@sha256:00", "team/base"),
            ("registry:5000/base:v1@sha256:00", "registry:5000/base"),
            ("base", "base"),
        ] {
            assert_eq!(repository(image), repo, "{image}");
            assert_eq!(
                delta_base(image, &digest, None).image,
                format!("{repo}@{digest}")
            );
        }
    }

    #[test]
    fn the_record_is_written_whole_read_only_and_read_back() {
        let tree = tempfile::tempdir().expect("tempdir");
        assert!(!is_delta_tree(tree.path()));
        let base = delta_base(
            "r/base:v1",
            &Digest::of(b"base"),
            Some("/root/.triton/cache".into()),
        );
        write_record(tree.path(), &base).expect("written");
        assert!(is_delta_tree(tree.path()));
        assert_eq!(read_record(tree.path()).expect("read"), base);
        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(tree.path().join(RECORD_FILE)).expect("file"))
                .expect("json");
        assert_eq!(json["buildPath"], "/root/.triton/cache");
        let mode = fs::metadata(tree.path().join(RECORD_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o444);
        assert_eq!(fs::read_dir(tree.path()).expect("dir").count(), 1);
    }
}
