//! Waiting until the apiserver serves gkm's cache kinds, for a daemon's
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
