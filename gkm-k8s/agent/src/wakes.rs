//! Which watched changes wake the agent.
//!
//! The agent acts on a cache's spec, its resolved digest, the operator's
//! verdict and whether it is being deleted. The operator also rewrites each
//! cache's counts and conditions as nodes report, so waking every agent on
//! every status write would make each node's report wake all the others:
//! passes would grow with nodes × reports. Of its Node, the agent reads the
//! labels (a cache's `nodeSelector`) and the uid (its reports' owner); the
//! kubelet's status updates change neither. Only a change to what the agent
//! reads wakes it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use crate::view::CacheView;

use gkm_k8s_api::cache_object::CacheObject;

/// The last seen fingerprint of each watched object's agent-relevant
/// fields, by uid.
#[derive(Default)]
pub(super) struct Seen {
    by_uid: HashMap<String, u64>,
}

impl Seen {
    /// Whether `event` changes anything the agent acts on, `view` being what
    /// it reads of one object.
    pub(super) fn wakes<K: ResourceExt>(
        &mut self,
        event: &Event<K>,
        view: fn(&K) -> Value,
    ) -> bool {
        match event {
            Event::Apply(object) | Event::InitApply(object) => {
                let uid = object.uid().unwrap_or_else(|| object.name_any());
                let print = fingerprint(&view(object));
                self.by_uid.insert(uid, print) != Some(print)
            }
            Event::Delete(object) => {
                self.by_uid
                    .remove(&object.uid().unwrap_or_else(|| object.name_any()));
                true
            }
            // A relist may have missed deletions: look again once it is in.
            Event::Init => false,
            Event::InitDone => true,
        }
    }
}

/// What the agent reads of a cache ([`CacheView`]), to fingerprint.
pub(super) fn cache_view<K: CacheObject>(cache: &K) -> Value {
    serde_json::to_value(CacheView::of(cache)).unwrap_or(Value::Null)
}

/// What the agent reads of its Node (the uid is [`Seen`]'s key): the labels.
pub(super) fn node_view(node: &PartialObjectMeta<Node>) -> Value {
    json!({ "labels": node.labels() })
}

fn fingerprint(view: &Value) -> u64 {
    let mut hasher = DefaultHasher::new();
    view.to_string().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CacheSpec, CacheStatus, GKMCache, GKMCacheSpec, VerificationStatus};
    use kube::core::PartialObjectMetaExt;

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
        let mut seen = Seen::default();
        assert!(seen.wakes(&Event::Apply(cache("sha256:a", 1)), cache_view));
        // The operator counted another node: nothing for the agent.
        assert!(!seen.wakes(&Event::Apply(cache("sha256:a", 2)), cache_view));
        // The tag moved.
        assert!(seen.wakes(&Event::Apply(cache("sha256:b", 2)), cache_view));
        // Deleting the cache.
        let mut deleting = cache("sha256:b", 2);
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(seen.wakes(&Event::Apply(deleting.clone()), cache_view));
        assert!(seen.wakes(&Event::Delete(deleting), cache_view));
        // After a relist, the agent looks again.
        assert!(seen.wakes(&Event::<GKMCache>::InitDone, cache_view));
    }

    fn node(uid: &str, labels: &[(&str, &str)], version: &str) -> PartialObjectMeta<Node> {
        let mut node: PartialObjectMeta<Node> = kube::core::ObjectMeta {
            name: Some("n1".into()),
            uid: Some(uid.into()),
            resource_version: Some(version.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
        .into_response_partial();
        node.metadata.annotations = Some([("heartbeat".to_string(), version.to_string())].into());
        node
    }

    #[test]
    fn the_nodes_labels_wake_the_agent_but_its_status_updates_do_not() {
        let mut seen = Seen::default();
        assert!(seen.wakes(&Event::Apply(node("u1", &[("zone", "a")], "1")), node_view));
        // The kubelet updated the Node: a new resourceVersion, same labels.
        assert!(!seen.wakes(&Event::Apply(node("u1", &[("zone", "a")], "2")), node_view));
        // Someone relabelled it.
        assert!(seen.wakes(&Event::Apply(node("u1", &[("zone", "b")], "3")), node_view));
        // The Node was recreated: a new uid, whose reports need a new owner.
        assert!(seen.wakes(&Event::Apply(node("u2", &[("zone", "b")], "4")), node_view));
    }
}
