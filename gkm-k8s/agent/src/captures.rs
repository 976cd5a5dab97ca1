//! The capture index: what the cluster says of the `GKMCacheCapture`s whose
//! trees are on this node, written for the CSI driver, which reads no
//! cluster object ([`gkm_k8s_node::captures`]).
//!
//! The agent watches only the captures of this node (the field selector
//! `status.node=<node>`, a `selectableField` of the CRD), and reads by name
//! only a capture that a tree on the node names and that watch does not
//! hold: one not captured yet, captured on another node, or deleted. It
//! writes the index after each change to this node's captures and every
//! [`AgentConfig::capture_index_every`](crate::AgentConfig::capture_index_every)
//! while trees are on the node, so that what the index says is never much
//! older than the trees. A capture that cannot be read is left out of the
//! index: the driver keeps its trees.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use gkm_k8s_api::crd::GKMCacheCapture;
use gkm_k8s_node::captures::{CaptureIndex, CaptureName, CaptureState, Captures, captured_trees};
use jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tracing::warn;

use crate::error::{Error, Result};

/// What the cluster says of `capture`.
pub(crate) fn capture_state(capture: &GKMCacheCapture) -> CaptureState {
    let over = capture
        .status
        .as_ref()
        .is_some_and(|status| status.phase.is_final());
    if over {
        CaptureState::Over
    } else {
        CaptureState::Open
    }
}

/// What the agent reads of a capture, to tell whether an event changed it.
fn capture_view(capture: &GKMCacheCapture) -> Value {
    json!(capture_state(capture) == CaptureState::Over)
}

/// Keeps the capture index of the store at `store_dir` for node `node`
/// until the task is dropped: after each change to the node's captures and
/// every `every` while captured trees are on the node.
pub(crate) fn start(
    client: Client,
    node: &str,
    store_dir: PathBuf,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let changed = Arc::new(Notify::new());
    let events = watcher(
        Api::<GKMCacheCapture>::all(client.clone()),
        watcher::Config::default().fields(&format!("status.node={node}")),
    );
    let watched = crate::watch(events, &changed, capture_view);
    tokio::spawn(async move {
        let index = CaptureIndex::new(&store_dir);
        let mut written: Option<Captures> = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = changed.notified() => {}
                _ = tick.tick() => {}
            }
            match look(&client, &store_dir, &watched).await {
                Ok(captures) => {
                    // Nothing on the node and nothing said before: no news.
                    let idle = captures.states.is_empty()
                        && written.as_ref().is_some_and(|w| w.states.is_empty());
                    if idle {
                        continue;
                    }
                    match publish(&index, captures.clone()).await {
                        Ok(()) => written = Some(captures),
                        Err(e) => warn!(error = %e, "writing the capture index"),
                    }
                }
                Err(e) => warn!(error = %e, "looking at the captured trees"),
            }
        }
    })
}

/// The states of the captures the trees below `store_dir` name, as of now.
async fn look(
    client: &Client,
    store_dir: &Path,
    watched: &Store<GKMCacheCapture>,
) -> Result<Captures> {
    let observed = Timestamp::now();
    let root = store_dir.to_path_buf();
    let trees = crate::error::blocking("listing captured trees", move || {
        captured_trees(&root, SystemTime::now()).map_err(|e| Error::Io {
            path: root.clone(),
            source: e,
        })
    })
    .await?;
    let names: BTreeSet<CaptureName> = trees.into_iter().map(|t| t.capture).collect();
    let mut captures = Captures::new(observed);
    for name in names {
        let held = watched.get(&ObjectRef::new(&name.name).within(&name.namespace));
        let state = match held {
            Some(capture) => capture_state(&capture),
            None => match Api::<GKMCacheCapture>::namespaced(client.clone(), &name.namespace)
                .get_opt(&name.name)
                .await
            {
                Ok(found) => found.as_ref().map_or(CaptureState::Gone, capture_state),
                Err(e) => {
                    warn!(capture = %name, error = %e, "reading a captured tree's capture; its trees stay");
                    continue;
                }
            },
        };
        captures.states.insert(name, state);
    }
    Ok(captures)
}

/// Writes `captures` to `index`, off the async threads.
async fn publish(index: &CaptureIndex, captures: Captures) -> Result<()> {
    let index = index.clone();
    crate::error::blocking("writing the capture index", move || {
        index.publish(&captures).map_err(Error::from)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CapturePhase, CaptureStatus, GKMCacheCaptureSpec};

    #[test]
    fn a_capture_is_over_once_complete_or_failed() {
        let mut capture = GKMCacheCapture::new("warm", GKMCacheCaptureSpec::default());
        assert_eq!(capture_state(&capture), CaptureState::Open);
        for (phase, state) in [
            (CapturePhase::Capturing, CaptureState::Open),
            (CapturePhase::Pushing, CaptureState::Open),
            (CapturePhase::Complete, CaptureState::Over),
            (CapturePhase::Failed, CaptureState::Over),
        ] {
            capture.status = Some(CaptureStatus {
                phase,
                ..CaptureStatus::default()
            });
            assert_eq!(capture_state(&capture), state, "{phase:?}");
            assert_eq!(
                capture_view(&capture),
                json!(state == CaptureState::Over),
                "{phase:?}"
            );
        }
    }
}
