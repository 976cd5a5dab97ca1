//! Capture trees and the capture index.
//!
//! A workload that mounts a capture volume compiles into a tree of its own,
//! `<store>/captures/<namespace>/<capture>/<pod uid>`, which the CSI driver
//! makes and mounts and which outlives the pod so that the capture's Job
//! can read it. [`captured_trees`] lists the trees on disk, by name only.
//!
//! Whether a tree may go depends on its `GKMCacheCapture`, a cluster fact
//! the CSI driver does not read: the agent, which watches the cluster,
//! writes it in the **capture index**, `<store>/delivery/captures.json`,
//! beside the [delivery index](crate::delivery):
//!
//! ```json
//! {"observed": "<RFC 3339>",
//!  "captures": [{"namespace": "team", "name": "warm", "state": "over"}]}
//! ```
//!
//! one entry per pending capture of the cluster (`open`: it exists and is
//! not over) and per capture a tree on the node names, its state one of
//! `open`, `over` (`Complete` or `Failed`) or `gone` (it does not exist);
//! `observed` is when the agent began the look the file records (listing
//! the trees, then reading the captures it watches). The driver publishes
//! a workload's capture volume only for a capture the index says is
//! `open`, so a capture the index does not name is not pending. The file
//! is written atomically; readers ignore fields they do not know.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// In a delta tree (a writable cache view's upper kept for a capture), the
/// directory holding what the pod wrote: the CSI driver makes it, the
/// capture Job harvests it.
pub const DELTA_UPPER_DIR: &str = "upper";
/// In a delta tree, the file naming its base (`gkm_core::delta::DeltaBase`):
/// the CSI driver writes it, the capture Job reads it.
pub const DELTA_RECORD_FILE: &str = "delta-base.json";

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::DELIVERY_DIR;
use crate::error::Result;
use crate::json_file::{invalid_data, read_json, write_json_atomically};
use crate::names::{is_dns1123_label, is_dns1123_subdomain};

/// The directory of the store's root holding capture trees.
pub const CAPTURES_DIR: &str = "captures";
/// The capture index's file name, in the delivery index's directory.
pub const CAPTURE_INDEX_FILE: &str = "captures.json";

/// A `GKMCacheCapture`, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CaptureName {
    /// The capture's namespace (its workload pods').
    pub namespace: String,
    /// The capture's name.
    pub name: String,
}

