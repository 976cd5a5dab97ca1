//! Removing captured trees from the node once nothing needs them.
//!
//! A workload's capture tree (see [`crate::capture`]) outlives the pod so
//! that its capture Job can read it. It goes when its `GKMCacheCapture` is
//! over (`Complete` or `Failed`), or when that capture no longer exists and
//! the tree is older than a grace period (a workload may start before its
//! capture is created; a capture deleted mid-way leaves its tree behind).
//!
//! Which trees may go is [`releasable`] (pure). The glue,
//! [`release_captures`], watches only the captures of this node (the field
//! selector `status.node=<node>`, a `selectableField` of the CRD), and reads
//! by name only a capture that a tree on the node names and that watch does
//! not hold: one not captured yet, captured on another node, or deleted.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use gkm_k8s_api::crd::GKMCacheCapture;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::NodeService;
use crate::capture::CAPTURES_DIR;
use gkm_k8s_node::names::{is_dns1123_label, is_dns1123_subdomain};

/// A workload pod's captured tree on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedTree {
    /// The capture's namespace (the pod's).
    pub namespace: String,
    /// The `GKMCacheCapture`'s name.
    pub capture: String,
    /// The workload pod's uid.
    pub uid: String,
    /// How long since the tree last changed at its top.
    pub age: Duration,
}

/// What the cluster says of a tree's capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureSeen {
    /// It exists and is not over: its tree may still be captured.
    Open,
    /// It is `Complete` or `Failed`.
    Over,
    /// It does not exist.
    Gone,
}

impl CaptureSeen {
    /// What `capture` says.
    pub fn of(capture: &GKMCacheCapture) -> CaptureSeen {
        let over = capture
            .status
            .as_ref()
            .is_some_and(|status| status.phase.is_final());
        if over {
            CaptureSeen::Over
        } else {
            CaptureSeen::Open
        }
    }
}

/// The trees that may go: those whose capture is [`Over`](CaptureSeen::Over),
/// and those whose capture is [`Gone`](CaptureSeen::Gone) and that are at
/// least `grace` old. A tree whose capture `seen` does not hold stays.
pub fn releasable<'a>(
    trees: &'a [CapturedTree],
    seen: &BTreeMap<(String, String), CaptureSeen>,
    grace: Duration,
) -> Vec<&'a CapturedTree> {
    trees
        .iter()
        .filter(
            |tree| match seen.get(&(tree.namespace.clone(), tree.capture.clone())) {
                Some(CaptureSeen::Over) => true,
                Some(CaptureSeen::Gone) => tree.age >= grace,
                Some(CaptureSeen::Open) | None => false,
            },
        )
        .collect()
}

/// The captured trees below the store root `root`
/// (`captures/<namespace>/<capture>/<uid>`), their ages as of `now`.
/// Entries that are not names are skipped (nothing gkm made).
pub fn captured_trees(root: &Path, now: SystemTime) -> io::Result<Vec<CapturedTree>> {
    let mut trees = Vec::new();
    for (namespace, ns_dir) in named_dirs(&root.join(CAPTURES_DIR), is_dns1123_label)? {
        for (capture, capture_dir) in named_dirs(&ns_dir, is_dns1123_subdomain)? {
            for (uid, tree) in named_dirs(&capture_dir, is_uid)? {
                let changed = fs::metadata(&tree)
                    .and_then(|m| m.modified())
                    .unwrap_or(now);
                trees.push(CapturedTree {
                    namespace: namespace.clone(),
                    capture: capture.clone(),
                    uid,
                    age: now.duration_since(changed).unwrap_or_default(),
                });
            }
        }
    }
    Ok(trees)
}

fn is_uid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The directories in `dir` whose names pass `valid`, sorted; none when
/// `dir` does not exist.
fn named_dirs(
    dir: &Path,
    valid: fn(&str) -> bool,
) -> io::Result<Vec<(String, std::path::PathBuf)>> {
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

/// How [`release_captures`] runs.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// This node's name: only its captures are watched.
    pub node: String,
    /// How often the trees are looked at besides the watch's events (a
    /// capture of another node, or deleted, shows in no event here).
    pub interval: Duration,
    /// How old a tree whose capture does not exist must be to go.
    pub grace: Duration,
}

/// Removes captured trees from the node as [`releasable`] says, until
/// `shutdown` completes: after each change to this node's captures, and
/// every `options.interval`.
pub async fn release_captures(
    client: Client,
    node: NodeService,
    options: ReleaseOptions,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let api: Api<GKMCacheCapture> = Api::all(client.clone());
    let fields = format!("status.node={}", options.node);
    let (store, writer) = reflector::store();
    let mut changes = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default().fields(&fields)).default_backoff(),
    )
    .touched_objects()
    .boxed();
    let mut tick = tokio::time::interval(options.interval);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
            change = changes.next() => match change {
                None => return,
                Some(Err(e)) => {
                    warn!(error = %e, "watching this node's captures");
                    continue;
                }
                Some(Ok(_)) => {}
            },
        }
        if let Err(e) = sweep(&client, &node, &store, &options).await {
            warn!(error = %e, "releasing captured trees");
        }
    }
}

