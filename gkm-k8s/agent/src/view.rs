//! What the agent reads of a cache: its spec, the digest the operator
//! resolved, the operator's verdict and whether it is being deleted. The
//! wake check ([`crate::wakes`]) fingerprints exactly this, and the planner
//! ([`crate::plan`]) decides from exactly this, so a change that would alter
//! a plan always wakes the agent.

use gkm_core::Digest;
use serde::Serialize;

use gkm_k8s_api::cache_object::CacheObject;
use gkm_k8s_api::crd::{CacheSpec, CacheStatus, VerificationStatus};

/// One cache of either kind, as the agent reads it. It serialises (for
/// the wake check's fingerprint) as its spec, the resolved digest as
/// written, the verdict and whether it is being deleted.
#[derive(Debug, Clone, Copy)]
pub struct CacheView<'a> {
    /// Its spec.
    pub spec: &'a CacheSpec,
    /// Its status, where the operator records the digest it resolved and
    /// its verdict.
    pub status: Option<&'a CacheStatus>,
    /// Whether it is being deleted.
    pub deleting: bool,
}

impl<'a> CacheView<'a> {
    /// The view of a cache with `spec` and `status`.
    pub fn new(spec: &'a CacheSpec, status: Option<&'a CacheStatus>, deleting: bool) -> Self {
        CacheView {
            spec,
            status,
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

    /// The resolved digest ([`CacheStatus::resolved`]); `None` while
    /// unresolved.
    pub fn resolved_digest(&self) -> Option<Digest> {
        self.status?.resolved()
    }

    /// The operator's verdict on the resolved digest's signatures.
    pub fn verification(&self) -> Option<&'a VerificationStatus> {
        self.status?.verification.as_ref()
    }

    /// The image reference the cache names.
    pub fn image(&self) -> &'a str {
        &self.spec.image
    }
}

impl Serialize for CacheView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut view = s.serialize_struct("CacheView", 4)?;
        view.serialize_field("spec", self.spec)?;
        view.serialize_field(
            "resolved",
            &self.status.and_then(|s| s.resolved_digest.as_deref()),
        )?;
        view.serialize_field("verification", &self.verification())?;
        view.serialize_field("deleting", &self.deleting)?;
        view.end()
    }
}
