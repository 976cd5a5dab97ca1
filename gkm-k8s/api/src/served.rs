//! Waiting until the apiserver serves the kinds a daemon watches, for its
//! `/readyz`.

use gkm_k8s_runtime::readiness::{Readiness, ready_when_listable};

/// Marks `readiness` ready for `gkmcaches` and `clustergkmcaches` once each
/// can be listed (in the background).
pub fn ready_when_caches_listable(client: &kube::Client, readiness: &Readiness) {
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::GKMCache>::all(client.clone()),
        readiness.check("gkmcaches"),
    ));
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::ClusterGKMCache>::all(client.clone()),
        readiness.check("clustergkmcaches"),
    ));
}

/// Marks `readiness` ready for `gkmcachereleases` and
/// `clustergkmcachereleases` (what the agents watch) once each can be
/// listed (in the background).
pub fn ready_when_releases_listable(client: &kube::Client, readiness: &Readiness) {
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::GKMCacheRelease>::all(client.clone()),
        readiness.check("gkmcachereleases"),
    ));
    tokio::spawn(ready_when_listable(
        kube::Api::<crate::crd::ClusterGKMCacheRelease>::all(client.clone()),
        readiness.check("clustergkmcachereleases"),
    ));
}
