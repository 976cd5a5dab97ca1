//! The body of the CSI fuzz target (`fuzz/`), over the raw bytes libFuzzer
//! hands it; [`TARGETS`] names it for replaying the corpus and regression
//! inputs on stable (`gkm_oci::fuzzing::replay`). It must return without
//! panicking whatever the input.

use std::collections::HashMap;

use arbitrary::Unstructured;

use crate::capture::tree::{CAPTURE_MAX_BYTES, CAPTURES_DIR};
use crate::volume::Volume;

use gkm_k8s_kubelet::proto::csi::volume_capability::{AccessType, BlockVolume, MountVolume};
use gkm_k8s_kubelet::proto::csi::{NodePublishVolumeRequest, VolumeCapability};
use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CLUSTER_CACHE, ATTR_NAMESPACE, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE,
    CTX_POD_UID,
};

/// The fuzz targets whose bodies live in this crate, by target name.
pub const TARGETS: &[(&str, Body)] = &[("csi_publish", csi_publish)];

/// A fuzz target's body over the raw bytes libFuzzer hands it.
pub type Body = fn(&[u8]);

/// Keys of a publish request's volume context: the attributes a pod sets
/// and the pod info the kubelet adds, so structured input reaches the checks.
const CONTEXT_KEYS: &[&str] = &[
    ATTR_CACHE,
    ATTR_CLUSTER_CACHE,
    ATTR_NAMESPACE,
    CTX_EPHEMERAL,
    CTX_POD_NAMESPACE,
    CTX_POD_NAME,
    CTX_POD_UID,
    gkm_k8s_node::volume::ATTR_CAPTURE,
    gkm_k8s_node::volume::ATTR_CAPTURED_POD,
    gkm_k8s_node::volume::ATTR_CAPTURE_MAX_BYTES,
];

/// Build a `NodePublishVolumeRequest` from structured input (volume id,
/// target path, access type, a volume context of known and arbitrary keys)
/// and check it. What is accepted names a cache and a pod, with an absolute
/// target path.
pub fn csi_publish(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let text = |u: &mut Unstructured| u.arbitrary::<String>().unwrap_or_default();
    let volume_id = text(&mut u);
    let target_path = text(&mut u);
    let access_type = match u.int_in_range(0..=2u8).unwrap_or(0) {
        0 => Some(AccessType::Mount(MountVolume::default())),
        1 => Some(AccessType::Block(BlockVolume::default())),
        _ => None,
    };
    let mut volume_context = HashMap::new();
    let entries = u.int_in_range(0..=10u8).unwrap_or(0);
    for _ in 0..entries {
        let key = if u.ratio(1, 6).unwrap_or(false) {
            text(&mut u)
        } else {
            u.choose(CONTEXT_KEYS)
                .map(|k| k.to_string())
                .unwrap_or_default()
        };
        let value = if u.ratio(1, 2).unwrap_or(false) {
            "true".to_string()
        } else {
            text(&mut u)
        };
        volume_context.insert(key, value);
    }
    let req = NodePublishVolumeRequest {
        volume_id,
        target_path,
        volume_capability: u
            .arbitrary::<bool>()
            .unwrap_or(true)
            .then_some(VolumeCapability {
                access_type,
                access_mode: None,
            }),
        volume_context,
        ..Default::default()
    };
    match crate::volume::parse(&req) {
        Ok(Volume::Capture(parsed)) => {
            let root = std::path::Path::new("/store");
            let tree = parsed.tree(root);
            assert!(
                tree.starts_with(root.join(CAPTURES_DIR))
                    && tree.components().count() == 6
                    && !tree
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir)),
                "a capture tree outside the store: {}",
                tree.display()
            );
            assert!(parsed.max_bytes <= CAPTURE_MAX_BYTES);
        }
        Ok(Volume::Cache(parsed)) => {
            assert!(
                parsed.target_path.is_absolute(),
                "accepted a relative target path"
            );
            assert!(
                !parsed.cache.name().is_empty(),
                "accepted a request naming no cache"
            );
            assert!(
                !parsed.pod.namespace.is_empty(),
                "accepted a request with no pod namespace"
            );
        }
        Err(_) => {}
    }
}
