//! Which watched changes wake the agent.
//!
//! The agent acts on each cache's release (what the operator publishes for
//! the nodes: the digest, its verdict, the image's variants, whether the
//! cache is being deleted), which the operator writes only when that
//! changes, never for the counts nodes' reports change; a change to its
//! metadata alone (managed fields) wakes nothing. Of its Node, the agent reads the
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

use gkm_k8s_api::cache_object::ReleaseObject;

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

/// What the agent reads of a cache's release, to fingerprint.
pub(super) fn release_view<R: ReleaseObject>(release: &R) -> Value {
    serde_json::to_value(release.release()).unwrap_or(Value::Null)
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
    use gkm_k8s_api::crd::{CacheRelease, GKMCacheRelease};
    use kube::core::PartialObjectMetaExt;

    fn release(digest: &str, version: &str) -> GKMCacheRelease {
        let mut release = <GKMCacheRelease as ReleaseObject>::new(
            "c",
            CacheRelease {
                image: "r/c:v1".into(),
                digest: Some(digest.into()),
                deliverable: true,
                ..CacheRelease::default()
            },
        );
        release.metadata.uid = Some("u".into());
        release.metadata.resource_version = Some(version.into());
        release
    }

    #[test]
    fn a_new_digest_wakes_the_agent_but_metadata_alone_does_not() {
        let mut seen = Seen::default();
        assert!(seen.wakes(&Event::Apply(release("sha256:a", "1")), release_view));
        // Written again with the same content (a new resourceVersion).
        assert!(!seen.wakes(&Event::Apply(release("sha256:a", "2")), release_view));
        // The tag moved.
        assert!(seen.wakes(&Event::Apply(release("sha256:b", "3")), release_view));
        // Deleting the cache.
        let mut deleting = release("sha256:b", "4");
        deleting.spec.release.deleting = true;
        assert!(seen.wakes(&Event::Apply(deleting.clone()), release_view));
        assert!(seen.wakes(&Event::Delete(deleting), release_view));
        // After a relist, the agent looks again.
        assert!(seen.wakes(&Event::<GKMCacheRelease>::InitDone, release_view));
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
