//! When the agent's passes run, so that a thousand agents do not stampede
//! the apiserver: each agent's first pass waits a delay fixed by its node's
//! name within a window (agents started together, by a rollout or a
//! cluster restart, spread out), and after a pass the apiserver throttled
//! (`429 Too Many Requests`) the next waits at least as long as it asked
//! (`Retry-After`), longer for each throttled pass in a row.
//!
//! Each request is also retried by the client, which honours `Retry-After`
//! ([`kube::client::retry::RetryPolicy::server_retry`]); this paces whole
//! passes once those retries are spent.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use crate::error::Error;

/// The first wait after a throttled pass, when the apiserver names none...
const FIRST_THROTTLED_DELAY: Duration = Duration::from_secs(1);
/// ...doubled for each throttled pass in a row, up to this (unless the
/// apiserver asks for longer).
const MAX_THROTTLED_DELAY: Duration = Duration::from_secs(60);

/// How long the agent of `node` waits before its first pass: a point in
/// `[0, window)` that depends only on the node's name, so agents of
/// different nodes spread evenly over the window, however they were
/// started.
pub fn start_delay(node: &str, window: Duration) -> Duration {
    let mut hasher = DefaultHasher::new();
    node.hash(&mut hasher);
    // The top 53 bits as a fraction in [0, 1).
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    window.mul_f64(fraction)
}

/// Throttled passes in a row, and how long the next one waits.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    in_a_row: u32,
}

impl Throttle {
    /// Records how a pass ended; returns how long to wait before the next
    /// one (`None`: no need to wait).
    pub(crate) fn after(&mut self, outcome: Result<(), &Error>) -> Option<Duration> {
        let Some(asked) = outcome.err().and_then(Error::throttled) else {
            self.in_a_row = 0;
            return None;
        };
        self.in_a_row = self.in_a_row.saturating_add(1);
        let backoff = FIRST_THROTTLED_DELAY
            .saturating_mul(2u32.saturating_pow(self.in_a_row - 1))
            .min(MAX_THROTTLED_DELAY);
        Some(backoff.max(asked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::core::response::StatusDetails;

    fn throttled(retry_after_seconds: u32) -> Error {
        let status = Status {
            code: 429,
            details: Some(StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds,
            }),
            ..Status::default()
        };
        Error::Kube(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn first_passes_spread_over_the_window_by_node_name() {
        let window = Duration::from_secs(10);
        let delays: Vec<Duration> = (0..1000)
            .map(|i| start_delay(&format!("gpu-node-{i}"), window))
            .collect();
        assert!(delays.iter().all(|d| *d < window));
        // Every second of the window gets its share (100 expected each).
        for second in 0..10 {
            let n = delays.iter().filter(|d| d.as_secs() == second).count();
            assert!((60..140).contains(&n), "{n} agents in second {second}");
        }
        assert_eq!(start_delay("a", window), start_delay("a", window));
        assert_eq!(start_delay("a", Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn a_throttled_pass_waits_as_long_as_the_apiserver_asks_and_longer_in_a_row() {
        let mut throttle = Throttle::default();
        assert_eq!(throttle.after(Ok(())), None);
        assert_eq!(
            throttle.after(Err(&throttled(7))),
            Some(Duration::from_secs(7))
        );
        // No Retry-After: doubling from 1s (this is the second in a row).
        assert_eq!(
            throttle.after(Err(&throttled(0))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            throttle.after(Err(&throttled(0))),
            Some(Duration::from_secs(4))
        );
        // The apiserver's word beats the cap.
        assert_eq!(
            throttle.after(Err(&throttled(600))),
            Some(Duration::from_secs(600))
        );
        // Other failures are not throttling, and a pass that ends well
        // starts over.
        assert_eq!(throttle.after(Err(&Error::Gpu("x".into()))), None);
        assert_eq!(throttle.after(Ok(())), None);
        assert_eq!(
            throttle.after(Err(&throttled(0))),
            Some(Duration::from_secs(1))
        );
    }
}
