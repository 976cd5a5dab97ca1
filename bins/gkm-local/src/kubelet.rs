//! What the kubelet does with a pod's inline `csi.gkm.io` volume, done by
//! hand: simulated nodes have no kubelet, so the stack publishes and
//! unpublishes volumes on the node's real CSI driver itself.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use gkm_k8s_kubelet::proto::csi::node_client::NodeClient;
use gkm_k8s_kubelet::proto::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode,
};
use gkm_k8s_kubelet::proto::csi::{
    NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
};
use std::time::Duration;

use gkm_k8s_kubelet::socket::connect;

/// A pod's inline volume of a cache.
#[derive(Debug, Clone)]
pub struct PodVolume {
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// The volume attributes (`csi.gkm.io/GKMCache`, `csi.gkm.io/namespace`, …).
    pub attributes: Vec<(String, String)>,
}

impl PodVolume {
    /// A volume of the `GKMCache` `namespace/name` for pod `pod_namespace/pod_name`.
    pub fn gkmcache(pod_namespace: &str, pod_name: &str, namespace: &str, name: &str) -> PodVolume {
        PodVolume {
            pod_namespace: pod_namespace.into(),
            pod_name: pod_name.into(),
            attributes: vec![
                (gkm_k8s_csi::ATTR_CACHE.into(), name.into()),
                (gkm_k8s_csi::ATTR_NAMESPACE.into(), namespace.into()),
            ],
        }
    }

    /// The volume id a kubelet would choose (unique per pod and volume).
    pub fn volume_id(&self) -> String {
        format!("csi-{}-{}-cache", self.pod_namespace, self.pod_name)
    }
}

/// Publishes `volume` at `target` on the driver at `socket`, as the kubelet
/// does when the pod starts.
pub async fn publish(
    socket: &Path,
    target: &Path,
    volume: &PodVolume,
) -> Result<(), tonic::Status> {
    let mut context: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        (
            "csi.storage.k8s.io/pod.namespace",
            volume.pod_namespace.as_str(),
        ),
        ("csi.storage.k8s.io/pod.name", volume.pod_name.as_str()),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    context.extend(volume.attributes.iter().cloned());
    let request = NodePublishVolumeRequest {
        volume_id: volume.volume_id(),
        target_path: target.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: access_mode::Mode::SingleNodeReaderOnly as i32,
            }),
        }),
        readonly: true,
        volume_context: context,
        ..Default::default()
    };
    let channel = connect(socket, Duration::from_secs(5))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    NodeClient::new(channel)
        .node_publish_volume(request)
        .await
        .map(|_| ())
}

/// Unpublishes `volume` from `target`, as the kubelet does when the pod goes.
pub async fn unpublish(
    socket: &Path,
    target: &Path,
    volume: &PodVolume,
) -> Result<(), tonic::Status> {
    let request = NodeUnpublishVolumeRequest {
        volume_id: volume.volume_id(),
        target_path: target.display().to_string(),
    };
    let channel = connect(socket, Duration::from_secs(5))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    NodeClient::new(channel)
        .node_unpublish_volume(request)
        .await
        .map(|_| ())
}

/// Where the kubelet would mount `volume` for its pod on `node_dir`.
pub fn target_path(node_dir: &Path, volume: &PodVolume) -> PathBuf {
    node_dir
        .join("pods")
        .join(format!("{}_{}", volume.pod_namespace, volume.pod_name))
        .join("cache")
}
