//! The capture index: what the cluster says of the `GKMCacheCapture`s, written
//! for the CSI driver, which reads no cluster object
//! ([`gkm_k8s_node::captures`]).
//!
//! The driver publishes a workload's capture volume only for a pending
//! capture of the pod's namespace, and releases a tree once nothing will
//! capture it, so the index names every pending (`open`) capture of the
//! cluster, and the state (`over`, `gone`) of each capture a tree on the
//! node names. The agent watches every capture (one reflector of the
//! captures, small objects) and reads nothing by name; it writes nothing
//! until that watch has listed them all, so a capture it has not seen yet
//! is never said to be gone. The index holds one short entry per pending
//! capture: its size follows the number of pending captures, which a
//! `ResourceQuota` on `count/gkmcachecaptures.gkm.io` bounds per namespace.
//! It writes the index after each change to a capture and every
//! [`AgentConfig::capture_index_every`](crate::AgentConfig::capture_index_every)
//! while there is anything to say, so that what the index says is never
//! much older than the trees.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gkm_k8s_api::crd::GKMCacheCapture;
use gkm_k8s_node::captures::{CaptureIndex, CaptureName, CaptureState, Captures, captured_trees};
use jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
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

/// Keeps the capture index of the store at `store_dir` until the task is
/// dropped: after each change to a capture and every `every` while there is
/// anything to say.
pub(crate) fn start(
    client: Client,
    store_dir: PathBuf,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let changed = Arc::new(Notify::new());
    let events = watcher(
        Api::<GKMCacheCapture>::all(client),
        watcher::Config::default(),
    );
    let watched = crate::watch(events, &changed, capture_view);
    tokio::spawn(async move {
        // Nothing is said of a capture before every capture was listed.
        if let Err(e) = watched.wait_until_ready().await {
            warn!(error = %e, "watching GKMCacheCaptures: no capture index");
            return;
        }
        let index = CaptureIndex::new(&store_dir);
        let mut written: Option<Captures> = None;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = changed.notified() => {}
                _ = tick.tick() => {}
            }
            match look(&store_dir, &watched).await {
                Ok(captures) => {
                    // Nothing to say, and nothing said before: no news.
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

/// The index as of now: every pending capture of the cluster, and the
/// state of each capture the trees below `store_dir` name.
async fn look(store_dir: &Path, watched: &Store<GKMCacheCapture>) -> Result<Captures> {
    let observed = Timestamp::now();
    let root = store_dir.to_path_buf();
    let trees = crate::error::blocking("listing captured trees", move || {
        captured_trees(&root).map_err(|e| Error::Io {
            path: root.clone(),
            source: e,
        })
    })
    .await?;
    let mut captures = pending(&watched.state());
    for tree in trees {
        let name = tree.capture;
        let held = watched.get(&ObjectRef::new(&name.name).within(&name.namespace));
        let state = held.map_or(CaptureState::Gone, |c| capture_state(&c));
        captures.insert(name, state);
    }
    let mut index = Captures::new(observed);
    index.states = captures;
    Ok(index)
}

/// The pending captures among `all`, by name.
fn pending(all: &[Arc<GKMCacheCapture>]) -> std::collections::BTreeMap<CaptureName, CaptureState> {
    all.iter()
        .filter(|c| capture_state(c) == CaptureState::Open)
        .filter_map(|c| {
            let namespace = c.namespace()?;
            Some((
                CaptureName::new(namespace, c.name_any()),
                CaptureState::Open,
            ))
        })
        .collect()
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
    fn every_pending_capture_is_listed_and_none_that_is_over() {
        let with_phase = |ns: &str, name: &str, phase: Option<CapturePhase>| {
            let mut capture = GKMCacheCapture::new(name, GKMCacheCaptureSpec::default());
            capture.metadata.namespace = Some(ns.into());
            capture.status = phase.map(|phase| CaptureStatus {
                phase,
                ..CaptureStatus::default()
            });
            Arc::new(capture)
        };
        let all = [
            with_phase("team", "new", None),
            with_phase("team", "running", Some(CapturePhase::Capturing)),
            with_phase("other", "done", Some(CapturePhase::Complete)),
            with_phase("other", "failed", Some(CapturePhase::Failed)),
        ];
        let listed: Vec<String> = pending(&all).keys().map(|n| n.to_string()).collect();
        assert_eq!(listed, ["team/new", "team/running"]);
    }

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
