//! Failed steps and when to try them again: a registry that times out once
//! must not leave a cache undelivered until the agent restarts.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use gkm_oci::Digest;
use jiff::{SignedDuration, Timestamp};

/// The first retry comes this long after a failure...
const FIRST_DELAY: Duration = Duration::from_secs(5);
/// ...and each next one twice as long after, up to this.
const MAX_DELAY: Duration = Duration::from_secs(600);

/// One failed step.
#[derive(Debug, Clone)]
struct Failure {
    message: String,
    attempts: u32,
    next_try: Instant,
    next_try_at: Timestamp,
}

/// The failures of one step (reading a summary, extracting), per digest
/// (or per namespace and digest), with exponential backoff.
#[derive(Debug)]
pub(super) struct Backoff<K = Digest> {
    failures: HashMap<K, Failure>,
}

impl<K> Default for Backoff<K> {
    fn default() -> Self {
        Backoff {
            failures: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    /// Records that the step failed for `digest` because of `message`.
    pub(super) fn failed(&mut self, digest: &K, message: String) {
        let attempts = self.failures.get(digest).map_or(0, |f| f.attempts) + 1;
        let delay = FIRST_DELAY
            .saturating_mul(2u32.saturating_pow(attempts.saturating_sub(1).min(16)))
            .min(MAX_DELAY);
        let next_try_at = Timestamp::now()
            .checked_add(SignedDuration::from_secs(delay.as_secs() as i64))
            .unwrap_or_else(|_| Timestamp::now());
        self.failures.insert(
            digest.clone(),
            Failure {
                message,
                attempts,
                next_try: Instant::now() + delay,
                next_try_at,
            },
        );
    }

    /// Records that the step succeeded for `digest`.
    pub(super) fn succeeded(&mut self, digest: &K) {
        self.failures.remove(digest);
    }

    /// Why the step failed for `digest` and when it is tried again, while
    /// that time has not come; `None` when it did not fail or is due.
    pub(super) fn waiting(&self, digest: &K) -> Option<String> {
        let f = self.failures.get(digest)?;
        (Instant::now() < f.next_try).then(|| {
            format!(
                "{} (attempt {}; next try at {})",
                f.message, f.attempts, f.next_try_at
            )
        })
    }

    /// The earliest time a step is due again.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.failures.values().map(|f| f.next_try).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_waits_then_is_due_and_success_forgets_it() {
        let mut b = Backoff::default();
        let d = Digest::of(b"x");
        assert_eq!(b.waiting(&d), None);
        b.failed(&d, "registry timed out".into());
        let why = b.waiting(&d).expect("waiting");
        assert!(
            why.starts_with("registry timed out (attempt 1; next try at "),
            "{why}"
        );
        b.failed(&d, "again".into());
        assert!(b.waiting(&d).is_some_and(|w| w.contains("attempt 2")));
        assert!(b.next_due().is_some());
        b.succeeded(&d);
        assert_eq!(b.waiting(&d), None);
        assert_eq!(b.next_due(), None);
    }
}
