//! Signature verification as the operator sees it: a policy in, a
//! [`VerificationStatus`] out.

use async_trait::async_trait;

use crate::cache_object::CacheKey;
use crate::crd::{SignatureMode, SignaturePolicy, VerificationStatus};

/// Verifies an image digest against a cache's signature policy.
#[async_trait]
pub trait ImageVerifier: Send + Sync {
    /// What verifying `digest` of `image` against `policy` proved, or why not.
    async fn verify(
        &self,
        cache: &CacheKey,
        image: &str,
        digest: &str,
        policy: &SignaturePolicy,
    ) -> VerificationStatus;
}

/// Whether a verification outcome lets the cache be delivered under `mode`.
pub fn deliverable(mode: SignatureMode, status: &VerificationStatus) -> bool {
    match mode {
        SignatureMode::Enforce => status.verified,
        SignatureMode::Audit | SignatureMode::Off => true,
    }
}
