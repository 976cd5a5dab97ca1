//! Naming one cache resource of either kind: a `GKMCache` in a namespace or
//! a cluster-wide `ClusterGKMCache`. The scope and the namespace are one
//! value, so they cannot disagree.

use std::fmt;

use serde::Serialize;

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
///
/// ```
/// use gkm_core::cache_key::{CacheKey, Scope};
/// let key = CacheKey::named(Some("team-a"), "vector-add");
/// assert_eq!(key.scope(), Scope::Namespaced);
/// assert_eq!(key.namespace(), Some("team-a"));
/// assert_eq!(key.to_string(), "GKMCache team-a/vector-add");
/// assert_eq!(CacheKey::named(None, "shared").to_string(), "ClusterGKMCache shared");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CacheKey {
    /// A `GKMCache`.
    Namespaced {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A `ClusterGKMCache`.
    Cluster {
        /// Its name.
        name: String,
    },
}

impl CacheKey {
    /// The key of the cache `name` in `namespace`: a `GKMCache` there, or a
    /// `ClusterGKMCache` when `namespace` is `None`.
    pub fn named(namespace: Option<&str>, name: &str) -> CacheKey {
        match namespace {
            Some(namespace) => CacheKey::namespaced(namespace, name),
            None => CacheKey::cluster(name),
        }
    }

    /// The `GKMCache` `name` in `namespace`.
    pub fn namespaced(namespace: impl Into<String>, name: impl Into<String>) -> CacheKey {
        CacheKey::Namespaced {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The `ClusterGKMCache` `name`.
    pub fn cluster(name: impl Into<String>) -> CacheKey {
        CacheKey::Cluster { name: name.into() }
    }

    /// Its kind.
    pub fn scope(&self) -> Scope {
        match self {
            CacheKey::Namespaced { .. } => Scope::Namespaced,
            CacheKey::Cluster { .. } => Scope::Cluster,
        }
    }

    /// Its namespace (`None` for a cluster cache).
    pub fn namespace(&self) -> Option<&str> {
        match self {
            CacheKey::Namespaced { namespace, .. } => Some(namespace),
            CacheKey::Cluster { .. } => None,
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            CacheKey::Namespaced { name, .. } | CacheKey::Cluster { name } => name,
        }
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheKey::Namespaced { namespace, name } => write!(f, "GKMCache {namespace}/{name}"),
            CacheKey::Cluster { name } => write!(f, "ClusterGKMCache {name}"),
        }
    }
}
