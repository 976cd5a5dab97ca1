//! Removing capture trees from the node once nothing will capture them, so
//! that their memory comes back.
//!
//! A workload's capture tree (see [`super::tree`]) outlives the pod so
//! that its capture Job can read it, and only so long:
//!
//! - **At the pod's end.** When `NodeUnpublishVolume` takes a tree's last
//!   mount out of a pod (its workload's bind, or a capture Job's view) and
//!   the agent's capture index says the tree's capture is not pending (over,
//!   deleted, not named), or capture volumes are disabled, the tree goes at
//!   once ([`unmounted`]).
//! - **Over.** A tree whose capture is `Complete` or `Failed` goes at the
//!   next look, mounted in its workload or not (the workload's bind keeps
//!   the memory only until that pod ends, charged to it), but never while
//!   a pod has a read-only view of it.
//! - **Gone.** A tree whose capture the index says does not exist, or does
//!   not name (the index lists every pending capture), goes once it is
//!   [`ReleaseOptions::grace`] old and no pod views it.
//!
//! A read-only view holds the tree's `tmpfs`, and its pages (charged to the
//! writer, which may have ended), as long as the viewing pod lives: a tree
//! released under it would pin node memory no cap counts. So a viewed tree
//! stays, counted against its namespace's and the node's caps, until its
//! last reader is gone; then it goes as the reader's unpublish finds
//! nothing will capture it ([`unmounted`]), or at the next look.
//! - **Pending, never read.** A tree of a pending capture that no pod has
//!   had mounted for [`CaptureConfig::unread_grace`] (30 minutes by default:
//!   its workload ended and no capture Job read it since) goes, so a
//!   capture that never runs does not pin the node's memory.
//! - **Disabled.** With capture volumes disabled nothing will capture a
//!   tree: each goes once no pod has it mounted.
//!
//! Every time these read is one the driver keeps itself ([`super::markers`]:
//! when it last published the tree to its workload, since when no pod has
//! had it mounted), never the tree's own, which its pod may set.
//!
//! The driver reads no cluster object: the agent writes what the cluster
//! says of the captures in the node-local [capture
//! index](gkm_k8s_node::captures), and [`release_captures`] reads it every
//! [`ReleaseOptions::interval`]. Which trees may go is [`releasable`]
//! (pure); the driver unmounts and removes them. A missing or unreadable
//! index releases nothing but the trees of a node with capture volumes
//! disabled.

use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use gkm_k8s_node::captures::{
    CaptureIndex, CaptureName, CaptureState, CapturedTree, Captures, captured_trees,
};
use tracing::{info, warn};

use super::admission::CaptureConfig;
use super::markers::{Marker, remove_markers};
use super::publish::CaptureTrees;
use super::tree::{self, mounted_trees};

/// What the driver knows of a tree when it decides whether it goes.
#[derive(Debug, Clone)]
pub struct TreeFacts {
    /// Its capture and pod.
    pub tree: CapturedTree,
    /// When the driver last published it to its workload, by the driver's
    /// own record.
    pub published: SystemTime,
    /// Whether a pod has it mounted.
    pub in_use: bool,
    /// Whether a pod has a view of it (which holds its memory).
    pub viewed: bool,
    /// Since when no pod has had it mounted, if known.
    pub idle_since: Option<SystemTime>,
}

/// The trees that may go, as of `now`, by what the capture index (`None`
/// when there is none yet, or it cannot be read) says of their captures
/// (see the [module docs](self)).
pub fn releasable<'a>(
    trees: &'a [TreeFacts],
    captures: Option<&Captures>,
    config: &CaptureConfig,
    grace: Duration,
    now: SystemTime,
) -> Vec<&'a TreeFacts> {
    let age = |since: SystemTime| now.duration_since(since).unwrap_or_default();
    trees
        .iter()
        .filter(|facts| {
            if !config.enabled {
                return !facts.in_use;
            }
            let Some(captures) = captures else {
                return false;
            };
            let tree = &facts.tree;
            // What the index says is of an older look than this tree.
            if facts.published > SystemTime::from(captures.observed) {
                return false;
            }
            match captures.state(&tree.capture) {
                Some(CaptureState::Over) => !facts.viewed,
                Some(CaptureState::Gone) | None => !facts.viewed && age(facts.published) >= grace,
                Some(CaptureState::Open) => {
                    !facts.in_use
                        && facts
                            .idle_since
                            .is_some_and(|since| age(since) >= config.unread_grace)
                }
            }
        })
        .collect()
}

/// Whether a tree whose last mount in a pod just went is kept: only when
/// capture volumes are enabled and its capture is pending, or when there is
/// no index to tell.
pub fn kept_at_its_end(
    capture: &CaptureName,
    captures: Option<&Captures>,
    config: &CaptureConfig,
) -> bool {
    if !config.enabled {
        return false;
    }
    match captures {
        None => true,
        Some(captures) => captures.state(capture) == Some(CaptureState::Open),
    }
}

/// How [`release_captures`] runs.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// How often the capture index and the trees are looked at.
    pub interval: Duration,
    /// How old a tree whose capture does not exist must be to go.
    pub grace: Duration,
}

