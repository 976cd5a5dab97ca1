//! The invariants the soak checks, each with its bound fixed before the
//! run, and the ledger of how often each was checked and where it first
//! failed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// How long a node may take to serve a cache again after a fault that
/// touched it (its kubelet, containerd, agent, CSI driver or GPU plugin).
pub const SERVE_AGAIN_WITHIN: Duration = Duration::from_secs(60);
/// How long every change may take to converge after the last fault.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(120);
/// The longest a running reader may go without a read.
pub const READ_GAP: Duration = Duration::from_secs(20);
/// How long a capture may take to end after its workload pod was created
/// or after the last fault since.
pub const CAPTURE_WITHIN: Duration = Duration::from_secs(120);
/// Store writes per stored change, outside fault windows.
pub const WRITES_PER_CHANGE: f64 = 1.0;
/// How much a daemon's RSS may grow between warm-up and the end.
pub const RSS_GROWTH: f64 = 0.20;

/// A named invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// Every read of a running pod hashes to a verified variant of its
    /// cache: never a partial or mixed tree.
    ReadsAreWholeVariants,
    /// A writable view takes the pod's writes and reads them back.
    WritableViewsTakeWrites,
    /// A running reader keeps reading (no gap over [`READ_GAP`]), whatever
    /// fails around it.
    RunningPodsKeepReading,
    /// A simulated node that holds a cache keeps reporting it on the node
    /// through faults that do not touch it.
    NodesKeepTheirCaches,
    /// A new pod on the real node reads a verified tree within
    /// [`SERVE_AGAIN_WITHIN`] of a fault that touched the node ending.
    NodeServesAgain,
    /// The system is healthy again (every change converged) within
    /// [`CONVERGE_WITHIN`] of each fault ending and of the last one.
    ChangesConverge,
    /// Nothing left at the end: mounts, overlays, uppers, temporary
    /// directories, Jobs, claims.
    NothingLeaks,
    /// Every capture ends within [`CAPTURE_WITHIN`]: `Complete` with
    /// exactly what its pod wrote, signed, or `Failed` only across a fault.
    CapturesEndWhole,
    /// Store writes per stored change outside fault windows at most
    /// [`WRITES_PER_CHANGE`].
    OneWritePerChange,
    /// Each daemon's final RSS within [`RSS_GROWTH`] of its RSS after
    /// warm-up.
    RssStaysFlat,
}

impl Check {
    /// Every check, in report order.
    pub const ALL: [Check; 10] = [
        Check::ReadsAreWholeVariants,
        Check::WritableViewsTakeWrites,
        Check::RunningPodsKeepReading,
        Check::NodesKeepTheirCaches,
        Check::NodeServesAgain,
        Check::ChangesConverge,
        Check::CapturesEndWhole,
        Check::NothingLeaks,
        Check::OneWritePerChange,
        Check::RssStaysFlat,
    ];

    /// The check's name, as reports show it.
    pub fn name(self) -> &'static str {
        match self {
            Check::ReadsAreWholeVariants => "reads-are-whole-variants",
            Check::WritableViewsTakeWrites => "writable-views-take-writes",
            Check::RunningPodsKeepReading => "running-pods-keep-reading",
            Check::NodesKeepTheirCaches => "nodes-keep-their-caches",
            Check::NodeServesAgain => "node-serves-again",
            Check::ChangesConverge => "changes-converge",
            Check::CapturesEndWhole => "captures-end-whole",
            Check::NothingLeaks => "nothing-leaks",
            Check::OneWritePerChange => "one-write-per-change",
            Check::RssStaysFlat => "rss-stays-flat",
        }
    }

    /// The bound, in words.
    pub fn bound(self) -> String {
        match self {
            Check::ReadsAreWholeVariants => "every read = one verified variant".into(),
            Check::WritableViewsTakeWrites => "every write reads back".into(),
            Check::RunningPodsKeepReading => format!("no gap over {}s", READ_GAP.as_secs()),
            Check::NodesKeepTheirCaches => "on the node at every sample".into(),
            Check::NodeServesAgain => {
                format!("within {}s of the fault", SERVE_AGAIN_WITHIN.as_secs())
            }
            Check::ChangesConverge => {
                format!("within {}s of the last fault", CONVERGE_WITHIN.as_secs())
            }
            Check::CapturesEndWhole => format!(
                "ends within {}s; Complete = what the pod wrote; Failed only under a fault",
                CAPTURE_WITHIN.as_secs()
            ),
            Check::NothingLeaks => "0 left at the end".into(),
            Check::OneWritePerChange => format!("<= {WRITES_PER_CHANGE:.1}"),
            Check::RssStaysFlat => format!("<= +{:.0}%", RSS_GROWTH * 100.0),
        }
    }
}

/// A check that failed.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    /// Seconds into the run.
    pub at_s: f64,
    /// What was seen.
    pub detail: String,
}

/// How one check fared.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckRecord {
    /// The bound it was held to.
    pub bound: String,
    /// How many times it was evaluated.
    pub runs: u64,
    /// How many evaluations failed.
    pub violations: u64,
    /// The first failure.
    pub first_violation: Option<Violation>,
}

/// Every check's record.
#[derive(Debug, Clone, Serialize)]
pub struct Ledger {
    checks: BTreeMap<&'static str, CheckRecord>,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new()
    }
}

impl Ledger {
    /// A ledger with every check at zero.
    pub fn new() -> Ledger {
        let checks = Check::ALL
            .iter()
            .map(|c| {
                (
                    c.name(),
                    CheckRecord {
                        bound: c.bound(),
                        ..CheckRecord::default()
                    },
                )
            })
            .collect();
        Ledger { checks }
    }

    /// Records one evaluation of `check`: passed, or failed with `detail`
    /// at `at_s` seconds into the run (printed at once).
    pub fn record(&mut self, check: Check, at_s: f64, outcome: Result<(), String>) {
        let record = self.checks.entry(check.name()).or_default();
        record.runs += 1;
        if let Err(detail) = outcome {
            eprintln!("soak: VIOLATION {} at {at_s:.1}s: {detail}", check.name());
            record.violations += 1;
            if record.first_violation.is_none() {
                record.first_violation = Some(Violation { at_s, detail });
            }
        }
    }

    /// The records, by check name.
    pub fn checks(&self) -> &BTreeMap<&'static str, CheckRecord> {
        &self.checks
    }

    /// Failed evaluations, all checks together.
    pub fn violations(&self) -> u64 {
        self.checks.values().map(|r| r.violations).sum()
    }

    /// Evaluations, all checks together.
    pub fn runs(&self) -> u64 {
        self.checks.values().map(|r| r.runs).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_violation_is_kept_and_every_run_counted() {
        let mut ledger = Ledger::new();
        ledger.record(Check::NothingLeaks, 1.0, Ok(()));
        ledger.record(Check::NothingLeaks, 2.0, Err("an upper".into()));
        ledger.record(Check::NothingLeaks, 3.0, Err("a mount".into()));
        let record = &ledger.checks()["nothing-leaks"];
        assert_eq!((record.runs, record.violations), (3, 2));
        assert_eq!(
            record.first_violation.as_ref().map(|v| v.detail.as_str()),
            Some("an upper")
        );
        assert_eq!(ledger.violations(), 2);
        assert_eq!(ledger.checks().len(), Check::ALL.len());
    }
}
