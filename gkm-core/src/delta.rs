//! Harvesting the upper directory of a writable overlay view into a delta:
//! which of its entries are new cache files, which are the workload's
//! scratch (dropped), and which would change the base the view was made
//! of (refused).
//!
//! An overlay upper holds what a workload wrote over a read-only lower
//! tree. A delta image may only ADD files to its base, so an upper that
//! deletes or changes anything of the lower is refused, naming the entry:
//!
//! - a whiteout (a deletion: a 0/0 character device, or a file carrying an
//!   `overlay.whiteout` extended attribute);
//! - an opaque directory (`overlay.opaque` = `y`: the lower's content of
//!   that directory is hidden) or a redirected one (`overlay.redirect`: a
//!   rename);
//! - a regular file that also exists in the lower with other content (a
//!   changed copy-up), or whose type differs from the lower's entry.
//!
//! A file copied up unchanged (its content equals the lower's) and the
//! directories copied up to hold new files are not part of the delta.
//! Scratch files are dropped, by each kind's rule: lock files (any `locks/` directory, names
//! ending in `.lock`) and Triton's temporary `tmp.pid_*` files and
//! directories. Links, devices and other special entries are refused as
//! unsafe, as a capture refuses them.
//!
//! This module decides from what was observed of each entry
//! ([`Observed`]); reading the directories (and their extended attributes)
//! is the caller's.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The record the CSI driver writes, as JSON, beside an upper it keeps for
/// a capture: the base image the view's lower tree was, and where that
/// image's Triton group files say it was built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeltaBase {
    /// The base image, pinned: `<registry>/<repo>@sha256:<hex>`.
    pub image: String,
    /// The base image's build path (its `<prefix>/build-path` label), when
    /// it has one (`buildPath`; `build_path` is read too).
    #[serde(default, alias = "build_path", skip_serializing_if = "Option::is_none")]
    pub build_path: Option<PathBuf>,
}

/// What an upper entry is, as observed on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpperKind {
    /// A directory.
    Directory {
        /// `overlay.opaque` is `y`: it hides the lower's content.
        opaque: bool,
        /// `overlay.redirect` is set: it was renamed from elsewhere.
        redirect: bool,
    },
    /// A regular file.
    File {
        /// It carries an `overlay.whiteout` extended attribute.
        whiteout_xattr: bool,
        /// It has more than one hard link.
        linked: bool,
    },
    /// A character device numbered 0/0: overlayfs' whiteout.
    Whiteout,
    /// A symbolic link.
    Symlink,
    /// A device, fifo or socket (not a whiteout).
    Special,
}

/// What the lower tree holds at an upper entry's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InLower {
    /// Nothing.
    Absent,
    /// A directory.
    Directory,
    /// A regular file with the same content as the upper's.
    SameFile,
    /// A regular file with other content (or another type of entry where
    /// the upper has a file).
    OtherFile,
    /// Anything else (a link, a special file).
    Other,
}

/// One observed upper entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Its path below the upper (`/`-separated).
    pub path: String,
    /// What it is.
    pub kind: UpperKind,
    /// What the lower holds there.
    pub lower: InLower,
}

/// What to do with an upper entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Harvest {
    /// A new file (or a directory to walk into): part of the delta.
    Keep,
    /// An entry of the lower, copied up unchanged: not part of the delta
    /// (a directory is still walked into).
    Unchanged,
    /// Scratch (and, for a directory, everything below it): not part of
    /// the delta, for the reason given.
    Drop(&'static str),
    /// The upper cannot be harvested.
    Refuse(DeltaRefusal),
}

/// Why an upper is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RefusalKind {
    /// It deletes or changes something of the base.
    ChangesBase,
    /// It holds an entry no cache image may hold.
    Unsafe,
}

/// An upper refused, naming the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("entry {entry:?}: {detail}")]
pub struct DeltaRefusal {
    /// The entry's path below the upper.
    pub entry: String,
    /// What kind of refusal.
    pub kind: RefusalKind,
    /// What exactly is wrong.
    pub detail: String,
}

