//! The CSI Node service: publishes the [`Volume`] a request asks for, and
//! unpublishes it (see the [crate docs](crate) for the contract). It reads
//! each request once ([`crate::volume::parse`]) and hands the volume to
//! what mounts it: a view of a cache ([`Views`]), one keeping its upper for
//! a delta capture ([`DeltaUpper`]), or a capture volume ([`CaptureTrees`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gkm_core::store_layout::StoreLayout;
use gkm_k8s_kubelet::proto::csi::node_server::Node;
use gkm_k8s_kubelet::proto::csi::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use tonic::{Request, Response, Status};

use crate::capture::CaptureTrees;
use crate::capture::admission::CaptureConfig;
use crate::capture::delta::DeltaUpper;
use crate::capture::{release, tree};
use crate::metrics::CsiMetrics;
use crate::views::{OwnUpper, Views, ViewsConfig};
use crate::volume::{Volume, absolute_path, parse, required};

/// The Node service of `csi.gkm.io` on one node.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    views: Views,
    captures: CaptureTrees,
    /// Publish and unpublish run one at a time: they are rare, and this
    /// keeps "check, record, mount" free of races between two requests.
    /// A relocation layer a publish needs is made before it is taken
    /// ([`Views::relocate`]).
    lock: Arc<Mutex<()>>,
}

impl NodeService {
    /// The service for node `node_name`, delivering from `store` (whose root
    /// also holds the delivery index and the mount records), allowing
    /// `capture` of capture volumes and `views` of the views of a cache.
    pub fn new(
        node_name: impl Into<String>,
        store: StoreLayout,
        capture: CaptureConfig,
        views: ViewsConfig,
    ) -> NodeService {
        let node_name = node_name.into();
        let lock = Arc::new(Mutex::new(()));
        let captures = CaptureTrees::new(store.root(), node_name.clone(), capture, lock.clone());
        NodeService {
            inner: Arc::new(Inner {
                views: Views::new(node_name, store, views),
                captures,
                lock,
            }),
        }
    }

    /// The node's name (the CSI node id).
    pub fn node_name(&self) -> &str {
        self.inner.views.node_name()
    }

    /// The counts the driver serves on `/metrics` ([`crate::CsiCollector`]).
    pub fn metrics(&self) -> &CsiMetrics {
        self.inner.views.metrics()
    }

    /// The capture trees, and what is allowed of them.
    pub fn captures(&self) -> &CaptureTrees {
        &self.inner.captures
    }