impl CaptureName {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> CaptureName {
        CaptureName {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for CaptureName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the cluster says of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CaptureState {
    /// It exists and is not over: its trees may still be captured.
    Open,
    /// It is `Complete` or `Failed`.
    Over,
    /// It does not exist.
    Gone,
}

/// A workload pod's captured tree on the node, by name: none of its times
/// (its pod may set them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedTree {
    /// The tree's capture.
    pub capture: CaptureName,
    /// The workload pod's uid.
    pub uid: String,
}

/// The captured trees below the store root `root`
/// (`captures/<namespace>/<capture>/<uid>`), sorted. Entries that are not
/// names are skipped (nothing gkm made).
pub fn captured_trees(root: &Path) -> io::Result<Vec<CapturedTree>> {
    let mut trees = Vec::new();
    for (namespace, ns_dir) in named_dirs(&root.join(CAPTURES_DIR), is_dns1123_label)? {
        for (capture, capture_dir) in named_dirs(&ns_dir, is_dns1123_subdomain)? {
            for (uid, _) in named_dirs(&capture_dir, is_pod_uid)? {
                trees.push(CapturedTree {
                    capture: CaptureName::new(namespace.clone(), capture.clone()),
                    uid,
                });
            }
        }
    }
    Ok(trees)
}

/// A pod uid as a tree's name: letters, digits and `-`, at most 64.
pub fn is_pod_uid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The directories in `dir` whose names pass `valid`, sorted; none when
/// `dir` does not exist.
fn named_dirs(dir: &Path, valid: fn(&str) -> bool) -> io::Result<Vec<(String, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if valid(&name) && entry.file_type()?.is_dir() {
            dirs.push((name, entry.path()));
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// What the capture index holds: the state of each capture the node's
/// trees name, as the agent saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captures {
    /// When the agent began the look these states come from: a tree that
    /// changed later may be newer than what they say of its capture.
    pub observed: Timestamp,
    /// Each capture's state.
    pub states: BTreeMap<CaptureName, CaptureState>,
}

impl Captures {
    /// No capture yet, as observed at `observed`.
    pub fn new(observed: Timestamp) -> Captures {
        Captures {
            observed,
            states: BTreeMap::new(),
        }
    }

    /// What the index says of `capture`; `None` when it does not name it.
    pub fn state(&self, capture: &CaptureName) -> Option<CaptureState> {
        self.states.get(capture).copied()
    }
}

/// The JSON form of [`Captures`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CapturesFile {
    observed: Timestamp,
    captures: Vec<CaptureEntry>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaptureEntry {
    namespace: String,
    name: String,
    state: CaptureState,
}

impl CapturesFile {
    fn from_captures(captures: &Captures) -> CapturesFile {
        CapturesFile {
            observed: captures.observed,
            captures: captures
                .states
                .iter()
                .map(|(capture, state)| CaptureEntry {
                    namespace: capture.namespace.clone(),
                    name: capture.name.clone(),
                    state: *state,
                })
                .collect(),
        }
    }

    fn into_captures(self) -> std::result::Result<Captures, String> {
        let mut states = BTreeMap::new();
        for entry in self.captures {
            if !is_dns1123_label(&entry.namespace) || !is_dns1123_subdomain(&entry.name) {
                return Err(format!(
                    "{:?}/{:?} does not name a GKMCacheCapture",
                    entry.namespace, entry.name
                ));
            }
            let capture = CaptureName::new(entry.namespace, entry.name);
            if let Some(before) = states.insert(capture.clone(), entry.state)
                && before != entry.state
            {
                return Err(format!(
                    "capture {capture} is both {before:?} and {:?}",
                    entry.state
                ));
            }
        }
        Ok(Captures {
            observed: self.observed,
            states,
        })
    }
}

/// The capture index of one node store (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct CaptureIndex {
    path: PathBuf,
}

impl CaptureIndex {
    /// The index of the store at `store_root`; touches nothing.
    pub fn new(store_root: &Path) -> CaptureIndex {
        CaptureIndex {
            path: store_root.join(DELIVERY_DIR).join(CAPTURE_INDEX_FILE),
        }
    }

    /// The index's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Record `captures` (the agent), replacing what was there.
    pub fn publish(&self, captures: &Captures) -> Result<()> {
        write_json_atomically(&self.path, &CapturesFile::from_captures(captures))
    }

    /// What the agent recorded; `None` when it recorded nothing yet. A file
    /// that is not a capture index (corrupt, truncated, a name that is not
    /// a capture's, a capture in two states) is an error naming the file.
    pub fn read(&self) -> Result<Option<Captures>> {
        let Some(file) = read_json::<CapturesFile>(&self.path)? else {
            return Ok(None);
        };
        file.into_captures()
            .map(Some)
            .map_err(|reason| invalid_data(&self.path, reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().expect("timestamp")
    }

    #[test]
    fn the_index_round_trips_beside_the_delivery_index() {
        let store = tempfile::tempdir().expect("tempdir");
        let index = CaptureIndex::new(store.path());
        assert_eq!(index.read().expect("nothing yet"), None);
        assert_eq!(index.path(), store.path().join("delivery/captures.json"));

        let mut captures = Captures::new(observed());
        captures
            .states
            .insert(CaptureName::new("team", "warm"), CaptureState::Over);
        captures
            .states
            .insert(CaptureName::new("team", "cold.v2"), CaptureState::Open);
        captures
            .states
            .insert(CaptureName::new("other", "warm"), CaptureState::Gone);
        index.publish(&captures).expect("publish");
        assert_eq!(index.read().expect("read"), Some(captures.clone()));
        assert_eq!(
            captures.state(&CaptureName::new("team", "warm")),
            Some(CaptureState::Over)
        );
        assert_eq!(captures.state(&CaptureName::new("team", "unknown")), None);

        let json: serde_json::Value =
            serde_json::from_slice(&fs::read(index.path()).expect("read")).expect("json");
        assert_eq!(json["observed"], "2026-01-01T00:00:00Z");
        assert_eq!(
            json["captures"][0],
            serde_json::json!({"namespace": "other", "name": "warm", "state": "gone"})
        );

        // Replaced, not appended; no temporary file left behind.
        index.publish(&Captures::new(observed())).expect("publish");
        assert_eq!(index.read().expect("read"), Some(Captures::new(observed())));
        let names: Vec<_> = fs::read_dir(store.path().join("delivery"))
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("captures.json")]);
    }

