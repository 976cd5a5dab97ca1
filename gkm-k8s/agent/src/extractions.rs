//! Pulling and extracting digests into the node store, off the agent's
//! loop: few at a time (so their memory does not add up), at most one per
//! namespace so that one tenant's slow registry cannot hold them all
//! ([`FairSlots`]), each within a total deadline, each failure tried again
//! with backoff, the loop woken when one ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gkm_oci::{ExtractPolicy, Image, Repo, Store};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::metrics::AgentMetrics;
use crate::retry::Backoff;
use crate::slots::{FairSlots, Scope};
use gkm_core::Digest;

/// How many extractions run at once, whatever the namespaces.
const EXTRACTION_SLOTS: usize = 2;

/// How one extraction ended: the extracted tree's size, or why it failed.
type Ended = ((Scope, Digest), Result<i64, String>);

/// The extractions under way and those that failed.
pub(crate) struct Extractions {
    store: Store,
    policy: ExtractPolicy,
    metrics: AgentMetrics,
    /// Under way, by namespace and digest; each yields the extracted
    /// tree's size. Keyed by namespace too, so that a cache naming another
    /// namespace's digest on a slow registry does not hold that namespace's
    /// extraction (each extracts into a staging directory of its own; the
    /// first to finish stores the digest, the others find it stored).
    running: HashMap<(Scope, Digest), JoinHandle<()>>,
    /// Each extraction sends its outcome here before it wakes the agent,
    /// so the pass it wakes finds it.
    ended: (UnboundedSender<Ended>, UnboundedReceiver<Ended>),
    /// Extractions that failed, tried again with backoff.
    failures: Backoff<(Scope, Digest)>,
    /// Few extractions at a time, one per namespace.
    slots: Arc<FairSlots>,
    /// How long one pull and extraction may take in all.
    deadline: Duration,
    /// Wakes the agent's loop when an extraction ends.
    changed: Arc<Notify>,
}

impl Extractions {
    /// Extractions into `store` under `policy`, waking `changed` as each ends.
    pub(crate) fn new(
        store: Store,
        policy: ExtractPolicy,
        deadline: Duration,
        metrics: AgentMetrics,
        changed: Arc<Notify>,
    ) -> Extractions {
        Extractions {
            store,
            policy,
            metrics,
            running: HashMap::new(),
            ended: unbounded_channel(),
            failures: Backoff::default(),
            slots: Arc::new(FairSlots::new(EXTRACTION_SLOTS)),
            deadline,
            changed,
        }
    }

    /// Whether `digest` is being extracted, for any namespace.
    pub(crate) fn is_running(&self, digest: &Digest) -> bool {
        self.running.keys().any(|(_, d)| d == digest)
    }

    /// The digests being extracted.
    pub(crate) fn running(&self) -> impl Iterator<Item = &Digest> {
        self.running.keys().map(|(_, digest)| digest)
    }

    /// Why `digest` failed for `scope`, while it waits to be tried again.
    pub(crate) fn waiting(&self, scope: &Scope, digest: &Digest) -> Option<String> {
        self.failures.waiting(&(scope.clone(), digest.clone()))
    }

    /// When a failed extraction is due to be tried again.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.failures.next_due()
    }

    /// Records that `digest` could not even be started for `scope`.
    pub(crate) fn failed(&mut self, scope: &Scope, digest: &Digest, why: String) {
        self.failures.failed(&(scope.clone(), digest.clone()), why);
    }

    /// Pulls and extracts `digest` from `repo` for a cache of `scope` in a
    /// task of its own, unless one is already under way; `known` is the
    /// image the summary came from, so its manifest and config are not read
    /// again.
    pub(crate) fn start(
        &mut self,
        scope: &Scope,
        repo: Repo,
        digest: Digest,
        known: Option<Arc<Image>>,
    ) {
        let key = (scope.clone(), digest);
        if self.running.contains_key(&key) {
            return;
        }
        let store = self.store.clone();
        let policy = self.policy.clone();
        let slots = self.slots.clone();
        let changed = self.changed.clone();
        let metrics = self.metrics.clone();
        let what = key.1.clone();
        let (deadline, ended, task_key) = (self.deadline, self.ended.0.clone(), key.clone());
        let task = tokio::spawn(async move {
            let slot = slots.acquire(&task_key.0).await;
            let started = Instant::now();
            let work = async {
                let stored = match &known {
                    Some(image) => store.ensure_image(&repo, image, &policy, None).await,
                    None => store.ensure(&repo, &policy, None).await,
                }
                .map_err(|e| e.to_string())?;
                let path = stored.path.clone();
                let size = tokio::task::spawn_blocking(move || tree_size(&path))
                    .await
                    .map_err(|e| format!("measuring the extracted tree: {e}"))?;
                info!(digest = %what, bytes = size, elapsed = ?started.elapsed(), "extracted");
                Ok(size)
            };
            let outcome = tokio::time::timeout(deadline, work)
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "pulling and extracting took longer than {}s",
                        deadline.as_secs_f64()
                    ))
                });
            drop(slot);
            metrics.extraction(outcome.is_ok(), started.elapsed());
            // The receiver lives as long as the agent.
            let _ = ended.send((task_key, outcome));
            changed.notify_one();
        });
        self.running.insert(key, task);
    }

    /// The extractions that ended since the last call, with the size of
    /// each extracted tree; failures are kept for their backoff.
    pub(crate) fn harvest(&mut self) -> Vec<(Digest, i64)> {
        // Each task sends its outcome before it finishes: once those
        // finished now are listed, the channel holds all of theirs.
        let finished: Vec<(Scope, Digest)> = self
            .running
            .iter()
            .filter(|(_, task)| task.is_finished())
            .map(|(key, _)| key.clone())
            .collect();
        let mut ended = Vec::new();
        while let Ok(outcome) = self.ended.1.try_recv() {
            ended.push(outcome);
        }
        // A finished task that sent nothing panicked.
        let lost: Vec<_> = finished
            .into_iter()
            .filter(|key| !ended.iter().any(|(k, _)| k == key))
            .collect();
        ended.extend(lost.into_iter().map(|key| {
            (
                key,
                Err("the extraction stopped without an answer".to_string()),
            )
        }));
        let mut extracted = Vec::new();
        for (key, outcome) in ended {
            self.running.remove(&key);
            let (scope, digest) = &key;
            let namespace = scope.as_deref().unwrap_or("");
            match outcome {
                Ok(size) => {
                    self.failures.succeeded(&key);
                    extracted.push((digest.clone(), size));
                }
                Err(why) => {
                    warn!(%digest, namespace, error = %why, "extraction failed");
                    self.failures.failed(&key, why);
                }
            }
        }
        extracted
    }
}

/// Bytes of regular files under `dir`.
pub(crate) fn tree_size(dir: &std::path::Path) -> i64 {
    let mut total = 0i64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => total += m.len() as i64,
                Err(_) => {}
            }
        }
    }
    total
}
