//! Whether the agent's passes go on, for `/healthz`: a pass ends at least
//! every resync, so when none has ended for much longer the agent is stuck
//! (waiting on something that never answers) and its health says so,
//! letting the kubelet restart it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// When the agent's last pass ended, and how long without one is a stall.
#[derive(Clone, Debug)]
pub struct Liveness {
    last_end: Arc<Mutex<Instant>>,
    stall_after: Duration,
}

impl Liveness {
    /// Passes counted from now; more than `stall_after` without one ending
    /// is a stall.
    pub fn new(stall_after: Duration) -> Liveness {
        Liveness {
            last_end: Arc::new(Mutex::new(Instant::now())),
            stall_after,
        }
    }

    /// Records that a pass ended (whether it succeeded or not).
    pub fn pass_ended(&self) {
        *self.last_end.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Records that the next pass waits `wait` on purpose (the apiserver
    /// asked for it): the wait does not count as a stall.
    pub fn pass_deferred(&self, wait: Duration) {
        let mut last_end = self.last_end.lock().unwrap_or_else(PoisonError::into_inner);
        *last_end = (*last_end).max(Instant::now() + wait);
    }

    /// `Ok` while passes go on; otherwise how long they have stopped.
    pub fn check(&self) -> Result<(), Stalled> {
        let last_end = *self.last_end.lock().unwrap_or_else(PoisonError::into_inner);
        stalled(last_end, Instant::now(), self.stall_after)
    }
}

impl Default for Liveness {
    /// A stall is 5 minutes without a pass ending.
    fn default() -> Liveness {
        Liveness::new(Duration::from_secs(300))
    }
}

/// The agent's passes stopped: none ended for `since`, longer than the
/// `allowed` stall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "no agent pass has ended for {}s (more than the {}s allowed)",
    since.as_secs(),
    allowed.as_secs()
)]
pub struct Stalled {
    /// How long since the last pass ended.
    pub since: Duration,
    /// How long without one is allowed.
    pub allowed: Duration,
}

/// Whether passes stopped: none ended from `last_end` to `now`, longer than
/// `stall_after`.
fn stalled(last_end: Instant, now: Instant, stall_after: Duration) -> Result<(), Stalled> {
    let since = now.saturating_duration_since(last_end);
    if since <= stall_after {
        return Ok(());
    }
    Err(Stalled {
        since,
        allowed: stall_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_that_stop_for_longer_than_allowed_are_a_stall() {
        let start = Instant::now();
        let allowed = Duration::from_secs(60);
        assert!(stalled(start, start + allowed, allowed).is_ok());
        let why = stalled(start, start + Duration::from_secs(61), allowed).unwrap_err();
        assert_eq!(
            why.to_string(),
            "no agent pass has ended for 61s (more than the 60s allowed)"
        );
        let live = Liveness::new(allowed);
        live.pass_ended();
        assert!(live.check().is_ok());
        // A wait the apiserver asked for is not a stall.
        live.pass_deferred(Duration::from_secs(3600));
        assert!(
            stalled(
                *live.last_end.lock().unwrap(),
                Instant::now() + Duration::from_secs(3600),
                allowed
            )
            .is_ok()
        );
    }
}