/// Removes capture trees from the node as `releasable` says, every
/// `options.interval` until `shutdown` completes.
pub async fn release_captures(
    trees: CaptureTrees,
    options: ReleaseOptions,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let index = CaptureIndex::new(trees.root());
    let mut complaint = Complaint::default();
    let mut tick = tokio::time::interval(options.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = sweep(&trees, &index, &options, &mut complaint).await {
            warn!(error = %e, "releasing capture trees");
        }
    }
}

/// After `NodeUnpublishVolume` took a capture volume of `capture`'s tree of
/// pod `uid` out of a pod: releases the tree at once when nothing will
/// capture it and no other pod has it mounted, or marks it idle from now.
/// Blocking; failures are logged, as the unpublish itself succeeded.
pub fn unmounted(trees: &CaptureTrees, capture: &CaptureName, uid: &str) {
    let root = trees.root();
    let in_use = match mounted_trees(root) {
        Ok(trees) => trees
            .iter()
            .any(|t| t.in_use && t.granted.capture == *capture && t.granted.uid == uid),
        Err(e) => {
            warn!(error = %e, "reading the capture trees' mounts: the tree stays");
            return;
        }
    };
    if in_use {
        return;
    }
    let captures = CaptureIndex::new(root).read().unwrap_or_else(|e| {
        warn!(error = %e, "the capture index cannot be read");
        None
    });
    if kept_at_its_end(capture, captures.as_ref(), trees.config()) {
        if let Err(e) = Marker::Idle.set(root, capture, uid) {
            warn!(error = %e, capture = %capture, pod = %uid, "marking a capture tree idle");
        }
        return;
    }
    release(trees, capture, uid, "nothing will capture it");
}

