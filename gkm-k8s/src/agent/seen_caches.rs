//! Which cache changes wake the agent.
//!
//! The agent acts on a cache's spec, its resolved digest, the operator's
//! verdict and whether it is being deleted. The operator also rewrites each
//! cache's counts and conditions as nodes report, so waking every agent on
//! every status write would make each node's report wake all the others:
//! passes would grow with nodes × reports. Only a change to what the agent
//! reads wakes it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::cache_object::CacheObject;

/// The last seen fingerprint of each cache's agent-relevant fields.
#[derive(Default)]
pub(super) struct SeenCaches {
    by_uid: HashMap<String, u64>,
}

impl SeenCaches {
    /// Whether `event` changes anything the agent acts on.
    pub(super) fn wakes<K: CacheObject>(&mut self, event: &Event<K>) -> bool {
        match event {
            Event::Apply(cache) | Event::InitApply(cache) => {
                let uid = cache.uid().unwrap_or_else(|| cache.name_any());
                let print = fingerprint(cache);
                self.by_uid.insert(uid, print) != Some(print)
            }
            Event::Delete(cache) => {
                self.by_uid
                    .remove(&cache.uid().unwrap_or_else(|| cache.name_any()));
                true
            }
            // A relist may have missed deletions: look again once it is in.
            Event::Init => false,
            Event::InitDone => true,
        }
    }
}

/// A hash of what the agent reads of a cache: its spec, resolved digest,
/// verdict and deletion.
fn fingerprint<K: CacheObject>(cache: &K) -> u64 {
    let status = cache.cache_status();
    let view = serde_json::json!({
        "spec": cache.cache_spec(),
        "resolved": status.and_then(|s| s.resolved_digest.as_deref()),
        "verification": status.and_then(|s| s.verification.as_ref()),
        "deleting": cache.meta().deletion_timestamp.is_some(),
    });
    let mut hasher = DefaultHasher::new();
    view.to_string().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CacheSpec, CacheStatus, GKMCache, GKMCacheSpec, VerificationStatus};

    fn cache(resolved: &str, nodes: i32) -> GKMCache {
        let mut cache = GKMCache::new(
            "c",
            GKMCacheSpec {
                cache: CacheSpec {
                    image: "r/c:v1".into(),
                    ..CacheSpec::default()
                },
            },
        );
        cache.metadata.uid = Some("u".into());
        let mut status = CacheStatus {
            resolved_digest: Some(resolved.into()),
            verification: Some(VerificationStatus::default()),
            ..CacheStatus::default()
        };
        status.counts.node_cnt = nodes;
        cache.status = Some(status);
        cache
    }

    #[test]
    fn counts_do_not_wake_the_agent_but_a_new_digest_does() {
        let mut seen = SeenCaches::default();
        assert!(seen.wakes(&Event::Apply(cache("sha256:a", 1))));
        // The operator counted another node: nothing for the agent.
        assert!(!seen.wakes(&Event::Apply(cache("sha256:a", 2))));
        // The tag moved.
        assert!(seen.wakes(&Event::Apply(cache("sha256:b", 2))));
        // Deleting the cache.
        let mut deleting = cache("sha256:b", 2);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(seen.wakes(&Event::Apply(deleting.clone())));
        assert!(seen.wakes(&Event::Delete(deleting)));
        // After a relist, the agent looks again.
        assert!(seen.wakes(&Event::<GKMCache>::InitDone));
    }
}
