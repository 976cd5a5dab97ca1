//! When an extraction gives its slot up: one that fetched less than a
//! minimum rate over a window while other namespaces' extractions wait for
//! a slot, so that a tenant's slow or trickling registries hold the node's
//! few extraction slots for a window, not for the whole extraction
//! deadline. The extraction is then cancelled, keeping nothing, and tried
//! again with backoff, behind the extractions that waited.
//!
//! An extraction that is slow while none waits keeps its slot: a slow
//! network alone does not stop a large image from being extracted. Nor
//! does one whose bytes are all fetched (it is storing its tree).
//!
//! Pure: [`Pace`] is fed with the bytes fetched so far and the time, and
//! says whether to yield and why; the extractions sample and cancel.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant};

/// The rate under which an extraction gives its slot up to waiting ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlowExtraction {
    /// The fewest bytes per second an extraction must fetch, over
    /// [`SlowExtraction::window`], to keep its slot while other namespaces' extractions wait; `0`
    /// for never yielding.
    pub min_bytes_per_second: u64,
    /// How long the rate is measured over (and how long an extraction
    /// keeps its slot at least).
    pub window: Duration,
}

impl SlowExtraction {
    /// 1 MiB/s over 30 s.
    pub const DEFAULT: SlowExtraction = SlowExtraction {
        min_bytes_per_second: 1 << 20,
        window: Duration::from_secs(30),
    };

    /// Whether extractions ever yield under this rule.
    fn enabled(&self) -> bool {
        self.min_bytes_per_second > 0 && !self.window.is_zero()
    }
}

impl Default for SlowExtraction {
    fn default() -> Self {
        SlowExtraction::DEFAULT
    }
}

/// Why an extraction gave its slot up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slow {
    /// Bytes fetched over the window.
    pub(crate) fetched: u64,
    /// The rule it fell short of.
    pub(crate) rule: SlowExtraction,
}

impl Slow {
    /// The reason, as the yield metric labels it.
    pub(crate) const REASON: &'static str = "slower_than_min_rate";
}

impl fmt::Display for Slow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fetched {} bytes in the last {}s, slower than {} bytes/s, while other namespaces' extractions waited for a slot",
            self.fetched,
            self.rule.window.as_secs_f64(),
            self.rule.min_bytes_per_second
        )
    }
}

/// The pace of one extraction that holds a slot.
#[derive(Debug)]
pub(crate) struct Pace {
    rule: SlowExtraction,
    started: Instant,
    /// When, and the bytes fetched by then, oldest first: from the last one
    /// at or before the window's start.
    samples: VecDeque<(Instant, u64)>,
    /// Whether its bytes are all fetched (it is storing its tree).
    fetched_all: bool,
}

impl Pace {
    /// An extraction that got its slot at `now`, judged by `rule`.
    pub(crate) fn new(rule: SlowExtraction, now: Instant) -> Pace {
        Pace {
            rule,
            started: now,
            samples: VecDeque::from([(now, 0)]),
            fetched_all: false,
        }
    }

