//! Tag resolutions remembered for the resolve interval.
//!
//! A reconcile runs for many reasons (a node report changed, a status write,
//! an event); only the periodic re-resolution needs the registry. Each
//! image's last resolution is kept with the time it was made, and a
//! reconcile within the cache's interval reuses it: a steady cluster asks
//! the registry once per image and interval, however often it reconciles.
//! Failures are not remembered, so an error is retried at the next
//! reconcile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The last successful resolution of each image reference.
#[derive(Debug, Default)]
pub struct Resolutions {
    entries: Mutex<HashMap<String, (String, Instant)>>,
}

impl Resolutions {
    /// The digest `image` resolved to less than `interval` before `now`.
    pub fn fresh(&self, image: &str, interval: Duration, now: Instant) -> Option<String> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(image)
            .filter(|(_, at)| now.saturating_duration_since(*at) < interval)
            .map(|(digest, _)| digest.clone())
    }

    /// Records that `image` resolved to `digest` at `now`, and forgets
    /// resolutions older than `keep` (no cache waits that long).
    pub fn record(&self, image: &str, digest: &str, now: Instant, keep: Duration) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, (_, at)| now.saturating_duration_since(*at) < keep);
        entries.insert(image.to_string(), (digest.to_string(), now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);
    const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

    #[test]
    fn a_resolution_is_reused_within_the_interval_only() {
        let resolutions = Resolutions::default();
        let t0 = Instant::now();
        assert_eq!(resolutions.fresh("r/c:v1", MINUTE, t0), None);
        resolutions.record("r/c:v1", "sha256:a", t0, WEEK);
        let later = |s| t0 + Duration::from_secs(s);
        assert_eq!(
            resolutions.fresh("r/c:v1", MINUTE, later(59)).as_deref(),
            Some("sha256:a")
        );
        assert_eq!(resolutions.fresh("r/c:v1", MINUTE, later(60)), None);
        // Another cache of the same image with a longer interval reuses it.
        assert_eq!(
            resolutions
                .fresh("r/c:v1", 2 * MINUTE, later(90))
                .as_deref(),
            Some("sha256:a")
        );
        // Another image is not.
        assert_eq!(resolutions.fresh("r/c:v2", MINUTE, later(1)), None);
    }

    #[test]
    fn old_resolutions_are_forgotten() {
        let resolutions = Resolutions::default();
        let t0 = Instant::now();
        resolutions.record("r/old:v1", "sha256:a", t0, WEEK);
        resolutions.record("r/new:v1", "sha256:b", t0 + WEEK, WEEK);
        assert_eq!(resolutions.entries.lock().unwrap().len(), 1);
    }
}
