//! What the agent reads of a cache: its spec, the digest the operator
//! resolved, the operator's verdict and whether it is being deleted. The
//! wake check ([`crate::wakes`]) fingerprints exactly this, and the planner
//! ([`crate::plan`]) decides from exactly this, so a change that would alter
//! a plan always wakes the agent.

use gkm_core::Digest;
use serde::Serialize;

use gkm_k8s_api::cache_object::CacheObject;
use gkm_k8s_api::crd::{CacheSpec, CacheStatus, VerificationStatus};

/// One cache of either kind, as the agent reads it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CacheView<'a> {
    /// Its spec.
    pub spec: &'a CacheSpec,
    /// The digest the operator resolved `spec.image` to, as written.
    pub resolved: Option<&'a str>,
    /// The operator's verdict on that digest's signatures.
    pub verification: Option<&'a VerificationStatus>,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl<'a> CacheView<'a> {
    /// The view of a cache with `spec` and `status`.
    pub fn new(spec: &'a CacheSpec, status: Option<&'a CacheStatus>, deleting: bool) -> Self {
        CacheView {
            spec,
            resolved: status.and_then(|s| s.resolved_digest.as_deref()),
            verification: status.and_then(|s| s.verification.as_ref()),
            deleting,
        }
    }

    /// The view of `cache`.
    pub fn of<K: CacheObject>(cache: &'a K) -> Self {
        CacheView::new(
            cache.cache_spec(),
            cache.cache_status(),
            cache.meta().deletion_timestamp.is_some(),
        )
    }

    /// The resolved digest, parsed; `None` while unresolved.
    pub fn resolved_digest(&self) -> Option<Digest> {
        self.resolved?.parse().ok()
    }

    /// The image reference the cache names.
    pub fn image(&self) -> &'a str {
        &self.spec.image
    }
}
