//! Keeping each cache's release as the operator wrote it: a release deleted
//! or changed by another hand is written again at once, not only when its
//! cache next changes.
//!
//! The operator remembers the release it wrote last per cache
//! ([`Releases`]) and writes nothing while a reconcile wants the same. The
//! watch of the releases it owns forgets that memory for a release that is
//! gone or holds something else, and names its cache for a reconcile, which
//! then writes it. The operator's own writes hold what it remembers, so
//! they trigger nothing. A release deleted while the watch was down is not
//! seen deleted: once the watch lists again, what it remembers of a
//! release no longer listed is forgotten, and the cache's next reconcile
//! (at the latest its periodic one) writes it.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tracing::warn;

use gkm_k8s_runtime::relist::Relist;

use super::release::Releases;
use gkm_k8s_api::cache_object::{CacheObject, ReleaseObject};

/// What the watch of one kind of release has seen: the pure part.
#[derive(Debug, Default)]
struct Restorer {
    /// The owners' uids listed so far while a relist is under way.
    relist: Relist<HashSet<String>>,
}

/// The uid of `K`, the cache that controls `release`, if one does.
fn owner_uid<K: CacheObject>(release: &K::Release) -> Option<String> {
    let kind = K::kind(&());
    release
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == kind)
        .map(|o| o.uid.clone())
}

/// The cache of `release` (the same name, in the same namespace).
fn cache_of<K: CacheObject>(release: &K::Release) -> ObjectRef<K> {
    let cache = ObjectRef::<K>::new(&release.name_any());
    match release.namespace() {
        Some(namespace) => cache.within(&namespace),
        None => cache,
    }
}

impl Restorer {
    /// Takes in one event of the watch of `K`'s releases; forgets in
    /// `releases` what no longer holds, and returns the cache to reconcile
    /// when a release it owns went or holds what the operator did not write.
    fn observe<K: CacheObject>(
        &mut self,
        event: &watcher::Event<K::Release>,
        releases: &Releases,
    ) -> Option<ObjectRef<K>> {
        match event {
            watcher::Event::Delete(release) => {
                let uid = owner_uid::<K>(release)?;
                releases.forget(&uid);
                Some(cache_of(release))
            }
            watcher::Event::Apply(release) | watcher::Event::InitApply(release) => {
                let uid = owner_uid::<K>(release)?;
                self.relist.listed(uid.clone());
                let written = releases.written(&uid)?;
                if &written == release.release() {
                    return None;
                }
                releases.forget(&uid);
                Some(cache_of(release))
            }
            watcher::Event::Init => {
                self.relist.start();
                None
            }
            watcher::Event::InitDone => {
                let listed = self.relist.finish().unwrap_or_default();
                releases.forget_all_but(&listed);
                None
            }
        }
    }
}

/// Watches `K`'s releases; the stream names the caches whose release was
/// deleted or changed by another hand, after forgetting in the context's
/// releases what the operator wrote there.
pub(super) fn watch_releases<K: CacheObject>(
    ctx: Arc<crate::cache::Context>,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static {
    let api: Api<K::Release> = Api::all(ctx.client.clone());
    let mut restorer = Restorer::default();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let cache = match event {
                Ok(event) => restorer.observe::<K>(&event, &ctx.releases),
                Err(e) => {
                    warn!(error = %e, "watching the caches' releases");
                    None
                }
            };
            futures::future::ready(cache)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CacheRelease, GKMCache, GKMCacheRelease};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use watcher::Event;

    fn release(digest: &str) -> CacheRelease {
        CacheRelease {
            image: "r/c:v1".into(),
            digest: Some(digest.into()),
            deliverable: true,
            ..CacheRelease::default()
        }
    }

    /// The release `name` in `ns` holding `digest`, controlled by the cache
    /// of uid `owner` when there is one.
    fn object(name: &str, owner: Option<&str>, digest: &str) -> GKMCacheRelease {
        let mut object = <GKMCacheRelease as ReleaseObject>::new(name, release(digest));
        object.metadata.namespace = Some("ns".into());
        object.metadata.owner_references = owner.map(|uid| {
            vec![OwnerReference {
                api_version: "gkm.io/v1alpha1".into(),
                kind: "GKMCache".into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
        object
    }

    fn cache(name: &str) -> Option<ObjectRef<GKMCache>> {
        Some(ObjectRef::new(name).within("ns"))
    }

    #[test]
    fn a_deleted_or_changed_release_is_forgotten_and_names_its_cache() {
        let releases = Releases::default();
        releases.record("uid-a", &release("sha256:a"));
        let mut restorer = Restorer::default();
        // As the operator wrote it: nothing to do.
        let written = object("a", Some("uid-a"), "sha256:a");
        let seen = restorer.observe::<GKMCache>(&Event::Apply(written.clone()), &releases);
        assert_eq!(seen, None);
        assert_eq!(releases.written("uid-a"), Some(release("sha256:a")));
        // Changed by another hand: forgotten, the cache reconciled.
        let edited = object("a", Some("uid-a"), "sha256:forged");
        let seen = restorer.observe::<GKMCache>(&Event::Apply(edited), &releases);
        assert_eq!(seen, cache("a"));
        assert_eq!(releases.written("uid-a"), None);
        // Deleted: likewise.
        releases.record("uid-a", &release("sha256:a"));
        let seen = restorer.observe::<GKMCache>(&Event::Delete(written), &releases);
        assert_eq!(seen, cache("a"));
        assert_eq!(releases.written("uid-a"), None);
    }

    #[test]
    fn releases_the_operator_does_not_own_or_remember_are_left_alone() {
        let releases = Releases::default();
        let mut restorer = Restorer::default();
        let stray = object("stray", None, "sha256:a");
        assert_eq!(
            restorer.observe::<GKMCache>(&Event::Delete(stray.clone()), &releases),
            None
        );
        assert_eq!(
            restorer.observe::<GKMCache>(&Event::Apply(stray), &releases),
            None
        );
        // Owned but not remembered (written before a restart): the cache's
        // reconcile reads it before writing anyway.
        let unknown = object("b", Some("uid-b"), "sha256:b");
        assert_eq!(
            restorer.observe::<GKMCache>(&Event::Apply(unknown), &releases),
            None
        );
    }

    #[test]
    fn a_relist_forgets_the_releases_it_no_longer_lists() {
        let releases = Releases::default();
        releases.record("uid-kept", &release("sha256:a"));
        releases.record("uid-gone", &release("sha256:a"));
        let mut restorer = Restorer::default();
        restorer.observe::<GKMCache>(&Event::Init, &releases);
        let kept = object("kept", Some("uid-kept"), "sha256:a");
        assert_eq!(
            restorer.observe::<GKMCache>(&Event::InitApply(kept), &releases),
            None
        );
        restorer.observe::<GKMCache>(&Event::InitDone, &releases);
        assert_eq!(releases.written("uid-kept"), Some(release("sha256:a")));
        assert_eq!(releases.written("uid-gone"), None);
    }
}
