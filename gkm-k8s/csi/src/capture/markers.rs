//! The times the driver keeps of each capture tree, outside the tree.
//!
//! A tree's own times are its pod's to set (a root pod dates its tree's
//! top in 2099 with `touch -t`), so whether a tree may go never reads
//! them. The driver keeps, for pod `uid`'s tree of `namespace`'s
//! `capture`, one marker file per [`Marker`] below the store root,
//! `<store>/csi/capture-<kind>/<namespace>/<capture>/<uid>`, where no pod
//! reaches: its mtime, which only the driver sets, is the time. Markers
//! survive a driver restart; a tree found without one is marked when found
//! (so a tree is only ever kept longer, never released sooner), and a
//! marker dated after now (the node's clock set back) is marked now.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use gkm_k8s_node::captures::CaptureName;
use tracing::warn;

/// A time the driver keeps of a capture tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// When the driver last published the tree to its workload (it made
    /// the tree then, or showed it again).
    Published,
    /// Since when no pod has had the tree mounted.
    Idle,
}

impl Marker {
    /// Every kind of marker.
    const ALL: [Marker; 2] = [Marker::Published, Marker::Idle];

    /// The directory below the store root holding this kind's markers.
    fn dir(self) -> &'static str {
        match self {
            Marker::Published => "csi/capture-published",
            Marker::Idle => "csi/capture-idle",
        }
    }

    /// This marker of pod `uid`'s tree of `capture`, below the store root
    /// `root`.
    fn path(self, root: &Path, capture: &CaptureName, uid: &str) -> PathBuf {
        root.join(self.dir())
            .join(&capture.namespace)
            .join(&capture.name)
            .join(uid)
    }

    /// Sets this marker of pod `uid`'s tree of `capture` to now.
    pub fn set(self, root: &Path, capture: &CaptureName, uid: &str) -> io::Result<()> {
        let marker = self.path(root, capture, uid);
        if let Some(dir) = marker.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::File::create(&marker)?.set_modified(SystemTime::now())
    }

    /// The time this marker of pod `uid`'s tree of `capture` holds, as of
    /// `now`: `now` (and so marked) when there is none, or it is dated
    /// after `now`.
    pub fn since(
        self,
        root: &Path,
        capture: &CaptureName,
        uid: &str,
        now: SystemTime,
    ) -> io::Result<SystemTime> {
        match fs::metadata(self.path(root, capture, uid)).and_then(|m| m.modified()) {
            Ok(at) if at <= now => Ok(at),
            Ok(_) => self.set(root, capture, uid).map(|()| now),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.set(root, capture, uid).map(|()| now)
            }
            Err(e) => Err(e),
        }
    }
}

/// Removes every marker of pod `uid`'s tree of `capture`, and the
/// directories of its capture and namespace once empty; failures are
/// logged (a marker left behind only keeps a later tree of the same pod
/// longer).
pub fn remove_markers(root: &Path, capture: &CaptureName, uid: &str) {
    for kind in Marker::ALL {
        let marker = kind.path(root, capture, uid);
        if let Err(e) = fs::remove_file(&marker)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(error = %e, marker = %marker.display(), "removing a capture tree's marker");
        }
        let capture_dir = marker.parent();
        for dir in [capture_dir, capture_dir.and_then(Path::parent)]
            .into_iter()
            .flatten()
        {
            if fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_missing_or_future_marker_reads_as_now_and_is_kept() {
        let root = tempfile::tempdir().expect("tempdir");
        let capture = CaptureName::new("team", "warm");
        let now = SystemTime::now();
        let first = Marker::Published
            .since(root.path(), &capture, "u", now)
            .expect("marked");
        assert_eq!(first, now);
        let later = now + Duration::from_secs(60);
        assert!(
            Marker::Published
                .since(root.path(), &capture, "u", later)
                .expect("read")
                <= now + Duration::from_secs(1),
            "a marker keeps its time"
        );
        let before = now - Duration::from_secs(3600);
        assert_eq!(
            Marker::Published
                .since(root.path(), &capture, "u", before)
                .expect("marked again"),
            before,
            "a marker dated after now reads as now"
        );
        remove_markers(root.path(), &capture, "u");
        assert!(!root.path().join("csi/capture-published/team").exists());
    }
}
