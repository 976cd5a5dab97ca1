//! The variants of each resolved image, with the GPU targets each fits: read
//! once per image digest by the operator, published in the cache's release
//! ([`gkm_k8s_api::crd::CacheRelease`]), so that no node reads the registry
//! to decide whether a cache fits its GPUs.
//!
//! The manifest read to resolve a tag seeds them (gkm's images carry the
//! cache labels in its annotations; a multi-target image's index carries
//! each variant's targets in its descriptors), so most images need no read
//! of their own. A multi-target image has one variant per index entry, in
//! the index's order (the order a tie between variants is broken in). A digest's content never changes, so a read that succeeded is kept while
//! caches use it, and caches of the same image reconciled together wait for
//! one read. A failure is kept for [`RETRY_AFTER`], so that the reconciles
//! node reports trigger do not each ask a failing registry again.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gkm_oci::{
    CacheLabels, Digest, Image, ImageRef, MultiTarget, RegistryOptions, Repo, Resolution,
};

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
            match Image::fetch_annotated(&repo).await {
                Ok(image) if image.labels.is_empty() => {
                    variants(&image.digest, &image.manifest.annotations)
                }
                Ok(image) => variants(&image.digest, &image.labels),
                Err(gkm_oci::Error::MultiTarget { .. }) => {
                    let raw = repo.fetch_manifest().await.map_err(|e| e.to_string())?;
                    let Some(mut multi) = MultiTarget::parse(&raw).map_err(|e| e.to_string())?
                    else {
                        return Err(format!("{pinned} is not a multi-target image"));
                    };
                    // Descriptors without the targets: read from their
                    // variants' manifests.
                    multi
                        .complete(&pinned, registry)
                        .await
                        .map_err(|e| e.to_string())?;
                    Ok(index_variants(&multi))
                }
                Err(e) => Err(e.to_string()),
            }
        }
        .await
        .map_err(|e: String| format!("reading the targets of {pinned}: {e}"));
        read(outcome.is_ok(), now.elapsed());
        self.record(&key, outcome.clone(), now);
        outcome
    }

    /// Keeps the variants of the digest `image` resolved to when what the
    /// resolution read says them: a manifest carrying the cache labels, or
    /// a multi-target index whose descriptors all carry them (the index
    /// alone, one request). No read is needed then.
    pub fn seed(&self, image: &str, resolution: &Resolution) {
        let Ok(reference) = image.parse::<ImageRef>() else {
            return;
        };
        let found = match resolution {
            Resolution::Image {
                digest,
                manifest: Some(manifest),
            } => variants(digest, &manifest.annotations).ok(),
            Resolution::Image { manifest: None, .. } => None,
            Resolution::MultiTarget(multi) => multi
                .variants
                .iter()
                .all(|v| v.cache.is_some())
                .then(|| index_variants(multi)),
        };
        if let Some(found) = found {
            let key = reference.with_digest(resolution.digest()).to_string();
            self.record(&key, Ok(found), Instant::now());
        }
    }
}

/// The variants of a multi-target image, in its order, each with its
/// targets.
fn index_variants(multi: &MultiTarget) -> Vec<ImageVariant> {
    multi
        .variants
        .iter()
        .map(|v| ImageVariant::new(&v.digest, &v.summary()))
        .collect()
}

/// The variants of the image manifest `digest` with these labels (its
/// config's, or its annotations): one, with the summary's targets and, for
/// a cache judged by the CPU, the CPU ISA its C++ kernels were built for
/// (read from them or declared: [`gkm_core::cache::Fit`]).
fn variants(
    digest: &Digest,
    labels: &BTreeMap<String, String>,
) -> Result<Vec<ImageVariant>, String> {
    let cache = CacheLabels::read(labels).map_err(|e| e.to_string())?;
    let fit = cache.kind.fit_of_labels(cache.summary.clone(), labels);
    let cpu_isa = fit.judged_by_cpu().and_then(|cpu| cpu.isa.clone());
    Ok(vec![
        ImageVariant::new(digest, &cache.summary).with_cpu_isa(cpu_isa),
    ])
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

    #[test]
    fn a_cache_of_cpp_kernels_is_published_with_the_isa_they_were_built_for() {
        let digest: Digest = format!("sha256:{}", "a".repeat(64)).parse().unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        // A vLLM CPU root: its kernels record their ISA.
        let vllm = labels(&[
            ("cache.vllm.image/summary", r#"{"targets":[]}"#),
            ("cache.vllm.image/cpp-kernel-count", "17"),
            ("cache.vllm.image/cpu-isa", "amx_tile"),
        ]);
        let published = variants(&digest, &vllm).unwrap();
        assert_eq!(published[0].cpu_isa.as_deref(), Some("amx_tile"));
        // An Inductor cache: as its builder declared.
        let inductor = labels(&[
            ("cache.inductor.image/summary", r#"{"targets":[]}"#),
            ("cache.inductor.image/declared-cpu-isa", "avx2"),
        ]);
        assert_eq!(
            variants(&digest, &inductor).unwrap()[0].cpu_isa.as_deref(),
            Some("avx2")
        );
        // GPU kernels decide where there are any.
        let gpu = labels(&[
            (
                "cache.vllm.image/summary",
                r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32}]}"#,
            ),
            ("cache.vllm.image/cpp-kernel-count", "3"),
            ("cache.vllm.image/cpu-isa", "avx2"),
        ]);
        let published = variants(&digest, &gpu).unwrap();
        assert_eq!(published[0].cpu_isa, None);
        assert_eq!(published[0].targets.len(), 1);
    }
}
