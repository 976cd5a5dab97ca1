//! What the operator and agent need from both cache kinds, so one generic
//! reconcile serves `GKMCache` and `ClusterGKMCache`.

use std::fmt;

pub use gkm_core::cache_key::{CacheKey, Scope};

use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{
    CacheNodeStatus, CacheRelease, CacheSpec, CacheStatus, ClusterGKMCache, ClusterGKMCacheNode,
    ClusterGKMCacheRelease, ClusterGKMCacheReleaseSpec, GKMCache, GKMCacheNode, GKMCacheRelease,
    GKMCacheReleaseSpec,
};

/// A cache resource of either kind.
pub trait CacheObject:
    Resource<DynamicType = ()>
    + Clone
    + fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The node report kind that carries this kind's per-node state.
    type NodeReport: NodeReport;
    /// The release kind that carries what the nodes act on for it.
    type Release: ReleaseObject;
    /// Namespaced or cluster.
    const SCOPE: Scope;
    /// The spec.
    fn cache_spec(&self) -> &CacheSpec;
    /// The status, if written.
    fn cache_status(&self) -> Option<&CacheStatus>;
    /// The API for this kind, in `namespace` when it is namespaced.
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;

    /// The digest the operator resolved `spec.image` to, if it has.
    fn resolved_digest(&self) -> Option<gkm_core::Digest> {
        self.cache_status()?.resolved()
    }

    /// This cache's key.
    fn key(&self) -> CacheKey {
        let name = self.meta().name.clone().unwrap_or_default();
        match (Self::SCOPE, &self.meta().namespace) {
            (Scope::Namespaced, Some(namespace)) => CacheKey::namespaced(namespace, name),
            _ => CacheKey::cluster(name),
        }
    }
}

/// A node report of either kind (`GKMCacheNode`, `ClusterGKMCacheNode`).
pub trait NodeReport:
    Resource<DynamicType = ()>
    + Clone
    + fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The report, if written.
    fn report(&self) -> Option<&CacheNodeStatus>;
    /// The API for this kind, in `namespace` when it is namespaced.
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;
}

/// A release of either kind (`GKMCacheRelease`, `ClusterGKMCacheRelease`):
/// what the nodes act on for the cache of the same name and scope.
pub trait ReleaseObject:
    Resource<DynamicType = ()>
    + Clone
    + fmt::Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Namespaced or cluster, as its cache.
    const SCOPE: Scope;
    /// A release named `name` holding `release` (metadata otherwise empty).
    fn new(name: &str, release: CacheRelease) -> Self;
    /// What it holds.
    fn release(&self) -> &CacheRelease;
    /// The API for this kind, in `namespace` when it is namespaced.
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;

    /// The key of its cache.
    fn key(&self) -> CacheKey {
        let name = self.meta().name.clone().unwrap_or_default();
        match (Self::SCOPE, &self.meta().namespace) {
            (Scope::Namespaced, Some(namespace)) => CacheKey::namespaced(namespace, name),
            _ => CacheKey::cluster(name),
        }
    }
}

impl CacheObject for GKMCache {
    type NodeReport = GKMCacheNode;
    type Release = GKMCacheRelease;
    const SCOPE: Scope = Scope::Namespaced;
    fn cache_spec(&self) -> &CacheSpec {
        &self.spec.cache
    }
    fn cache_status(&self) -> Option<&CacheStatus> {
        self.status.as_ref()
    }
    fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
        match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }
}

impl CacheObject for ClusterGKMCache {
    type NodeReport = ClusterGKMCacheNode;
    type Release = ClusterGKMCacheRelease;
    const SCOPE: Scope = Scope::Cluster;
    fn cache_spec(&self) -> &CacheSpec {
        &self.spec.cache
    }
    fn cache_status(&self) -> Option<&CacheStatus> {
        self.status.as_ref()
    }
    fn api(client: Client, _namespace: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}

impl NodeReport for GKMCacheNode {
    fn report(&self) -> Option<&CacheNodeStatus> {
        self.status.as_ref()
    }
    fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
        match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }
}

impl NodeReport for ClusterGKMCacheNode {
    fn report(&self) -> Option<&CacheNodeStatus> {
        self.status.as_ref()
    }
    fn api(client: Client, _namespace: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}

impl ReleaseObject for GKMCacheRelease {
    const SCOPE: Scope = Scope::Namespaced;
    fn new(name: &str, release: CacheRelease) -> Self {
        GKMCacheRelease::new(name, GKMCacheReleaseSpec { release })
    }
    fn release(&self) -> &CacheRelease {
        &self.spec.release
    }
    fn api(client: Client, namespace: Option<&str>) -> Api<Self> {
        match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        }
    }
}

impl ReleaseObject for ClusterGKMCacheRelease {
    const SCOPE: Scope = Scope::Cluster;
    fn new(name: &str, release: CacheRelease) -> Self {
        ClusterGKMCacheRelease::new(name, ClusterGKMCacheReleaseSpec { release })
    }
    fn release(&self) -> &CacheRelease {
        &self.spec.release
    }
    fn api(client: Client, _namespace: Option<&str>) -> Api<Self> {
        Api::all(client)
    }
}