    #[test]
    fn a_corrupt_or_inconsistent_index_is_refused_naming_the_file() {
        let store = tempfile::tempdir().expect("tempdir");
        let index = CaptureIndex::new(store.path());
        fs::create_dir_all(index.path().parent().expect("dir")).expect("mkdir");
        let entry = |ns: &str, name: &str, state: &str| {
            format!(r#"{{"namespace":"{ns}","name":"{name}","state":"{state}"}}"#)
        };
        let file = |entries: &[String]| {
            format!(
                r#"{{"observed":"2026-01-01T00:00:00Z","captures":[{}]}}"#,
                entries.join(",")
            )
        };
        let whole = file(&[entry("team", "warm", "over")]);
        let cases = [
            ("not json".to_string(), "expected"),
            (whole[..whole.len() / 2].to_string(), "EOF"),
            (file(&[entry("team", "warm", "done")]), "unknown variant"),
            (r#"{"captures":[]}"#.to_string(), "missing field `observed`"),
            (file(&[entry("../x", "warm", "over")]), "does not name"),
            (file(&[entry("team", "a/b", "over")]), "does not name"),
            (
                file(&[entry("team", "warm", "over"), entry("team", "warm", "open")]),
                "both",
            ),
        ];
        for (content, mentions) in cases {
            fs::write(index.path(), &content).expect("write");
            let err = index.read().expect_err(&content).to_string();
            assert!(
                err.contains("captures.json") && err.contains(mentions),
                "{content}: {err}"
            );
        }

        // A field from a newer agent is ignored; the same entry twice is one.
        let newer = r#"{"observed":"2026-01-01T00:00:00Z","version":2,"captures":[
            {"namespace":"team","name":"warm","state":"over","job":"capture-warm-1"},
            {"namespace":"team","name":"warm","state":"over"}]}"#;
        fs::write(index.path(), newer).expect("write");
        let read = index.read().expect("newer index").expect("present");
        assert_eq!(
            read.state(&CaptureName::new("team", "warm")),
            Some(CaptureState::Over)
        );
        assert_eq!(read.states.len(), 1);
    }

    #[test]
    fn the_trees_on_disk_are_read_by_name_only() {
        let root = tempfile::tempdir().expect("tempdir");
        let captures = root.path().join(CAPTURES_DIR);
        for dir in [
            "team/warm/6f1c-22",
            "team/warm/7a",
            "Bad/warm/u",
            "team/x/..",
        ] {
            fs::create_dir_all(captures.join(dir)).expect("dir");
        }
        fs::write(captures.join("team/warm/file"), b"").expect("file");
        let trees = captured_trees(root.path()).expect("listed");
        let found: Vec<String> = trees
            .iter()
            .map(|t| format!("{}/{}", t.capture, t.uid))
            .collect();
        assert_eq!(found, ["team/warm/6f1c-22", "team/warm/7a"]);
        let none = tempfile::tempdir().expect("tempdir");
        assert!(
            captured_trees(none.path())
                .expect("no captures dir")
                .is_empty()
        );
    }
}
