//! Exact answer times of the extender's verbs, for `GET
//! /scheduler/latency`: the most recent calls of each verb are kept (a
//! bounded ring, [`KEPT`] per verb) and their quantiles computed on
//! request, so a benchmark reads the real p50 and p99 rather than the bound
//! of a histogram bucket.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

/// How many of a verb's most recent answer times are kept.
pub const KEPT: usize = 100_000;

/// A verb's answer times, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantiles {
    /// Calls counted (at most [`KEPT`], the most recent).
    pub count: usize,
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The slowest.
    pub max: f64,
}

/// The most recent answer times per verb.
#[derive(Debug, Default)]
pub struct Samples {
    per_verb: BTreeMap<String, VecDeque<f64>>,
}

impl Samples {
    /// Records that `verb` answered in `seconds`.
    pub fn record(&mut self, verb: &str, seconds: f64) {
        let kept = match self.per_verb.get_mut(verb) {
            Some(kept) => kept,
            None => self.per_verb.entry(verb.to_string()).or_default(),
        };
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(seconds);
    }

    /// The quantiles of each verb that answered.
    pub fn quantiles(&self) -> BTreeMap<String, Quantiles> {
        self.per_verb
            .iter()
            .filter_map(|(verb, kept)| Some((verb.clone(), quantiles(kept.iter().copied())?)))
            .collect()
    }
}

/// p50, p99 and the maximum of `times` (nearest rank: the smallest time at
/// least that share of calls took no longer than); `None` when empty.
pub fn quantiles(times: impl Iterator<Item = f64>) -> Option<Quantiles> {
    let mut sorted: Vec<f64> = times.collect();
    sorted.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        // Nearest rank: ceil(q * n), 1-based.
        let n = sorted.len() as f64;
        let r = (q * n).ceil().max(1.0) as usize;
        sorted.get(r - 1).copied()
    };
    Some(Quantiles {
        count: sorted.len(),
        p50: rank(0.5)?,
        p99: rank(0.99)?,
        max: *sorted.last()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let times = (1..=200).map(f64::from);
        let q = quantiles(times).expect("some");
        assert_eq!((q.count, q.p50, q.p99, q.max), (200, 100.0, 198.0, 200.0));
        let one = quantiles([0.5].into_iter()).expect("one");
        assert_eq!((one.p50, one.p99, one.max), (0.5, 0.5, 0.5));
        assert_eq!(quantiles(std::iter::empty()), None);
    }

    #[test]
    fn only_the_most_recent_calls_are_kept() {
        let mut samples = Samples::default();
        for _ in 0..KEPT {
            samples.record("filter", 1.0);
        }
        for _ in 0..KEPT / 2 + 1 {
            samples.record("filter", 0.001);
        }
        samples.record("bind", 0.01);
        let all = samples.quantiles();
        assert_eq!(all["filter"].count, KEPT);
        assert_eq!(all["filter"].p50, 0.001);
        assert_eq!(all["filter"].max, 1.0);
        assert_eq!(all["bind"].count, 1);
    }
}
