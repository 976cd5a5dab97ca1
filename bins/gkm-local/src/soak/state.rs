//! What the workload, the fault injector and the checks share: the truth
//! of each cache (what readers may see, where it must be held), the
//! readers, the fault windows, the ledger and the workload's counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::invariants::{Check, Ledger};

/// What is true of one cache.
#[derive(Debug, Clone, Default)]
pub struct CacheTruth {
    /// The digest its tag points at now (the index's, for a multi-target one).
    pub latest: String,
    /// When the tag last moved.
    pub changed_at: Option<Instant>,
    /// Whether the latest change converged.
    pub converged: bool,
    /// Whether its failing to converge was reported already.
    pub reported: bool,
    /// The nodes that must hold it.
    pub nodes: Vec<String>,
    /// Whether it is delivered through a claim, which must be filled with
    /// the latest digest.
    pub claim: bool,
    /// The verified paths readers hash.
    pub paths: Vec<String>,
    /// Every fingerprint of a variant pushed for the real node.
    pub fingerprints: BTreeSet<String>,
}

/// A reader pod.
#[derive(Debug, Clone)]
pub struct Reader {
    /// The pod's name.
    pub name: String,
    /// The cache it mounts.
    pub cache: String,
    /// Whether its view is writable.
    pub writable: bool,
    /// Its log of reads, on the host.
    pub log: PathBuf,
    /// When it was created.
    pub created: Instant,
    /// Lines of its log already checked.
    pub checked: usize,
    /// Unix time of its last read.
    pub last_read: Option<u64>,
    /// Whether its first read was checked against the serve-again bound.
    pub served: bool,
    /// Whether it was deleted.
    pub retired: bool,
    /// Whether a gap in its reads was reported already.
    pub gap_reported: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            name: String::new(),
            cache: String::new(),
            writable: false,
            log: PathBuf::new(),
            created: Instant::now(),
            checked: 0,
            last_read: None,
            served: false,
            retired: false,
            gap_reported: false,
        }
    }
}

/// A capture of the workload ([`super::captures`]).
#[derive(Debug, Clone)]
pub struct CaptureRun {
    /// The capture's name, and its workload pod's.
    pub name: String,
    /// When its workload pod was created.
    pub created: Instant,
    /// Whether it was checked to its end.
    pub ended: bool,
}

/// A fault, from its injection to its end (when it is healed or the
/// killed process is running again).
#[derive(Debug, Clone)]
pub struct Window {
    /// The fault kind.
    pub kind: String,
    /// Whether it touches the real node's serving path.
    pub touches_real_node: bool,
    /// The simulated node it touches, if one.
    pub touches_node: Option<String>,
    /// Whether the apiserver is unreachable during it.
    pub blinds_apiserver: bool,
    /// When it began.
    pub began: Instant,
    /// When it ended; `None` while it lasts.
    pub ended: Option<Instant>,
}

/// The soak's shared state.
pub struct Shared {
    /// When the run began.
    pub began: Instant,
    ledger: Mutex<Ledger>,
    caches: Mutex<BTreeMap<String, CacheTruth>>,
    readers: Mutex<Vec<Reader>>,
    captures: Mutex<Vec<CaptureRun>>,
    windows: Mutex<Vec<Window>>,
    counts: Mutex<BTreeMap<String, u64>>,
    names: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

impl Shared {
    /// Empty state; the run begins now.
    pub fn new() -> Shared {
        Shared {
            began: Instant::now(),
            ledger: Mutex::new(Ledger::new()),
            caches: Mutex::new(BTreeMap::new()),
            readers: Mutex::new(Vec::new()),
            captures: Mutex::new(Vec::new()),
            windows: Mutex::new(Vec::new()),
            counts: Mutex::new(BTreeMap::new()),
            names: Mutex::new(0),
        }
    }

    /// Seconds since the run began.
    pub fn elapsed_s(&self) -> f64 {
        self.began.elapsed().as_secs_f64()
    }

    /// Records one evaluation of `check`.
    pub fn record(&self, check: Check, outcome: Result<(), String>) {
        let at = self.elapsed_s();
        lock(&self.ledger).record(check, at, outcome);
    }

    /// The ledger, as it stands.
    pub fn ledger(&self) -> Ledger {
        lock(&self.ledger).clone()
    }

    /// The caches' truth.
    pub fn caches(&self) -> MutexGuard<'_, BTreeMap<String, CacheTruth>> {
        lock(&self.caches)
    }

    /// The readers.
    pub fn readers(&self) -> MutexGuard<'_, Vec<Reader>> {
        lock(&self.readers)
    }

    /// Counts one `action` of the workload.
    pub fn count(&self, action: &str) {
        *lock(&self.counts).entry(action.to_string()).or_default() += 1;
    }

    /// The workload's counts.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.counts).clone()
    }

    /// A fresh pod name, `<prefix>-<n>`.
    pub fn next_name(&self, prefix: &str) -> String {
        let mut n = lock(&self.names);
        *n += 1;
        format!("{prefix}-{n}")
    }

    /// Adds a reader.
    pub fn add_reader(&self, reader: Reader) {
        lock(&self.readers).push(reader);
    }

    /// The readers not deleted, oldest first (probes excluded).
    pub fn live_readers(&self) -> Vec<String> {
        lock(&self.readers)
            .iter()
            .filter(|r| !r.retired && r.name.starts_with("reader-"))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Marks reader `name` deleted.
    pub fn retire_reader(&self, name: &str) {
        for r in lock(&self.readers).iter_mut().filter(|r| r.name == name) {
            r.retired = true;
        }
    }

    /// Adds a capture.
    pub fn add_capture(&self, capture: CaptureRun) {
        lock(&self.captures).push(capture);
    }

    /// The captures not yet checked to their end.
    pub fn open_captures(&self) -> Vec<CaptureRun> {
        lock(&self.captures)
            .iter()
            .filter(|c| !c.ended)
            .cloned()
            .collect()
    }

    /// Marks capture `name` checked to its end.
    pub fn end_capture(&self, name: &str) {
        for c in lock(&self.captures).iter_mut().filter(|c| c.name == name) {
            c.ended = true;
        }
    }

    /// Opens a fault window; returns its index.
    pub fn open_window(&self, window: Window) -> usize {
        let mut windows = lock(&self.windows);
        windows.push(window);
        windows.len() - 1
    }

    /// Closes window `index` now.
    pub fn close_window(&self, index: usize) {
        if let Some(w) = lock(&self.windows).get_mut(index) {
            w.ended = Some(Instant::now());
        }
    }

    /// The windows so far.
    pub fn windows(&self) -> Vec<Window> {
        lock(&self.windows).clone()
    }

    /// Whether a window matching `touches` is open or ended less than
    /// `settle` ago.
    pub fn fault_near(&self, settle: Duration, touches: impl Fn(&Window) -> bool) -> bool {
        lock(&self.windows)
            .iter()
            .any(|w| touches(w) && w.ended.is_none_or(|ended| ended.elapsed() < settle))
    }

    /// When the last window matching `touches` ended (now if one is open).
    pub fn last_fault_end(&self, touches: impl Fn(&Window) -> bool) -> Option<Instant> {
        lock(&self.windows)
            .iter()
            .filter(|w| touches(w))
            .map(|w| w.ended.unwrap_or_else(Instant::now))
            .max()
    }

    /// Whether any window overlaps `from..to`.
    pub fn any_fault_between(&self, from: Instant, to: Instant) -> bool {
        lock(&self.windows)
            .iter()
            .any(|w| w.began <= to && w.ended.is_none_or(|e| e >= from))
    }
}