/// Unmounts and removes a tree and its markers, and says so.
fn release(trees: &CaptureTrees, capture: &CaptureName, uid: &str, why: &str) {
    match trees.release(&capture.namespace, &capture.name, uid) {
        Ok(()) => {
            remove_markers(trees.root(), capture, uid);
            info!(capture = %capture, pod = %uid, why, "released a capture tree");
        }
        Err(status) => warn!(error = %status.message(), "releasing a capture tree"),
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

/// The trees below `root` with what the driver knows of them; a tree
/// without a marker the driver keeps is marked from now (see
/// [`super::markers`]).
fn tree_facts(root: &Path) -> io::Result<Vec<TreeFacts>> {
    let now = SystemTime::now();
    let mounted = mounted_trees(root)?;
    let mut facts = Vec::new();
    for tree in captured_trees(root)? {
        let mount = mounted
            .iter()
            .find(|m| m.granted.capture == tree.capture && m.granted.uid == tree.uid);
        let in_use = mount.is_some_and(|m| m.in_use);
        let viewed = mount.is_some_and(|m| m.viewed);
        let published = Marker::Published.since(root, &tree.capture, &tree.uid, now)?;
        let idle_since = if in_use {
            None
        } else {
            Some(Marker::Idle.since(root, &tree.capture, &tree.uid, now)?)
        };
        facts.push(TreeFacts {
            tree,
            published,
            in_use,
            viewed,
            idle_since,
        });
    }
    Ok(facts)
}

/// One look at the trees and the index, and the release of the trees that
/// may go.
async fn sweep(
    captured: &CaptureTrees,
    index: &CaptureIndex,
    options: &ReleaseOptions,
    complaint: &mut Complaint,
) -> io::Result<()> {
    let root = captured.root().to_path_buf();
    let read_index = index.clone();
    let (trees, captures) = tokio::task::spawn_blocking(move || {
        Ok::<_, io::Error>((tree_facts(&root)?, read_index.read()))
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
            Some(captures)
        }
        Ok(None) => {
            if complaint.is_new("missing".into()) {
                info!(index = %index.path().display(), trees = trees.len(),
                    "no capture index yet: capture trees stay until the agent writes it");
            }
            None
        }
        Err(e) => {
            if complaint.is_new(e.to_string()) {
                warn!(error = %e,
                    "the capture index cannot be read: capture trees stay until it can");
            }
            None
        }
    };
    let config = captured.config().clone();
    let now = SystemTime::now();
    let going: Vec<TreeFacts> = releasable(&trees, captures.as_ref(), &config, options.grace, now)
        .into_iter()
        .cloned()
        .collect();
    for facts in going {
        let captured = captured.clone();
        tokio::task::spawn_blocking(move || {
            let tree = &facts.tree;
            release(
                &captured,
                &tree.capture,
                &tree.uid,
                "its capture is over, gone or idle",
            );
        })
        .await
        .map_err(io::Error::other)?;
    }
    Ok(())
}

/// Says, at the driver's start, which capture trees it found mounted (a
/// driver restarted finds those it made before) and whether new ones will
/// outlive it.
pub fn report_trees_at_start(root: &Path) {
    match mounted_trees(root) {
        Ok(trees) if !trees.is_empty() => {
            let bytes: u64 = trees.iter().map(|t| t.granted.bytes).sum();
            info!(trees = trees.len(), bytes, "found capture trees mounted");
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "reading the capture trees' mounts"),
    }
    match tree::trees_propagate(root) {
        Ok(true) => {}
        Ok(false) => warn!(
            dir = %root.join(tree::CAPTURES_DIR).display(),
            "the capture tree directory is not a shared mount: trees would go with this driver's mount namespace (mount it with mountPropagation: Bidirectional)"
        ),
        Err(e) => warn!(error = %e, "checking the capture tree directory's propagation"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use jiff::Timestamp;

    use super::*;

    const NOW: u64 = 100_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn tree(capture: &str, uid: &str, age: u64) -> TreeFacts {
        TreeFacts {
            tree: CapturedTree {
                capture: CaptureName::new("team", capture),
                uid: uid.into(),
            },
            published: at(NOW - age),
            in_use: false,
            viewed: false,
            idle_since: Some(at(NOW - age)),
        }
    }

    fn in_use(mut facts: TreeFacts) -> TreeFacts {
        facts.in_use = true;
        facts.idle_since = None;
        facts
    }

    fn captures(observed: u64, states: &[(&str, CaptureState)]) -> Captures {
        Captures {
            observed: Timestamp::try_from(at(observed)).expect("timestamp"),
            states: states
                .iter()
                .map(|(name, state)| (CaptureName::new("team", *name), *state))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    fn config() -> CaptureConfig {
        CaptureConfig {
            unread_grace: Duration::from_secs(1800),
            ..CaptureConfig::default()
        }
    }

    fn released(
        trees: &[TreeFacts],
        index: Option<&Captures>,
        config: &CaptureConfig,
    ) -> Vec<String> {
        releasable(trees, index, config, Duration::from_secs(60), at(NOW))
            .into_iter()
            .map(|t| t.tree.uid.clone())
            .collect()
    }

    #[test]
    fn trees_of_captures_over_gone_or_unnamed_go_pending_ones_stay_a_while() {
        let trees = vec![
            tree("done", "over", 1),
            in_use(tree("done", "over-in-use", 1)),
            tree("deleted", "gone", 120),
            tree("deleted", "gone-just-now", 10),
            tree("unnamed", "unnamed", 120),
            tree("open", "idle-long", 3600),
            tree("open", "idle-briefly", 600),
            in_use(tree("open", "running", 3600)),
        ];
        let index = captures(
            NOW,
            &[
                ("done", CaptureState::Over),
                ("deleted", CaptureState::Gone),
                ("open", CaptureState::Open),
            ],
        );
        assert_eq!(
            released(&trees, Some(&index), &config()),
            ["over", "over-in-use", "gone", "unnamed", "idle-long"]
        );
        assert!(released(&trees, None, &config()).is_empty(), "no index");
    }

    #[test]
    fn a_tree_a_pod_views_stays_whatever_its_capture() {
        let viewed = |facts: TreeFacts| TreeFacts {
            viewed: true,
            ..in_use(facts)
        };
        let trees = vec![
            viewed(tree("done", "over-viewed", 1)),
            viewed(tree("deleted", "gone-viewed", 120)),
            tree("done", "over", 1),
        ];
        let index = captures(
            NOW,
            &[
                ("done", CaptureState::Over),
                ("deleted", CaptureState::Gone),
            ],
        );
        assert_eq!(released(&trees, Some(&index), &config()), ["over"]);
    }

    #[test]
    fn with_capture_volumes_disabled_every_tree_no_pod_holds_goes() {
        let trees = vec![tree("open", "idle", 1), in_use(tree("open", "running", 1))];
        let disabled = CaptureConfig {
            enabled: false,
            ..config()
        };
        let index = captures(NOW, &[("open", CaptureState::Open)]);
        assert_eq!(released(&trees, Some(&index), &disabled), ["idle"]);
        assert_eq!(released(&trees, None, &disabled), ["idle"]);
    }

    #[test]
    fn a_tree_newer_than_the_index_stays() {
        // The agent looked 60s ago: a tree changed since is not what that
        // look saw.
        let trees = vec![tree("warm", "old", 600), tree("warm", "new", 10)];
        let over = captures(NOW - 60, &[("warm", CaptureState::Over)]);
        assert_eq!(released(&trees, Some(&over), &config()), ["old"]);
    }

    #[test]
    fn at_its_pods_end_a_tree_stays_only_for_a_pending_capture() {
        let warm = CaptureName::new("team", "warm");
        let says = |state| captures(NOW, &[("warm", state)]);
        assert!(kept_at_its_end(
            &warm,
            Some(&says(CaptureState::Open)),
            &config()
        ));
        assert!(kept_at_its_end(&warm, None, &config()), "no index to tell");
        for state in [CaptureState::Over, CaptureState::Gone] {
            assert!(!kept_at_its_end(&warm, Some(&says(state)), &config()));
        }
        assert!(!kept_at_its_end(
            &warm,
            Some(&captures(NOW, &[])),
            &config()
        ));
        let disabled = CaptureConfig {
            enabled: false,
            ..config()
        };
        assert!(!kept_at_its_end(
            &warm,
            Some(&says(CaptureState::Open)),
            &disabled
        ));
    }
}
