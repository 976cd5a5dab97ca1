//! Removing captured trees from the node once nothing needs them.
//!
//! A workload's capture tree (see [`crate::capture`]) outlives the pod so
//! that its capture Job can read it. It goes when its `GKMCacheCapture` is
//! over (`Complete` or `Failed`), or when that capture no longer exists and
//! the tree is older than a grace period (a workload may start before its
//! capture is created; a capture deleted mid-way leaves its tree behind).
//!
//! The driver reads no cluster object: the agent writes what the cluster
//! says of the captures the node's trees name in the node-local
//! [capture index](gkm_k8s_node::captures), and [`release_captures`] reads
//! it every [`ReleaseOptions::interval`], as the driver reads the delivery
//! index before each mount. Which trees may go is [`releasable`] (pure);
//! the driver unmounts and removes them itself, as the trees are mounted in
//! its mount namespace. A missing or unreadable index releases nothing.

use std::io;
use std::time::{Duration, SystemTime};

use gkm_k8s_node::captures::{CaptureIndex, CaptureState, CapturedTree, Captures, captured_trees};
use tracing::{info, warn};

use crate::NodeService;

/// The trees that may go, as of `now`, by what the capture index says of
/// their captures: those whose capture is [`Over`](CaptureState::Over),
/// and those whose capture is [`Gone`](CaptureState::Gone) and that are at
/// least `grace` old. A tree whose capture the index does not name, or that
/// changed after the agent observed what the index says, stays.
pub fn releasable<'a>(
    trees: &'a [CapturedTree],
    captures: &Captures,
    grace: Duration,
    now: SystemTime,
) -> Vec<&'a CapturedTree> {
    let observed = SystemTime::from(captures.observed);
    trees
        .iter()
        .filter(|tree| tree.modified <= observed)
        .filter(|tree| match captures.state(&tree.capture) {
            Some(CaptureState::Over) => true,
            Some(CaptureState::Gone) => {
                now.duration_since(tree.modified).unwrap_or_default() >= grace
            }
            Some(CaptureState::Open) | None => false,
        })
        .collect()
}

/// How [`release_captures`] runs.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// How often the capture index and the trees are looked at.
    pub interval: Duration,
    /// How old a tree whose capture does not exist must be to go.
    pub grace: Duration,
}

/// Removes captured trees from the node as [`releasable`] says, every
/// `options.interval` until `shutdown` completes.
pub async fn release_captures(
    node: NodeService,
    options: ReleaseOptions,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let index = CaptureIndex::new(node.store_root());
    let mut complaint = Complaint::default();
    let mut tick = tokio::time::interval(options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = sweep(&node, &index, &options, &mut complaint).await {
            warn!(error = %e, "releasing captured trees");
        }
    }
}

/// What was last said of an index that could not be used, so that it is
/// said once, not every interval.
#[derive(Default)]
struct Complaint(Option<String>);

impl Complaint {
    /// Whether `what` is news.
    fn is_new(&mut self, what: String) -> bool {
        let new = self.0.as_ref() != Some(&what);
        self.0 = Some(what);
        new
    }

    /// Whether there was a complaint, forgetting it.
    fn clear(&mut self) -> bool {
        self.0.take().is_some()
    }
}

/// One look at the trees and the index, and the release of the trees that
/// may go.
async fn sweep(
    node: &NodeService,
    index: &CaptureIndex,
    options: &ReleaseOptions,
    complaint: &mut Complaint,
) -> io::Result<()> {
    let root = node.store_root().to_path_buf();
    let read_index = index.clone();
    let (trees, captures) = tokio::task::spawn_blocking(move || {
        let trees = captured_trees(&root, SystemTime::now())?;
        Ok::<_, io::Error>((trees, read_index.read()))
    })
    .await
    .map_err(io::Error::other)??;
    if trees.is_empty() {
        return Ok(());
    }
    let captures = match captures {
        Ok(Some(captures)) => {
            if complaint.clear() {
                info!(index = %index.path().display(), "the capture index reads again");
            }
            captures
        }
        Ok(None) => {
            if complaint.is_new("missing".into()) {
                info!(index = %index.path().display(), trees = trees.len(),
                    "no capture index yet: captured trees stay until the agent writes it");
            }
            return Ok(());
        }
        Err(e) => {
            if complaint.is_new(e.to_string()) {
                warn!(error = %e,
                    "the capture index cannot be read: captured trees stay until it can");
            }
            return Ok(());
        }
    };
    for tree in releasable(&trees, &captures, options.grace, SystemTime::now()) {
        let (node, tree) = (node.clone(), tree.clone());
        let released = tokio::task::spawn_blocking(move || {
            node.release_capture(&tree.capture.namespace, &tree.capture.name, &tree.uid)
                .map(|()| tree)
        })
        .await
        .map_err(io::Error::other)?;
        match released {
            Ok(tree) => {
                info!(capture = %tree.capture, pod = %tree.uid, "released a captured tree")
            }
            Err(status) => warn!(error = %status.message(), "releasing a captured tree"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use gkm_k8s_node::captures::CaptureName;
    use jiff::Timestamp;

    use super::*;

    const NOW: u64 = 100_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn tree(namespace: &str, capture: &str, uid: &str, age: u64) -> CapturedTree {
        CapturedTree {
            capture: CaptureName::new(namespace, capture),
            uid: uid.into(),
            modified: at(NOW - age),
        }
    }

    fn captures(observed: u64, states: &[(&str, &str, CaptureState)]) -> Captures {
        Captures {
            observed: Timestamp::try_from(at(observed)).expect("timestamp"),
            states: states
                .iter()
                .map(|(ns, name, state)| (CaptureName::new(*ns, *name), *state))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn released(trees: &[CapturedTree], captures: &Captures) -> Vec<String> {
        releasable(trees, captures, Duration::from_secs(300), at(NOW))
            .into_iter()
            .map(|t| t.uid.clone())
            .collect()
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
        let index = captures(
            NOW,
            &[
                ("team", "done", CaptureState::Over),
                ("team", "open", CaptureState::Open),
                ("team", "deleted", CaptureState::Gone),
                ("team", "deleted-now", CaptureState::Gone),
                ("other", "done", CaptureState::Open),
            ],
        );
        assert_eq!(released(&trees, &index), ["u1", "u2", "u4"]);
        assert!(released(&trees, &captures(NOW, &[])).is_empty());
    }

    #[test]
    fn a_tree_newer_than_the_index_stays() {
        // The agent looked 60s ago: a tree made since (a capture re-created
        // under the same name) is not what that look saw.
        let trees = vec![
            tree("team", "warm", "old", 600),
            tree("team", "warm", "new", 10),
        ];
        let over = captures(NOW - 60, &[("team", "warm", CaptureState::Over)]);
        assert_eq!(released(&trees, &over), ["old"]);
        let gone = captures(NOW - 60, &[("team", "warm", CaptureState::Gone)]);
        assert_eq!(released(&trees, &gone), ["old"]);
    }
}
