//! When the node's reports are written: the releases of many caches arrive
//! over time (the operator resolves and verifies them one by one), and a
//! write for each would have a thousand agents write their reports a dozen
//! times while a cluster converges. Reports that changed wait for a quiet
//! window with no further change, so one burst of changes is one write; a
//! steady trickle of changes is still written at least every
//! [`MAX_DELAY_WINDOWS`] windows. Reports that match what was written are
//! never written.

use std::time::{Duration, Instant};

/// However long changes keep coming, reports wait at most this many quiet
/// windows after the first unwritten change.
pub(crate) const MAX_DELAY_WINDOWS: u32 = 10;

/// Decides when reports that changed are written, fed with what each pass
/// computed and the clock.
#[derive(Debug)]
pub(crate) struct WriteDebouncer {
    window: Duration,
    pending: Option<Pending>,
}

/// Reports computed but not written yet.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// A fingerprint of their content.
    print: u64,
    /// When reports first differed from what was written.
    since: Instant,
    /// When their content last changed.
    changed: Instant,
}

impl WriteDebouncer {
    /// Writes after `window` without a change (`Duration::ZERO`: at once).
    pub(crate) fn new(window: Duration) -> WriteDebouncer {
        WriteDebouncer {
            window,
            pending: None,
        }
    }

    /// Records what a pass computed at `now`: `None` when the reports match
    /// what was written, else a fingerprint of their content. Returns when
    /// to write them (`None`: nothing to write).
    pub(crate) fn offer(&mut self, now: Instant, unwritten: Option<u64>) -> Option<Instant> {
        let Some(print) = unwritten else {
            self.pending = None;
            return None;
        };
        match &mut self.pending {
            Some(pending) if pending.print == print => {}
            Some(pending) => {
                pending.print = print;
                pending.changed = now;
            }
            None => {
                self.pending = Some(Pending {
                    print,
                    since: now,
                    changed: now,
                })
            }
        }
        self.due()
    }

    /// When the unwritten reports are to be written; `None` when there are
    /// none.
    pub(crate) fn due(&self) -> Option<Instant> {
        let pending = self.pending?;
        let quiet = pending.changed + self.window;
        let latest = pending.since + self.window.saturating_mul(MAX_DELAY_WINDOWS);
        Some(quiet.min(latest))
    }

    /// Records that the reports were written (or tried: a write that failed
    /// is tried again after the next pass that finds them unwritten).
    pub(crate) fn attempted(&mut self) {
        self.pending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(1);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_single_change_is_written_one_window_after_it() {
        let t0 = Instant::now();
        let mut d = WriteDebouncer::new(WINDOW);
        assert_eq!(d.offer(t0, Some(1)), Some(t0 + WINDOW));
        // A resync finding the same unwritten content does not delay it.
        assert_eq!(d.offer(t0 + secs(0.5), Some(1)), Some(t0 + WINDOW));
        assert_eq!(d.due(), Some(t0 + WINDOW));
        d.attempted();
        assert_eq!(d.due(), None);
    }

    #[test]
    fn a_burst_of_changes_is_one_write_after_the_last() {
        let t0 = Instant::now();
        let mut d = WriteDebouncer::new(WINDOW);
        for (i, at) in [0.0, 0.3, 0.6, 0.9].into_iter().enumerate() {
            d.offer(t0 + secs(at), Some(i as u64));
        }
        assert_eq!(d.due(), Some(t0 + secs(1.9)));
    }

    #[test]
    fn a_steady_trickle_is_still_written_every_max_delay() {
        let t0 = Instant::now();
        let mut d = WriteDebouncer::new(WINDOW);
        let mut due = None;
        for i in 0..30u32 {
            due = d.offer(t0 + secs(0.5) * i, Some(u64::from(i)));
        }
        assert_eq!(due, Some(t0 + WINDOW * MAX_DELAY_WINDOWS));
        d.attempted();
        // The next change starts a new batch.
        let t1 = t0 + secs(15.0);
        assert_eq!(d.offer(t1, Some(99)), Some(t1 + WINDOW));
    }

    #[test]
    fn reports_matching_what_was_written_are_never_written() {
        let t0 = Instant::now();
        let mut d = WriteDebouncer::new(WINDOW);
        assert_eq!(d.offer(t0, None), None);
        d.offer(t0, Some(1));
        // Changed back before the window passed: nothing to write.
        assert_eq!(d.offer(t0 + secs(0.5), None), None);
        assert_eq!(d.due(), None);
    }

    #[test]
    fn no_window_writes_at_once() {
        let t0 = Instant::now();
        let mut d = WriteDebouncer::new(Duration::ZERO);
        assert_eq!(d.offer(t0, Some(1)), Some(t0));
    }
}