/// One look at the trees: what their captures say, and the release of
/// those that may go.
async fn sweep(
    client: &Client,
    node: &NodeService,
    store: &Store<GKMCacheCapture>,
    options: &ReleaseOptions,
) -> Result<(), SweepError> {
    let root = node.store_root().to_path_buf();
    let trees = tokio::task::spawn_blocking(move || captured_trees(&root, SystemTime::now()))
        .await
        .map_err(|e| SweepError::Io(io::Error::other(e)))??;
    let mut seen = BTreeMap::new();
    for tree in &trees {
        let key = (tree.namespace.clone(), tree.capture.clone());
        if seen.contains_key(&key) {
            continue;
        }
        let watched = store.get(&ObjectRef::new(&tree.capture).within(&tree.namespace));
        let state = match watched {
            Some(capture) => CaptureSeen::of(&capture),
            None => Api::<GKMCacheCapture>::namespaced(client.clone(), &tree.namespace)
                .get_opt(&tree.capture)
                .await?
                .map_or(CaptureSeen::Gone, |c| CaptureSeen::of(&c)),
        };
        seen.insert(key, state);
    }
    for tree in releasable(&trees, &seen, options.grace) {
        let (node, tree) = (node.clone(), tree.clone());
        let released = tokio::task::spawn_blocking(move || {
            node.release_capture(&tree.namespace, &tree.capture, &tree.uid)
                .map(|()| tree)
        })
        .await
        .map_err(|e| SweepError::Io(io::Error::other(e)))?;
        match released {
            Ok(tree) => {
                info!(namespace = %tree.namespace, capture = %tree.capture, pod = %tree.uid, "released a captured tree")
            }
            Err(status) => warn!(error = %status.message(), "releasing a captured tree"),
        }
    }
    Ok(())
}

/// Why a look at the captured trees stopped.
#[derive(Debug, thiserror::Error)]
enum SweepError {
    /// Listing the trees.
    #[error("listing the captured trees: {0}")]
    Io(#[from] io::Error),
    /// Reading a capture.
    #[error("reading a capture: {0}")]
    Kube(#[from] kube::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(namespace: &str, capture: &str, uid: &str, age: u64) -> CapturedTree {
        CapturedTree {
            namespace: namespace.into(),
            capture: capture.into(),
            uid: uid.into(),
            age: Duration::from_secs(age),
        }
    }

    fn key(namespace: &str, capture: &str) -> (String, String) {
        (namespace.into(), capture.into())
    }

    #[test]
    fn trees_of_captures_that_are_over_or_long_gone_go_the_rest_stay() {
        let trees = vec![
            tree("team", "done", "u1", 1),
            tree("team", "done", "u2", 1),
            tree("team", "open", "u3", 9999),
            tree("team", "deleted", "u4", 600),
            tree("team", "deleted-now", "u5", 10),
            tree("team", "unknown", "u6", 9999),
            tree("other", "done", "u7", 9999),
        ];
        let seen = BTreeMap::from([
            (key("team", "done"), CaptureSeen::Over),
            (key("team", "open"), CaptureSeen::Open),
            (key("team", "deleted"), CaptureSeen::Gone),
            (key("team", "deleted-now"), CaptureSeen::Gone),
            (key("other", "done"), CaptureSeen::Open),
        ]);
        let uids: Vec<&str> = releasable(&trees, &seen, Duration::from_secs(300))
            .into_iter()
            .map(|t| t.uid.as_str())
            .collect();
        assert_eq!(uids, ["u1", "u2", "u4"]);
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
        let trees = captured_trees(root.path(), SystemTime::now()).expect("listed");
        let found: Vec<String> = trees
            .iter()
            .map(|t| format!("{}/{}/{}", t.namespace, t.capture, t.uid))
            .collect();
        assert_eq!(found, ["team/warm/6f1c-22", "team/warm/7a"]);
        let none = tempfile::tempdir().expect("tempdir");
        assert!(
            captured_trees(none.path(), SystemTime::now())
                .expect("no captures dir")
                .is_empty()
        );
    }

    #[test]
    fn a_capture_is_over_once_complete_or_failed() {
        use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCacheCaptureSpec};
        let mut capture = GKMCacheCapture::new("warm", GKMCacheCaptureSpec::default());
        assert_eq!(CaptureSeen::of(&capture), CaptureSeen::Open);
        for (phase, seen) in [
            (CapturePhase::Capturing, CaptureSeen::Open),
            (CapturePhase::Pushing, CaptureSeen::Open),
            (CapturePhase::Complete, CaptureSeen::Over),
            (CapturePhase::Failed, CaptureSeen::Over),
        ] {
            capture.status = Some(CaptureStatus {
                phase,
                ..CaptureStatus::default()
            });
            assert_eq!(CaptureSeen::of(&capture), seen, "{phase:?}");
        }
    }
}
