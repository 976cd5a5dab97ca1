//! What a soak run publishes: faults injected by kind with their recovery
//! times, checks run, violations with their first occurrence; as JSON and
//! as the Markdown table of docs/benchmarks.md.

use std::collections::BTreeMap;

use serde::Serialize;

use super::invariants::Ledger;

/// Recovery samples needed before a p99 means something.
pub const P99_FROM: usize = 20;

/// Recovery times of one fault kind.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Recovery {
    /// Faults of this kind injected.
    pub count: usize,
    /// Of those, the ones the system did not recover from within the
    /// bound (no recovery time; a violation names each).
    pub unrecovered: usize,
    /// Median recovery, seconds.
    pub median_s: Option<f64>,
    /// Slowest recovery, seconds.
    pub max_s: Option<f64>,
    /// 99th percentile, from [`P99_FROM`] samples up.
    pub p99_s: Option<f64>,
}

impl Recovery {
    /// The statistics of `injected` faults of which `samples` (seconds)
    /// recovered.
    pub fn of(injected: usize, samples: &[f64]) -> Recovery {
        let unrecovered = injected.saturating_sub(samples.len());
        if samples.is_empty() {
            return Recovery {
                count: injected,
                unrecovered,
                median_s: None,
                max_s: None,
                p99_s: None,
            };
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        let p99 = (n >= P99_FROM).then(|| {
            let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
            sorted[rank - 1]
        });
        Recovery {
            count: injected.max(n),
            unrecovered,
            median_s: Some(median),
            max_s: Some(sorted[n - 1]),
            p99_s: p99,
        }
    }
}

/// A run's summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The seed (`SEED=` replays the run).
    pub seed: u64,
    /// Seconds of faults asked for.
    pub duration_s: u64,
    /// Seconds the run took, stack start to teardown check.
    pub wall_s: f64,
    /// Faults injected, all kinds.
    pub faults_injected: usize,
    /// Per fault kind, recovery times.
    pub recovery: BTreeMap<String, Recovery>,
    /// Checks evaluated, all together.
    pub checks_run: u64,
    /// Failed evaluations, all together.
    pub violations: u64,
    /// Per check: bound, runs, violations, first occurrence.
    pub checks: Ledger,
    /// What the workload did, by action.
    pub workload: BTreeMap<String, u64>,
}

impl Summary {
    /// The Markdown tables of this summary (faults, then checks).
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Seed `{}`, {} s of faults ({:.0} s in all), {} faults, {} checks run, {} violations.\n\n",
            self.seed,
            self.duration_s,
            self.wall_s,
            self.faults_injected,
            self.checks_run,
            self.violations
        );
        out.push_str(
            "| fault | count | not recovered | median recovery (s) | max (s) | p99 (s) |\n",
        );
        out.push_str("| --- | ---: | ---: | ---: | ---: | ---: |\n");
        let shown = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{s:.1}"));
        for (kind, r) in &self.recovery {
            out.push_str(&format!(
                "| {kind} | {} | {} | {} | {} | {} |\n",
                r.count,
                r.unrecovered,
                shown(r.median_s),
                shown(r.max_s),
                shown(r.p99_s)
            ));
        }
        out.push_str("\n| check | bound | runs | violations | first |\n");
        out.push_str("| --- | --- | ---: | ---: | --- |\n");
        for (name, record) in self.checks.checks() {
            let first = record
                .first_violation
                .as_ref()
                .map_or("-".to_string(), |v| {
                    format!("{:.0} s: {}", v.at_s, v.detail)
                });
            out.push_str(&format!(
                "| {name} | {} | {} | {} | {first} |\n",
                record.bound, record.runs, record.violations
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_max_always_p99_only_from_twenty_samples() {
        let few = Recovery::of(5, &[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(
            (few.count, few.unrecovered, few.median_s, few.max_s),
            (5, 1, Some(2.5), Some(10.0))
        );
        assert_eq!(few.p99_s, None);
        let many: Vec<f64> = (1..=20).map(f64::from).collect();
        let r = Recovery::of(20, &many);
        assert_eq!(
            (r.median_s, r.max_s, r.p99_s),
            (Some(10.5), Some(20.0), Some(20.0))
        );
        let none = Recovery::of(2, &[]);
        assert_eq!((none.count, none.unrecovered, none.median_s), (2, 2, None));
    }
}
