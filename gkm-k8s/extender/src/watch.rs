//! The watches that feed the index: Nodes, Pods (through a reflector, whose
//! store bind reads), gkm's node reports, caches and quotas. Each marks a
//! readiness check once its first list is in.

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::index::Index;
use super::server::Extender;
use gkm_k8s_api::cache_object::{CacheKey, CacheObject, NodeReport};
use gkm_k8s_api::crd::{ClusterGKMCache, ClusterGKMCacheNode, GKMCache, GKMCacheNode, GKMGPUQuota};
use gkm_k8s_runtime::readiness::{Readiness, ReadyCheck};
use gkm_k8s_runtime::relist::Relist;

/// An object the index follows.
pub trait Indexed:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static
{
    /// What identifies it in the index.
    type Key: Hash + Eq + Send;
    /// Its key.
    fn key(&self) -> Self::Key;
    /// Records it.
    fn upsert(&self, index: &mut Index);
    /// Forgets it.
    fn delete(&self, index: &mut Index);
    /// Keeps only the objects of this kind whose keys are in `keys`.
    fn retain(index: &mut Index, keys: &HashSet<Self::Key>);
}

impl Indexed for Node {
    type Key = String;
    fn key(&self) -> String {
        self.name_any()
    }
    fn upsert(&self, index: &mut Index) {
        index.upsert_node(self);
    }
    fn delete(&self, index: &mut Index) {
        index.remove_node(&self.name_any());
    }
    fn retain(index: &mut Index, keys: &HashSet<String>) {
        index.retain_nodes(keys);
    }
}

impl Indexed for Pod {
    type Key = String;
    fn key(&self) -> String {
        self.metadata.uid.clone().unwrap_or_default()
    }
    fn upsert(&self, index: &mut Index) {
        index.upsert_pod(self);
    }
    fn delete(&self, index: &mut Index) {
        index.remove_pod(&self.key());
    }
    fn retain(index: &mut Index, keys: &HashSet<String>) {
        index.retain_pods(keys);
    }
}

impl Indexed for GKMGPUQuota {
    type Key = (String, String);
    fn key(&self) -> (String, String) {
        (self.namespace().unwrap_or_default(), self.name_any())
    }
    fn upsert(&self, index: &mut Index) {
        let (ns, name) = self.key();
        index.upsert_quota(&ns, &name, self.spec.limits.clone());
    }
    fn delete(&self, index: &mut Index) {
        let (ns, name) = self.key();
        index.remove_quota(&ns, &name);
    }
    fn retain(index: &mut Index, keys: &HashSet<(String, String)>) {
        index.retain_quotas(keys);
    }
}

/// The node reports of both kinds: keyed by namespace (none for a
/// `ClusterGKMCacheNode`) and node name.
macro_rules! indexed_report {
    ($kind:ty, $cluster:expr) => {
        impl Indexed for $kind {
            type Key = (Option<String>, String);
            fn key(&self) -> Self::Key {
                (self.namespace(), self.name_any())
            }
            fn upsert(&self, index: &mut Index) {
                if let Some(status) = self.report() {
                    index.upsert_report(self.namespace().as_deref(), &self.name_any(), status);
                }
            }
            fn delete(&self, index: &mut Index) {
                index.remove_report(self.namespace().as_deref(), &self.name_any());
            }
            fn retain(index: &mut Index, keys: &HashSet<Self::Key>) {
                index.retain_reports($cluster, keys);
            }
        }
    };
}

indexed_report!(GKMCacheNode, false);
indexed_report!(ClusterGKMCacheNode, true);

/// Both cache kinds: the digest each resolves to now.
macro_rules! indexed_cache {
    ($kind:ty) => {
        impl Indexed for $kind {
            type Key = CacheKey;
            fn key(&self) -> CacheKey {
                CacheObject::key(self)
            }
            fn upsert(&self, index: &mut Index) {
                let digest = self.resolved_digest().map(|d| d.to_string());
                index.upsert_cache(CacheObject::key(self), digest);
            }
            fn delete(&self, index: &mut Index) {
                index.upsert_cache(CacheObject::key(self), None);
            }
            fn retain(index: &mut Index, keys: &HashSet<CacheKey>) {
                index.retain_caches(<$kind as CacheObject>::SCOPE, keys);
            }
        }
    };
}

indexed_cache!(GKMCache);
indexed_cache!(ClusterGKMCache);

/// Applies a watch stream to the index until it ends. After each (re)list
/// the objects it did not list are forgotten, and `synced` is set.
pub async fn follow<K: Indexed>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    extender: &Extender,
    synced: ReadyCheck,
) {
    let mut relist = Relist::<HashSet<K::Key>>::default();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                warn!(kind = %K::kind(&Default::default()), error = %e, "watch failed; retrying");
                continue;
            }
        };
        let shown = relist.observe(&event, |keys, object| {
            keys.insert(object.key());
        });
        match event {
            watcher::Event::Init => {}
            watcher::Event::InitApply(object) => object.upsert(&mut extender.write()),
            watcher::Event::InitDone => {
                if let Some(keys) = shown {
                    K::retain(&mut extender.write(), &keys);
                }
                synced.set(true);
            }
            watcher::Event::Apply(object) => object.upsert(&mut extender.write()),
            watcher::Event::Delete(object) => object.delete(&mut extender.write()),
        }
    }
}

/// Watches every kind the extender reads, feeding `extender`'s index and
/// the pod store behind `pods`, until the process stops. Registers one
/// readiness check per kind in `readiness` before it returns, so nothing is
/// ready until every first list is in.
pub fn run(
    client: Client,
    extender: Arc<Extender>,
    pods: Writer<Pod>,
    readiness: &Readiness,
) -> impl Future<Output = ()> + Send + 'static {
    fn watch<K: Indexed>(
        api: Api<K>,
    ) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
        watcher(api, watcher::Config::default()).default_backoff()
    }
    let nodes = readiness.check("nodes");
    let pod_check = readiness.check("pods");
    let quotas = readiness.check("gkmgpuquotas");
    let reports = readiness.check("gkmcachenodes");
    let cluster_reports = readiness.check("clustergkmcachenodes");
    let caches = readiness.check("gkmcaches");
    let cluster_caches = readiness.check("clustergkmcaches");
    async move {
        let pod_stream = reflector::reflector(
            pods,
            watch(Api::<Pod>::all(client.clone())).modify(|pod: &mut Pod| {
                pod.metadata.managed_fields = None;
            }),
        );
        let e = &extender;
        futures::join!(
            follow(watch(Api::<Node>::all(client.clone())), e, nodes),
            follow(pod_stream, e, pod_check),
            follow(watch(Api::<GKMGPUQuota>::all(client.clone())), e, quotas),
            follow(watch(Api::<GKMCacheNode>::all(client.clone())), e, reports),
            follow(
                watch(Api::<ClusterGKMCacheNode>::all(client.clone())),
                e,
                cluster_reports
            ),
            follow(watch(Api::<GKMCache>::all(client.clone())), e, caches),
            follow(
                watch(Api::<ClusterGKMCache>::all(client)),
                e,
                cluster_caches
            ),
        );
    }
}
