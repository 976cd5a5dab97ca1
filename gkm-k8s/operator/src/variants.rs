//! The variants of each resolved image, with the GPU targets each fits: read
//! once per image digest by the operator, published in the cache's release
//! ([`gkm_k8s_api::crd::CacheRelease`]), so that no node reads the registry
//! to decide whether a cache fits its GPUs.
//!
//! The manifest read to resolve a tag seeds them (gkm's images carry the
//! cache labels in its annotations), so most images need no read of their
//! own. A digest's content never changes, so a read that succeeded is kept while
//! caches use it, and caches of the same image reconciled together wait for
//! one read. A failure is kept for [`RETRY_AFTER`], so that the reconciles
//! node reports trigger do not each ask a failing registry again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gkm_oci::{CacheLabels, Digest, Image, ImageRef, Manifest, RegistryOptions, Repo};

use gkm_k8s_api::crd::ImageVariant;

/// How long a failed read is reported before the registry is asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How long a read no reconcile used is kept.
const KEEP_UNUSED: Duration = Duration::from_secs(24 * 3600);

/// What one read gave, and when.
#[derive(Debug, Clone)]
struct Entry {
    outcome: Result<Vec<ImageVariant>, String>,
    at: Instant,
    used: Instant,
}

/// The variants read so far, by the image's repository and digest (a digest
/// read in one repository says nothing of another).
#[derive(Debug, Default)]
pub struct Variants {
    entries: Mutex<HashMap<String, Entry>>,
    /// One read at a time per key: the others wait for its outcome.
    reading: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Variants {
    /// The gate reads of `key` pass one at a time; gates no read holds are
    /// dropped.
    fn gate(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut reading = self.reading.lock().unwrap_or_else(|e| e.into_inner());
        reading.retain(|_, gate| Arc::strong_count(gate) > 1);
        reading.entry(key.to_string()).or_default().clone()
    }

    /// What is known of `key` at `now`: the variants, or a failure younger
    /// than [`RETRY_AFTER`]; `None` when the registry must be asked.
    fn known(&self, key: &str, now: Instant) -> Option<Result<Vec<ImageVariant>, String>> {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get_mut(key)?;
        if entry.outcome.is_err() && now.saturating_duration_since(entry.at) >= RETRY_AFTER {
            return None;
        }
        entry.used = now;
        Some(entry.outcome.clone())
    }

    /// Records what reading `key` gave at `now`, forgetting reads no
    /// reconcile used for a day.
    fn record(&self, key: &str, outcome: Result<Vec<ImageVariant>, String>, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, e| now.saturating_duration_since(e.used) < KEEP_UNUSED);
        entries.insert(
            key.to_string(),
            Entry {
                outcome,
                at: now,
                used: now,
            },
        );
    }

    /// The variants of `digest` in `image`'s repository, from memory or
    /// read (its manifest; its config only when the manifest does not carry
    /// the cache labels), or why they cannot be; `read` is told of each
    /// registry read and its outcome.
    pub async fn of(
        &self,
        image: &str,
        digest: &Digest,
        registry: &RegistryOptions,
        read: impl FnOnce(bool, Duration),
    ) -> Result<Vec<ImageVariant>, String> {
        let reference: ImageRef = image
            .parse()
            .map_err(|e| format!("spec.image {image:?}: {e}"))?;
        let pinned = reference.with_digest(digest);
        let key = pinned.to_string();
        if let Some(known) = self.known(&key, Instant::now()) {
            return known;
        }
        let gate = self.gate(&key);
        let _one_at_a_time = gate.lock().await;
        let now = Instant::now();
        if let Some(known) = self.known(&key, now) {
            return known;
        }
        let outcome = async {
            let repo = Repo::open(&pinned, registry).map_err(|e| e.to_string())?;
            let image = Image::fetch_annotated(&repo)
                .await
                .map_err(|e| e.to_string())?;
            variants(&image.digest, image.cache())
        }
        .await
        .map_err(|e: String| format!("reading the targets of {pinned}: {e}"));
        read(outcome.is_ok(), now.elapsed());
        self.record(&key, outcome.clone(), now);
        outcome
    }

    /// Keeps the variants of `digest` of `image` when `manifest` (read to
    /// resolve its tag) carries the cache labels: no read is needed then.
    pub fn seed(&self, image: &str, digest: &Digest, manifest: &Manifest) {
        let Ok(reference) = image.parse::<ImageRef>() else {
            return;
        };
        if let Ok(found) = variants(digest, CacheLabels::read(&manifest.annotations)) {
            let key = reference.with_digest(digest).to_string();
            self.record(&key, Ok(found), Instant::now());
        }
    }
}

/// The variants of the image manifest `digest` with these cache labels: one,
/// with the summary's targets.
fn variants(
    digest: &Digest,
    labels: gkm_oci::Result<CacheLabels>,
) -> Result<Vec<ImageVariant>, String> {
    let summary = labels.map_err(|e| e.to_string())?.summary;
    Ok(vec![ImageVariant::new(digest, &summary)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_kept_and_a_failure_retried_after_a_while() {
        let variants = Variants::default();
        let t0 = Instant::now();
        assert!(variants.known("r/a@sha256:1", t0).is_none());
        variants.record("r/a@sha256:1", Ok(vec![ImageVariant::default()]), t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(
            variants.known("r/a@sha256:1", later),
            Some(Ok(vec![ImageVariant::default()]))
        );
        variants.record("r/b@sha256:2", Err("unreachable".into()), t0);
        assert_eq!(
            variants.known("r/b@sha256:2", t0 + Duration::from_secs(1)),
            Some(Err("unreachable".into()))
        );
        assert!(variants.known("r/b@sha256:2", t0 + RETRY_AFTER).is_none());
    }

    #[test]
    fn reads_no_reconcile_used_for_a_day_are_forgotten() {
        let variants = Variants::default();
        let t0 = Instant::now();
        variants.record("r/old@sha256:1", Ok(Vec::new()), t0);
        variants.record("r/new@sha256:2", Ok(Vec::new()), t0 + KEEP_UNUSED);
        assert_eq!(variants.entries.lock().unwrap().len(), 1);
    }
}