/// Why a name is scratch, when it is: by the first registered kind whose
/// [scratch rule](crate::cache::Kind::scratch) drops it (Triton's
/// `tmp.pid_*` temporary files and directories, Inductor's `locks/`
/// directory and `*.lock` files). Every kind's rule applies whatever the
/// view's kind: a workload on one kind's view runs the tools that write
/// the others (vLLM runs Inductor, which runs Triton).
///
/// ```
/// use gkm_core::delta::scratch;
/// assert!(scratch("KEY/tmp.pid_12_3456", false).is_some());
/// assert!(scratch("locks", true).is_some());
/// assert!(scratch("fxgraph/ab.lock", false).is_some());
/// assert!(scratch("KEY/kernel.cubin", false).is_none());
/// ```
pub fn scratch(path: &str, is_dir: bool) -> Option<&'static str> {
    crate::cache::kinds::REGISTRY
        .iter()
        .find_map(|kind| kind.rules().scratch(path, is_dir))
}

/// Decides what to do with one observed upper entry (see the
/// [module](self) for the rules).
///
/// ```
/// use gkm_core::delta::{Harvest, InLower, Observed, UpperKind, harvest};
/// let file = UpperKind::File { whiteout_xattr: false, linked: false };
/// let new = Observed { path: "KEY/k.cubin".into(), kind: file, lower: InLower::Absent };
/// assert_eq!(harvest(&new), Harvest::Keep);
/// let changed = Observed { lower: InLower::OtherFile, ..new };
/// assert!(matches!(harvest(&changed), Harvest::Refuse(_)));
/// ```
pub fn harvest(entry: &Observed) -> Harvest {
    let refuse = |kind, detail: &str| {
        Harvest::Refuse(DeltaRefusal {
            entry: entry.path.clone(),
            kind,
            detail: detail.to_string(),
        })
    };
    let changes = |detail: &str| refuse(RefusalKind::ChangesBase, detail);
    match entry.kind {
        UpperKind::Whiteout
        | UpperKind::File {
            whiteout_xattr: true,
            ..
        } => changes("a whiteout: the workload deleted this entry of the base"),
        UpperKind::Directory { opaque: true, .. } => {
            changes("an opaque directory: it hides the base's content of this directory")
        }
        UpperKind::Directory { redirect: true, .. } => {
            changes("a redirected directory: the workload renamed a directory of the base")
        }
        UpperKind::Directory { .. } => match entry.lower {
            InLower::Directory => Harvest::Unchanged,
            InLower::Absent => match scratch(&entry.path, true) {
                Some(why) => Harvest::Drop(why),
                None => Harvest::Keep,
            },
            _ => changes("a directory where the base has a file: it replaces a base entry"),
        },
        UpperKind::File { linked, .. } => match entry.lower {
            InLower::SameFile => Harvest::Unchanged,
            InLower::OtherFile | InLower::Other => {
                changes("a changed copy-up: the base has this file with other content")
            }
            InLower::Directory => {
                changes("a file where the base has a directory: it replaces a base entry")
            }
            InLower::Absent => match scratch(&entry.path, false) {
                Some(why) => Harvest::Drop(why),
                None if linked => refuse(
                    RefusalKind::Unsafe,
                    "a file with more than one hard link: cache images hold plain files",
                ),
                None => Harvest::Keep,
            },
        },
        UpperKind::Symlink => refuse(
            RefusalKind::Unsafe,
            "a symbolic link: cache images hold regular files and directories only",
        ),
        UpperKind::Special => refuse(
            RefusalKind::Unsafe,
            "a device, fifo or socket: cache images hold regular files and directories only",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> UpperKind {
        UpperKind::File {
            whiteout_xattr: false,
            linked: false,
        }
    }

    fn dir() -> UpperKind {
        UpperKind::Directory {
            opaque: false,
            redirect: false,
        }
    }

    fn seen(path: &str, kind: UpperKind, lower: InLower) -> Harvest {
        harvest(&Observed {
            path: path.into(),
            kind,
            lower,
        })
    }

    fn refused(h: Harvest) -> (RefusalKind, String) {
        match h {
            Harvest::Refuse(r) => (r.kind, r.entry),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn whiteouts_opaque_and_redirected_directories_change_the_base() {
        let (kind, entry) = refused(seen("KEY/k.cubin", UpperKind::Whiteout, InLower::Absent));
        assert_eq!(
            (kind, entry.as_str()),
            (RefusalKind::ChangesBase, "KEY/k.cubin")
        );
        let xattr = UpperKind::File {
            whiteout_xattr: true,
            linked: false,
        };
        assert_eq!(
            refused(seen("a", xattr, InLower::Absent)).0,
            RefusalKind::ChangesBase
        );
        let opaque = UpperKind::Directory {
            opaque: true,
            redirect: false,
        };
        assert_eq!(
            refused(seen("KEY", opaque, InLower::Directory)).0,
            RefusalKind::ChangesBase
        );
        let moved = UpperKind::Directory {
            opaque: false,
            redirect: true,
        };
        assert_eq!(
            refused(seen("KEY", moved, InLower::Absent)).0,
            RefusalKind::ChangesBase
        );
    }

    #[test]
    fn a_changed_copy_up_is_refused_and_an_identical_one_ignored() {
        assert_eq!(
            refused(seen("KEY/k.json", file(), InLower::OtherFile)).0,
            RefusalKind::ChangesBase
        );
        assert_eq!(
            seen("KEY/k.json", file(), InLower::SameFile),
            Harvest::Unchanged
        );
        assert_eq!(seen("KEY", dir(), InLower::Directory), Harvest::Unchanged);
        assert_eq!(
            refused(seen("KEY", dir(), InLower::OtherFile)).0,
            RefusalKind::ChangesBase
        );
        assert_eq!(
            refused(seen("KEY", file(), InLower::Directory)).0,
            RefusalKind::ChangesBase
        );
    }

    #[test]
    fn scratch_is_dropped_and_new_files_kept() {
        assert!(matches!(
            seen("locks", dir(), InLower::Absent),
            Harvest::Drop(_)
        ));
        assert!(matches!(
            seen("K/tmp.pid_1_2", dir(), InLower::Absent),
            Harvest::Drop(_)
        ));
        assert!(matches!(
            seen("K/tmp.pid_1_2", file(), InLower::Absent),
            Harvest::Drop(_)
        ));
        assert!(matches!(
            seen("x/y.lock", file(), InLower::Absent),
            Harvest::Drop(_)
        ));
        assert_eq!(seen("NEW", dir(), InLower::Absent), Harvest::Keep);
        assert_eq!(seen("NEW/k.cubin", file(), InLower::Absent), Harvest::Keep);
    }

    #[test]
    fn links_and_special_files_are_unsafe() {
        assert_eq!(
            refused(seen("l", UpperKind::Symlink, InLower::Absent)).0,
            RefusalKind::Unsafe
        );
        assert_eq!(
            refused(seen("p", UpperKind::Special, InLower::Absent)).0,
            RefusalKind::Unsafe
        );
        let linked = UpperKind::File {
            whiteout_xattr: false,
            linked: true,
        };
        assert_eq!(
            refused(seen("h", linked, InLower::Absent)).0,
            RefusalKind::Unsafe
        );
    }

    #[test]
    fn the_base_record_reads_as_the_csi_driver_writes_it() {
        let record: DeltaBase = serde_json::from_str(
            r#"{"image":"r.example/c@sha256:00","buildPath":"/root/.triton/cache"}"#,
        )
        .expect("record");
        assert_eq!(
            record.build_path.as_deref(),
            Some(std::path::Path::new("/root/.triton/cache"))
        );
        let snake: DeltaBase = serde_json::from_str(
            r#"{"image":"r.example/c@sha256:00","build_path":"/root/.triton/cache"}"#,
        )
        .expect("record");
        assert_eq!(snake, record);
        let bare: DeltaBase =
            serde_json::from_str(r#"{"image":"r.example/c@sha256:00"}"#).expect("record");
        assert_eq!(bare.build_path, None);
    }
}
