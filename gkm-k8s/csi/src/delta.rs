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
//! The view is the usual writable one ([`crate::upper`]), but its upper and
//! work directories live in the pod's capture tree
//! (`<store>/captures/<namespace>/<capture>/<pod uid>`, [`crate::capture`])
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
//! exactly as a capture tree is ([`crate::capture_admission`],
//! [`crate::capture_release`]); the view's mount source is the capture
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

pub use gkm_k8s_node::captures::{DELTA_RECORD_FILE as RECORD_FILE, DELTA_UPPER_DIR as UPPER_DIR};

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

/// Whether the capture tree `tree` is a delta tree: it holds a record.
pub fn is_delta_tree(tree: &Path) -> bool {
    tree.join(RECORD_FILE).is_file()
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
