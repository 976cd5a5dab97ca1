//! What the operator and agent need from both cache kinds, so one generic
//! reconcile serves `GKMCache` and `ClusterGKMCache`.

use std::fmt;

use kube::{Api, Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::crd::{
    CacheNodeStatus, CacheSpec, CacheStatus, ClusterGKMCache, ClusterGKMCacheNode, GKMCache,
    GKMCacheNode,
};

/// Whether a cache is namespaced or cluster-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// A `GKMCache`.
    Namespaced,
    /// A `ClusterGKMCache`.
    Cluster,
}

/// Names one cache of either kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey {
    /// Its kind.
    pub scope: Scope,
    /// Its namespace (`None` for a cluster cache).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

impl CacheKey {
    /// The key of the cache `name` in `namespace`: a `GKMCache` there, or a
    /// `ClusterGKMCache` when `namespace` is `None`.
    pub fn named(namespace: Option<&str>, name: &str) -> CacheKey {
        CacheKey {
            scope: match namespace {
                Some(_) => Scope::Namespaced,
                None => Scope::Cluster,
            },
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "GKMCache {ns}/{}", self.name),
            None => write!(f, "ClusterGKMCache {}", self.name),
        }
    }
}

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
    /// Namespaced or cluster.
    const SCOPE: Scope;
    /// The spec.
    fn cache_spec(&self) -> &CacheSpec;
    /// The status, if written.
    fn cache_status(&self) -> Option<&CacheStatus>;
    /// The API for this kind, in `namespace` when it is namespaced.
    fn api(client: Client, namespace: Option<&str>) -> Api<Self>;

    /// This cache's key.
    fn key(&self) -> CacheKey {
        CacheKey {
            scope: Self::SCOPE,
            namespace: self.meta().namespace.clone(),
            name: self.meta().name.clone().unwrap_or_default(),
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

impl CacheObject for GKMCache {
    type NodeReport = GKMCacheNode;
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
