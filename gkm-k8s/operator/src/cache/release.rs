//! Each cache's release ([`CacheRelease`]): what the nodes act on, apart
//! from the counts that change whenever a node reports. The operator writes
//! it only when what it holds changes, so at a thousand nodes a node's
//! report wakes no other node.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::error::Result;
use crate::names::FIELD_MANAGER;
use gkm_k8s_api::cache_object::{CacheObject, ReleaseObject};
use gkm_k8s_api::crd::{CacheRelease, CacheSpec, CacheStatus, ImageVariant};

/// The release of a cache with `spec` and the status the operator decided,
/// `status`: the digest, the verdict on it, and for a deliverable digest
/// the image's `variants` (or why they could not be read); `deleting` when
/// the cache is being deleted.
pub(super) fn release_of(
    spec: &CacheSpec,
    status: &CacheStatus,
    variants: Option<Result<Vec<ImageVariant>, String>>,
    deleting: bool,
) -> CacheRelease {
    let digest = status.resolved_digest.clone();
    let verdict = status.verification.as_ref();
    let deliverable = digest
        .as_deref()
        .is_some_and(|d| verdict.is_some_and(|v| v.admits(d)));
    // The operator's note, when it is about this digest.
    let refusal = digest.as_deref().filter(|_| !deliverable).map(|d| {
        verdict
            .filter(|v| v.digest.as_deref() == Some(d))
            .and_then(|v| v.message.clone())
            .unwrap_or_else(|| "not verified yet".to_string())
    });
    let (variants, variants_error) = match variants.filter(|_| deliverable) {
        Some(Ok(variants)) => (Some(variants), None),
        Some(Err(why)) => (None, Some(why)),
        None => (None, None),
    };
    CacheRelease {
        image: spec.image.clone(),
        node_selector: spec.node_selector.clone(),
        workload_namespaces: spec.workload_namespaces.clone(),
        digest,
        deliverable,
        refusal,
        variants,
        variants_error,
        deleting,
    }
}

/// The last release written per cache uid: a reconcile that wants what was
/// written last writes nothing.
#[derive(Default)]
pub struct Releases {
    by_uid: Mutex<HashMap<String, CacheRelease>>,
}

impl Releases {
    /// What was written last as the release of the cache of `uid`.
    pub(super) fn written(&self, uid: &str) -> Option<CacheRelease> {
        let by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.get(uid).cloned()
    }

    /// `release` was written (or found) as the cache of `uid`'s.
    pub(super) fn record(&self, uid: &str, release: &CacheRelease) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.insert(uid.to_string(), release.clone());
    }

    /// What was written for the cache of `uid` no longer holds: its next
    /// reconcile reads and writes its release again.
    pub(super) fn forget(&self, uid: &str) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.remove(uid);
    }

    /// Forgets every cache's release but those of the uids in `kept`.
    pub(super) fn forget_all_but(&self, kept: &std::collections::HashSet<String>) {
        let mut by_uid = self.by_uid.lock().unwrap_or_else(PoisonError::into_inner);
        by_uid.retain(|uid, _| kept.contains(uid));
    }
}

/// Applies `release` as `cache`'s release (server-side, owned by the cache
/// so that it goes with it) unless it is what the release holds already:
/// what this operator wrote last or, after a restart, what it reads.
pub(super) async fn write_release<K: CacheObject>(
    cache: &K,
    client: &kube::Client,
    releases: &Releases,
    release: CacheRelease,
) -> Result<bool> {
    let uid = cache.uid().unwrap_or_default();
    if releases.written(&uid).as_ref() == Some(&release) {
        return Ok(false);
    }
    let name = cache.name_any();
    let api = K::Release::api(client.clone(), cache.namespace().as_deref());
    let owner = cache.controller_owner_ref(&());
    if let Some(current) = api.get_opt(&name).await?
        && current.release() == &release
        && current
            .owner_references()
            .iter()
            .any(|o| Some(o) == owner.as_ref())
    {
        releases.record(&uid, &release);
        return Ok(false);
    }
    let mut object = K::Release::new(&name, release.clone());
    object.meta_mut().namespace = cache.namespace();
    object.meta_mut().owner_references = owner.map(|o| vec![o]);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await?;
    releases.record(&uid, &release);
    Ok(true)
}

/// Removes `cache`'s release (its deletion is done); garbage collection
/// would too, later.
pub(super) async fn remove_release<K: CacheObject>(
    cache: &K,
    client: &kube::Client,
    releases: &Releases,
) -> Result<()> {
    let api = K::Release::api(client.clone(), cache.namespace().as_deref());
    match api
        .delete(&cache.name_any(), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    releases.forget(cache.uid().as_deref().unwrap_or_default());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::VerificationStatus;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const OLD: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn status(verdict_digest: &str, deliverable: bool) -> CacheStatus {
        CacheStatus {
            resolved_digest: Some(DIGEST.into()),
            verification: Some(VerificationStatus {
                verified: deliverable,
                deliverable: Some(deliverable),
                digest: Some(verdict_digest.into()),
                message: Some("no signature".into()),
                ..VerificationStatus::default()
            }),
            ..CacheStatus::default()
        }
    }

    fn spec() -> CacheSpec {
        CacheSpec {
            image: "r/c:v1".into(),
            ..CacheSpec::default()
        }
    }

    #[test]
    fn counts_and_conditions_are_not_part_of_a_release() {
        let variants = || Some(Ok(vec![ImageVariant::default()]));
        let mut counted = status(DIGEST, true);
        let before = release_of(&spec(), &counted, variants(), false);
        counted.counts.node_cnt = 900;
        counted.state = Some(gkm_k8s_api::crd::CacheState::Running);
        assert_eq!(release_of(&spec(), &counted, variants(), false), before);
        assert!(before.deliverable);
        assert_eq!(before.variants, Some(vec![ImageVariant::default()]));
    }

    #[test]
    fn a_refused_digest_carries_the_operators_reason_and_no_variants() {
        let variants = Some(Ok(vec![ImageVariant::default()]));
        let refused = release_of(&spec(), &status(DIGEST, false), variants, false);
        assert!(!refused.deliverable);
        assert_eq!(refused.refusal.as_deref(), Some("no signature"));
        assert_eq!(refused.variants, None);
        // A verdict about the digest the tag pointed to before.
        let stale = release_of(&spec(), &status(OLD, true), None, false);
        assert!(!stale.deliverable);
        assert_eq!(stale.refusal.as_deref(), Some("not verified yet"));
        // Unresolved: nothing to refuse.
        let unresolved = release_of(&spec(), &CacheStatus::default(), None, false);
        assert_eq!((unresolved.digest, unresolved.refusal), (None, None));
    }

    #[test]
    fn a_failed_read_of_the_variants_is_published() {
        let release = release_of(
            &spec(),
            &status(DIGEST, true),
            Some(Err("unreachable".into())),
            false,
        );
        assert_eq!(release.variants_error.as_deref(), Some("unreachable"));
        assert_eq!(release.variants, None);
    }
}
