//! Pulling and extracting digests into the node store, off the agent's
//! loop: few at a time (so their memory does not add up), at most one per
//! namespace so that one tenant's slow registry cannot hold them all
//! ([`FairSlots`]), each within a total deadline and a byte budget its
//! namespace's and the node's caps leave it ([`Ledger`]), one that fetches
//! too slowly while other namespaces wait giving its slot up, cancelled
//! ([`crate::slot_yield`]), each failure tried again with backoff, the
//! loop woken when one ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gkm_oci::progress::Report;
use gkm_oci::{ExtractPolicy, Repo, Store};
use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::budget::{Caps, Decision, Grant, Ledger};
use crate::ended::take_ended;
use crate::metrics::AgentMetrics;
use crate::retry::Backoff;
use crate::slot_yield::{Pace, Slow, SlowExtraction};
use crate::slots::{FairSlots, Scope};
use gkm_core::Digest;

/// How many extractions run at once, whatever the namespaces.
const EXTRACTION_SLOTS: usize = 2;

/// How one extraction ended: the extracted tree's size, or why it failed.
type Ended = ((Scope, Digest), Result<i64, String>);

/// The byte caps' ledger, shared with the extractions, and a wake for
/// those waiting for others' grants to come back (each bounded by its own
/// extraction's deadline).
pub(crate) struct Budgets {
    ledger: Mutex<Ledger>,
    released: Notify,
}

impl Budgets {
    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `scope`'s extraction may write some bytes: its grant,
    /// or the cap that refuses it.
    async fn grant(self: &Arc<Self>, scope: &Scope) -> Result<Held, String> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.ledger().grant(scope) {
                Decision::Grant(grant) => {
                    return Ok(Held {
                        budgets: self.clone(),
                        grant,
                    });
                }
                Decision::Refuse(bound) => {
                    return Err(format!("refused before extracting: {bound}"));
                }
                Decision::Wait => {}
            }
            released.await;
        }
    }
}

/// A grant held by an extraction, given back when dropped.
struct Held {
    budgets: Arc<Budgets>,
    grant: Grant,
}

impl Held {
    /// Gives the grant back, `stored` (the digest and its bytes) now
    /// counting as stored.
    fn stored(self, digest: Digest, bytes: u64) {
        self.budgets
            .ledger()
            .ended(self.grant.id, Some((digest, bytes)));
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A no-op when `stored` gave it back already.
        self.budgets.ledger().ended(self.grant.id, None);
        self.budgets.released.notify_waiters();
    }
}

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
    /// The bytes each may write.
    budgets: Arc<Budgets>,
    /// How long one pull and extraction may take in all.
    deadline: Duration,
    /// When one gives its slot up to waiting ones.
    slow: SlowExtraction,
    /// Wakes the agent's loop when an extraction ends.
    changed: Arc<Notify>,
}