    /// The store root (holding the node store, its records and the
    /// captured trees).
    pub fn store_root(&self) -> &std::path::Path {
        self.inner.views.root()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes a checked `volume`: the blocking part of
    /// `NodePublishVolume`.
    pub fn publish(&self, volume: &Volume) -> Result<(), Status> {
        let inner = &*self.inner;
        if let Volume::Cache(cache) = volume {
            match DeltaUpper::of(cache) {
                None => inner.views.relocate(cache, &OwnUpper)?,
                Some(delta) => inner.views.relocate(cache, &delta)?,
            }
        }
        let _guard = self.lock();
        match volume {
            Volume::Cache(cache) => match DeltaUpper::of(cache) {
                None => inner.views.publish(cache, &mut OwnUpper),
                Some(mut delta) => {
                    inner.captures.admit(delta.capture())?;
                    inner.views.publish(cache, &mut delta)
                }
            },
            Volume::Capture(capture) => inner.captures.publish(&inner.views, capture),
        }
    }

    /// Removes every upper no mounted writable view names
    /// (the views' `sweep_uppers`). The driver calls it when it starts; the
    /// volume ids removed.
    pub fn sweep_uppers(&self) -> std::io::Result<Vec<String>> {
        let _guard = self.lock();
        self.inner.views.sweep_uppers()
    }

    /// Removes the relocation layers no view stacks, made more than `grace`
    /// ago (the views' `remove_unused_layers`); the layers removed.
    pub fn remove_unused_layers(
        &self,
        grace: std::time::Duration,
    ) -> std::io::Result<Vec<std::path::PathBuf>> {
        let _guard = self.lock();
        self.inner.views.remove_unused_layers(grace)
    }

    /// Unmounts and removes the captured tree of pod `uid` for `namespace`'s
    /// `capture` (its capture is over), and its capture's directory when
    /// that was its last tree ([`CaptureTrees::release`]).
    pub fn release_capture(&self, namespace: &str, capture: &str, uid: &str) -> Result<(), Status> {
        self.inner.captures.release(namespace, capture, uid)
    }

    /// The blocking part of `NodeUnpublishVolume`: unmount `target`, remove
    /// it, forget the record and the view's upper; a capture tree that left
    /// its last pod may go with it (see [`crate::release_captures`]). Succeeds
    /// when there is nothing to undo.
    pub fn unpublish(&self, volume_id: &str, target: &std::path::Path) -> Result<(), Status> {
        let tree = tree::tree_behind(self.store_root(), target).unwrap_or(None);
        {
            let _guard = self.lock();
            self.inner.views.unpublish(volume_id, target)?;
        }
        if let Some((capture, uid)) = tree {
            release::unmounted(&self.inner.captures, &capture, &uid);
        }
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("worker thread: {e}")))?
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let volume = parse(request.get_ref()).inspect_err(|status| {
            tracing::warn!(volume = %request.get_ref().volume_id, error = %status.message(), "publish refused");
        })?;
        let svc = self.clone();
        let volume_id = volume.volume_id().to_string();
        blocking(move || svc.publish(&volume)).await.inspect_err(|status| {
            tracing::warn!(volume = %volume_id, code = ?status.code(), error = %status.message(), "publish refused");
        })?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let volume_id = required(&req.volume_id, "volume_id")?.to_string();
        let target: PathBuf = absolute_path(&req.target_path, "target_path")?;
        let svc = self.clone();
        blocking(move || svc.unpublish(&volume_id, &target)).await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// `VOLUME_MOUNT_GROUP` only (the kubelet passes the pod's fsGroup,
    /// which may write in a writable view, and changes no ownership
    /// itself): no staging, no stats, no expansion.
    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use gkm_k8s_kubelet::proto::csi::NodeServiceCapability;
        use gkm_k8s_kubelet::proto::csi::node_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc {
                    r#type: rpc::Type::VolumeMountGroup as i32,
                })),
            }],
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node_name().to_string(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releasing_one_pods_tree_keeps_the_other_pods_and_the_last_takes_the_directories() {
        let store = tempfile::tempdir().unwrap();
        let node = NodeService::new(
            "node-a",
            StoreLayout::new(store.path()),
            CaptureConfig::default(),
            ViewsConfig::default(),
        );
        let first = "0b7c1a52-5d0e-4c39-9a57-3f1f6f3a0a01";
        let second = "0b7c1a52-5d0e-4c39-9a57-3f1f6f3a0a02";
        let dir = tree::capture_dir(store.path(), "team-a", "warm");
        for uid in [first, second] {
            std::fs::create_dir_all(dir.join(uid)).unwrap();
            std::fs::write(dir.join(uid).join("kernel.cubin"), b"k").unwrap();
        }

        let refused = node
            .release_capture("team-a", "warm", "../warm")
            .expect_err("a uid that climbs out is refused");
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(dir.join(first).is_dir() && dir.join(second).is_dir());

        node.release_capture("team-a", "warm", first).unwrap();
        assert!(!dir.join(first).exists(), "the released tree goes");
        assert!(
            dir.join(second).join("kernel.cubin").is_file(),
            "the second pod's tree stays whole"
        );

        node.release_capture("team-a", "warm", second).unwrap();
        assert!(
            !dir.exists(),
            "the capture's directory goes with its last tree"
        );
        assert!(
            !dir.parent().unwrap().exists(),
            "the namespace's directory goes once empty"
        );
        assert!(
            node.release_capture("team-a", "warm", second).is_ok(),
            "releasing a tree already gone is not an error"
        );
    }
}