    /// How often to sample: a tenth of the window, between 100 ms and 5 s.
    pub(crate) fn every(&self) -> Duration {
        (self.rule.window / 10).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// At `now`, `fetched` bytes are fetched in all; `fetched_all` once no
    /// more are to come.
    pub(crate) fn sample(&mut self, now: Instant, fetched: u64, fetched_all: bool) {
        self.fetched_all = fetched_all;
        if self.samples.back().is_none_or(|(when, _)| *when <= now) {
            self.samples.push_back((now, fetched));
        }
    }

    /// Whether the extraction gives its slot up at `now`, while `waiting`
    /// other extractions wait for one, and why.
    pub(crate) fn check(&mut self, now: Instant, waiting: usize) -> Option<Slow> {
        if !self.rule.enabled() || self.fetched_all || waiting == 0 {
            return None;
        }
        let start = now.checked_sub(self.rule.window)?;
        if start < self.started {
            return None;
        }
        // Forget what is older than the last sample at the window's start.
        while self.samples.get(1).is_some_and(|(when, _)| *when <= start) {
            self.samples.pop_front();
        }
        let (_, then) = *self.samples.front()?;
        let (_, latest) = *self.samples.back()?;
        let fetched = latest.saturating_sub(then);
        let wanted = self.rule.min_bytes_per_second as f64 * self.rule.window.as_secs_f64();
        ((fetched as f64) < wanted).then_some(Slow {
            fetched,
            rule: self.rule,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A pace sampled every second from `t0`, `rate(second)` bytes fetched
    /// each second, up to `until` seconds.
    fn paced(t0: Instant, until: u64, rate: impl Fn(u64) -> u64) -> Pace {
        let mut pace = Pace::new(SlowExtraction::DEFAULT, t0);
        let mut fetched = 0;
        for second in 1..=until {
            fetched += rate(second);
            pace.sample(t0 + secs(second), fetched, false);
        }
        pace
    }

    #[test]
    fn a_trickling_extraction_yields_after_the_window_while_others_wait() {
        let t0 = Instant::now();
        let mut pace = paced(t0, 29, |_| 5);
        // Not before a whole window, however slow.
        assert_eq!(pace.check(t0 + secs(29), 1), None);
        let mut pace = paced(t0, 30, |_| 5);
        let slow = pace.check(t0 + secs(30), 1).expect("yields");
        assert_eq!(slow.fetched, 150);
        assert_eq!(
            slow.to_string(),
            "fetched 150 bytes in the last 30s, slower than 1048576 bytes/s, while other namespaces' extractions waited for a slot"
        );
    }

    #[test]
    fn a_slow_extraction_keeps_its_slot_while_none_waits() {
        let t0 = Instant::now();
        let mut pace = paced(t0, 120, |_| 5);
        assert_eq!(pace.check(t0 + secs(120), 0), None);
        // Once another waits, it yields.
        assert!(pace.check(t0 + secs(120), 1).is_some());
    }

    #[test]
    fn a_fast_extraction_keeps_its_slot() {
        let t0 = Instant::now();
        let mut pace = paced(t0, 60, |_| 2 * MIB);
        assert_eq!(pace.check(t0 + secs(60), 5), None);
    }

    #[test]
    fn only_the_last_window_counts() {
        let t0 = Instant::now();
        // Fast for a minute, then stalled for a whole window.
        let mut pace = paced(t0, 90, |s| if s <= 60 { 4 * MIB } else { 0 });
        assert_eq!(pace.check(t0 + secs(60), 1), None);
        let slow = pace.check(t0 + secs(90), 1).expect("stalled for a window");
        assert_eq!(slow.fetched, 0);
        // Stalled, then fast again: judged on the window just ended.
        let mut pace = paced(t0, 90, |s| if s <= 60 { 0 } else { 2 * MIB });
        assert_eq!(pace.check(t0 + secs(90), 1), None);
        // Samples older than the window are let go.
        assert!(
            pace.samples.len() <= 31,
            "{} samples kept",
            pace.samples.len()
        );
    }

    #[test]
    fn an_extraction_storing_its_tree_keeps_its_slot() {
        let t0 = Instant::now();
        let mut pace = paced(t0, 40, |_| 5);
        pace.sample(t0 + secs(41), 200, true);
        assert_eq!(pace.check(t0 + secs(41), 1), None);
    }

    #[test]
    fn a_rate_of_zero_never_yields() {
        let t0 = Instant::now();
        let rule = SlowExtraction {
            min_bytes_per_second: 0,
            ..SlowExtraction::DEFAULT
        };
        let mut pace = Pace::new(rule, t0);
        pace.sample(t0 + secs(100), 0, false);
        assert_eq!(pace.check(t0 + secs(100), 3), None);
    }

    #[test]
    fn samples_every_tenth_of_the_window_within_bounds() {
        let t0 = Instant::now();
        let pace = |window| {
            Pace::new(
                SlowExtraction {
                    window,
                    ..SlowExtraction::DEFAULT
                },
                t0,
            )
            .every()
        };
        assert_eq!(pace(secs(30)), secs(3));
        assert_eq!(pace(Duration::from_millis(200)), Duration::from_millis(100));
        assert_eq!(pace(secs(600)), secs(5));
    }
}