impl Extractions {
    /// Extractions into `store` under `policy` and `caps`, each within
    /// `deadline` and yielding its slot when `slow`, waking `changed` as
    /// each ends.
    pub(crate) fn new(
        store: Store,
        policy: ExtractPolicy,
        caps: Caps,
        deadline: Duration,
        slow: SlowExtraction,
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
            budgets: Arc::new(Budgets {
                ledger: Mutex::new(Ledger::new(caps)),
                released: Notify::new(),
            }),
            deadline,
            slow,
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

    /// To call just before listing the store ([`Ledger::mark`]).
    pub(crate) fn mark_listing(&self) -> u64 {
        self.budgets.ledger().mark()
    }

    /// What the store held when listed at `mark` ([`Ledger::stored`]).
    pub(crate) fn stored(
        &self,
        mark: u64,
        bytes: HashMap<Digest, u64>,
        uses: HashMap<Scope, std::collections::HashSet<Digest>>,
    ) {
        self.budgets.ledger().stored(mark, bytes, uses);
    }

    /// Records that `digest` could not even be started for `scope`.
    pub(crate) fn failed(&mut self, scope: &Scope, digest: &Digest, why: String) {
        self.failures.failed(&(scope.clone(), digest.clone()), why);
    }

    /// Pulls and extracts `digest` from `repo` (its manifest and layer) for
    /// a cache of `scope` in a task of its own, unless one is already under
    /// way.
    pub(crate) fn start(&mut self, scope: &Scope, repo: Repo, digest: Digest) {
        let key = (scope.clone(), digest);
        if self.running.contains_key(&key) {
            return;
        }
        let store = self.store.clone();
        let policy = self.policy.clone();
        let slots = self.slots.clone();
        let budgets = self.budgets.clone();
        let changed = self.changed.clone();
        let metrics = self.metrics.clone();
        let what = key.1.clone();
        let (deadline, ended, task_key) = (self.deadline, self.ended.0.clone(), key.clone());
        let slow = self.slow;
        let task = tokio::spawn(async move {
            let slot = slots.acquire(&task_key.0).await;
            // Granted with the slot, so that a namespace's queued
            // extractions each see what the one before stored.
            let held = budgets.grant(&task_key.0).await;
            let started = Instant::now();
            let fetched = Arc::new(Fetched::default());
            let progress: gkm_oci::Progress = fetched.clone();
            let work = async {
                let held = held?;
                let mut policy = policy;
                policy.byte_budget = match (policy.byte_budget, held.grant.budget) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                let stored = store
                    .ensure(&repo, &policy, Some(progress))
                    .await
                    .map_err(|e| over_budget(&e, &held.grant))?;
                // What extraction wrote it counted; a digest another
                // extraction stored first is measured on disk.
                let (size, usage) = match stored.extracted {
                    Some(stats) => (stats.bytes as i64, stats.disk_bytes),
                    None => {
                        let path = stored.path.clone();
                        let (size, usage) = tokio::task::spawn_blocking(move || {
                            (tree_size(&path), gkm_oci::tree_usage(&path))
                        })
                        .await
                        .map_err(|e| format!("measuring the extracted tree: {e}"))?;
                        let usage =
                            usage.map_err(|e| format!("measuring the extracted tree: {e}"))?;
                        (size, usage)
                    }
                };
                held.stored(what.clone(), usage);
                info!(digest = %what, bytes = size, elapsed = ?started.elapsed(), "extracted");
                Ok(size)
            };
            // Either ending drops the other: a yield cancels the extraction
            // (nothing of it is kept), its grant given back.
            let outcome = tokio::select! {
                biased;
                outcome = tokio::time::timeout(deadline, work) => outcome.unwrap_or_else(|_| {
                    Err(format!(
                        "pulling and extracting took longer than {}s",
                        deadline.as_secs_f64()
                    ))
                }),
                why = until_slow(slow, &fetched, &slots) => {
                    let namespace = task_key.0.as_deref().unwrap_or("");
                    warn!(
                        digest = %task_key.1, namespace, reason = Slow::REASON, %why,
                        "gave the extraction slot up to waiting extractions; trying again later"
                    );
                    metrics.slot_yielded(Slow::REASON);
                    Err(format!("gave its extraction slot up: {why}"))
                }
            };
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
        let ended = take_ended(
            &mut self.running,
            &mut self.ended.1,
            "the extraction stopped without an answer",
        );
        let mut extracted = Vec::new();
        for (key, outcome) in ended {
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

/// The bytes an extraction fetched so far, from its progress: the layer's
/// compressed bytes, over each try (a mirror that failed, then the next).
#[derive(Default)]
struct Fetched {
    /// Bytes of the steps before the current one.
    before: AtomicU64,
    /// Bytes of the current step.
    current: AtomicU64,
    /// Whether the current step fetches nothing (storing the tree).
    fetched_all: AtomicBool,
}

impl Fetched {
    fn total(&self) -> u64 {
        self.before
            .load(Ordering::Relaxed)
            .saturating_add(self.current.load(Ordering::Relaxed))
    }
}

impl Report for Fetched {
    fn step(&self, _: &str, total: Option<u64>) {
        let done = self.current.swap(0, Ordering::Relaxed);
        self.before.fetch_add(done, Ordering::Relaxed);
        self.fetched_all.store(total.is_none(), Ordering::Relaxed);
    }

    fn bytes(&self, done: u64) {
        self.current.store(done, Ordering::Relaxed);
    }
}

/// Samples `fetched` until the extraction is too slow to keep its slot
/// while other namespaces' extractions wait for one ([`Pace`]); never
/// returns when it is not.
async fn until_slow(rule: SlowExtraction, fetched: &Fetched, slots: &FairSlots) -> Slow {
    let mut pace = Pace::new(rule, Instant::now());
    let mut ticks = tokio::time::interval(pace.every());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = Instant::now();
        pace.sample(
            now,
            fetched.total(),
            fetched.fetched_all.load(Ordering::Relaxed),
        );
        if let Some(slow) = pace.check(now, slots.waiting()) {
            return slow;
        }
    }
}

/// Why an extraction failed: `e`, and when it stopped at the budget its
/// grant gave it, the cap that set that budget.
fn over_budget(e: &gkm_oci::Error, grant: &Grant) -> String {
    match (e.space_exceeded().map(|s| &s.limit), &grant.bound) {
        (Some(gkm_oci::SpaceLimit::Budget { .. }), Some(bound)) => format!("{e}; {bound}"),
        _ => e.to_string(),
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
