//! Reading images' manifests and configs (their cache summaries) off the
//! agent's pass: each read runs in a task of its own under a total
//! deadline, in fair slots shared between namespaces ([`FairSlots`]), and
//! wakes the agent when it ends. A registry that answers slowly, even one
//! byte at a time within every per-read timeout, delays only its own
//! caches, and at most for the deadline.
//!
//! Reads are keyed by namespace and digest: a cache in another namespace
//! that names the same digest on a slower registry does not make this
//! namespace's read wait for it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gkm_core::cache::Summary;
use gkm_oci::{Digest, Image, Repo};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::ended::take_ended;
use crate::metrics::AgentMetrics;
use crate::retry::Backoff;
use crate::slots::{FairSlots, Scope};

/// How many reads run at once, whatever the namespaces.
const READ_SLOTS: usize = 4;

/// Which read: whose cache it is for, and the digest.
type ReadKey = (Scope, Digest);

/// A summary read that succeeded: the image and its summary.
pub(crate) struct ReadImage {
    /// The image's manifest and config.
    pub(crate) image: Image,
    /// Its cache summary.
    pub(crate) summary: Summary,
}

/// How one read ended.
type Ended = (ReadKey, Result<ReadImage, String>);

/// The summary reads under way and those that failed.
pub(crate) struct SummaryReads {
    running: HashMap<ReadKey, JoinHandle<()>>,
    /// Each read sends its outcome here before it wakes the agent, so the
    /// pass it wakes finds it.
    ended: (UnboundedSender<Ended>, UnboundedReceiver<Ended>),
    failures: Backoff<ReadKey>,
    slots: Arc<FairSlots>,
    deadline: Duration,
    metrics: AgentMetrics,
    changed: Arc<Notify>,
}

impl SummaryReads {
    /// Reads that each end within `deadline`, waking `changed` as they end.
    pub(crate) fn new(deadline: Duration, metrics: AgentMetrics, changed: Arc<Notify>) -> Self {
        SummaryReads {
            running: HashMap::new(),
            ended: unbounded_channel(),
            failures: Backoff::default(),
            slots: Arc::new(FairSlots::new(READ_SLOTS)),
            deadline,
            metrics,
            changed,
        }
    }

    /// Reads `digest` from `repo` for a cache of `scope`, unless that read is
    /// under way.
    pub(crate) fn start(&mut self, scope: &Scope, repo: Repo, digest: &Digest) {
        let key = (scope.clone(), digest.clone());
        if self.running.contains_key(&key) {
            return;
        }
        let (slots, deadline, changed) = (self.slots.clone(), self.deadline, self.changed.clone());
        let ended = self.ended.0.clone();
        let task_key = key.clone();
        let task = tokio::spawn(async move {
            let slot = slots.acquire(&task_key.0).await;
            let read = tokio::time::timeout(deadline, read(&repo))
                .await
                .unwrap_or_else(|_| {
                    Err(format!(
                        "the registry did not send the manifest and config within {}s",
                        deadline.as_secs_f64()
                    ))
                });
            drop(slot);
            // The receiver lives as long as the agent.
            let _ = ended.send((task_key, read));
            changed.notify_one();
        });
        self.running.insert(key, task);
    }

    /// Records that the read of `digest` for `scope` could not be started.
    pub(crate) fn failed(&mut self, scope: &Scope, digest: &Digest, why: String) {
        self.failures.failed(&(scope.clone(), digest.clone()), why);
    }

    /// Whether the read of `digest` for `scope` is under way.
    pub(crate) fn is_running(&self, scope: &Scope, digest: &Digest) -> bool {
        self.running.contains_key(&(scope.clone(), digest.clone()))
    }

    /// Why the read of `digest` for `scope` failed, while it waits to be
    /// tried again.
    pub(crate) fn waiting(&self, scope: &Scope, digest: &Digest) -> Option<String> {
        self.failures.waiting(&(scope.clone(), digest.clone()))
    }

    /// When a failed read is due to be tried again.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.failures.next_due()
    }

    /// The reads that ended since the last call and succeeded; failures are
    /// kept for their backoff.
    pub(crate) fn harvest(&mut self) -> Vec<(Digest, ReadImage)> {
        let ended = take_ended(
            &mut self.running,
            &mut self.ended.1,
            "the read stopped without an answer",
        );
        let mut read = Vec::new();
        for (key, outcome) in ended {
            self.metrics.summary_read(outcome.is_ok());
            match outcome {
                Ok(image) => {
                    self.failures.succeeded(&key);
                    read.push((key.1, image));
                }
                Err(why) => {
                    let (scope, digest) = &key;
                    warn!(%digest, namespace = scope.as_deref().unwrap_or(""), error = %why, "reading the image summary failed");
                    self.failures.failed(&key, why);
                }
            }
        }
        read
    }
}

/// Reads the image's manifest and config, and its summary from them.
async fn read(repo: &Repo) -> Result<ReadImage, String> {
    let image = Image::fetch(repo).await.map_err(|e| e.to_string())?;
    let summary = image.cache().map_err(|e| e.to_string())?.summary;
    Ok(ReadImage { image, summary })
}
