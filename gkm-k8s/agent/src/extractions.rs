//! Pulling and extracting digests into the node store, off the agent's
//! loop: one at a time (so their memory never adds up), each failure tried
//! again with backoff, the loop woken when one ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use gkm_oci::{ExtractPolicy, Image, Repo, Store};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::metrics::AgentMetrics;
use crate::retry::Backoff;
use gkm_core::Digest;

/// The extractions under way and those that failed.
pub(crate) struct Extractions {
    store: Store,
    policy: ExtractPolicy,
    metrics: AgentMetrics,
    /// Under way, by digest; each yields the extracted tree's size.
    running: HashMap<Digest, JoinHandle<Result<i64, String>>>,
    /// Extractions that failed, tried again with backoff.
    failures: Backoff,
    /// One extraction at a time.
    slots: Arc<Semaphore>,
    /// Wakes the agent's loop when an extraction ends.
    changed: Arc<Notify>,
}

impl Extractions {
    /// Extractions into `store` under `policy`, waking `changed` as each ends.
    pub(crate) fn new(
        store: Store,
        policy: ExtractPolicy,
        metrics: AgentMetrics,
        changed: Arc<Notify>,
    ) -> Extractions {
        Extractions {
            store,
            policy,
            metrics,
            running: HashMap::new(),
            failures: Backoff::default(),
            slots: Arc::new(Semaphore::new(1)),
            changed,
        }
    }

    /// Whether `digest` is being extracted.
    pub(crate) fn is_running(&self, digest: &Digest) -> bool {
        self.running.contains_key(digest)
    }

    /// The digests being extracted.
    pub(crate) fn running(&self) -> impl Iterator<Item = &Digest> {
        self.running.keys()
    }

    /// Why `digest` failed, while it waits to be tried again.
    pub(crate) fn waiting(&self, digest: &Digest) -> Option<String> {
        self.failures.waiting(digest)
    }

    /// When a failed extraction is due to be tried again.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.failures.next_due()
    }

    /// Records that `digest` could not even be started.
    pub(crate) fn failed(&mut self, digest: &Digest, why: String) {
        self.failures.failed(digest, why);
    }

    /// Pulls and extracts `digest` from `repo` in a task of its own, unless
    /// one is already under way; `known` is the image the summary came
    /// from, so its manifest and config are not read again.
    pub(crate) fn start(&mut self, repo: Repo, digest: Digest, known: Option<Arc<Image>>) {
        if self.running.contains_key(&digest) {
            return;
        }
        let store = self.store.clone();
        let policy = self.policy.clone();
        let slots = self.slots.clone();
        let changed = self.changed.clone();
        let metrics = self.metrics.clone();
        let what = digest.clone();
        let task = tokio::spawn(async move {
            let outcome = match slots.acquire_owned().await {
                Err(e) => Err(e.to_string()),
                Ok(_slot) => {
                    let started = Instant::now();
                    let outcome = async {
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
                    }
                    .await;
                    metrics.extraction(outcome.is_ok(), started.elapsed());
                    outcome
                }
            };
            changed.notify_one();
            outcome
        });
        self.running.insert(digest, task);
    }

    /// The extractions that ended since the last call, with the size of
    /// each extracted tree; failures are kept for their backoff.
    pub(crate) async fn harvest(&mut self) -> Vec<(Digest, i64)> {
        let ended: Vec<Digest> = self
            .running
            .iter()
            .filter(|(_, task)| task.is_finished())
            .map(|(digest, _)| digest.clone())
            .collect();
        let mut extracted = Vec::new();
        for digest in ended {
            let Some(task) = self.running.remove(&digest) else {
                continue;
            };
            match task.await {
                Ok(Ok(size)) => {
                    self.failures.succeeded(&digest);
                    extracted.push((digest, size));
                }
                Ok(Err(why)) => {
                    warn!(%digest, error = %why, "extraction failed");
                    self.failures.failed(&digest, why);
                }
                Err(e) => {
                    warn!(%digest, error = %e, "extraction task failed");
                    self.failures.failed(&digest, e.to_string());
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
