//! The CSI Node service: publish a deliverable cache read-only into a pod,
//! unpublish it (see the [module docs](super) for the contract).

use std::fmt::Display;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gkm_core::store_layout::StoreLayout;
use jiff::Timestamp;
use tonic::{Request, Response, Status};

use crate::access::{check_pod, check_workload_namespace};
use crate::mount::{CacheTree, bind_read_only, mount_at, same_directory, unmount_all};
use crate::proto::node_server::Node;
use crate::proto::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use crate::volume::{PublishRequest, absolute_path, parse_publish, required};
use gkm_k8s_node::delivery::{DeliveryIndex, Verdict};
use gkm_k8s_node::mount_records::{MountRecord, MountRecords};

/// The Node service of `csi.gkm.io` on one node.
#[derive(Debug, Clone)]
pub struct NodeService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    node_name: String,
    store: StoreLayout,
    index: DeliveryIndex,
    mounts: MountRecords,
    /// Publish and unpublish run one at a time: they are rare, and this
    /// keeps "check, record, mount" free of races between two requests.
    lock: Mutex<()>,
}

impl NodeService {
    /// The service for node `node_name`, delivering from `store` (whose root
    /// also holds the delivery index and the mount records).
    pub fn new(node_name: impl Into<String>, store: StoreLayout) -> NodeService {
        let root = store.root().to_path_buf();
        NodeService {
            inner: Arc::new(Inner {
                node_name: node_name.into(),
                index: DeliveryIndex::new(&root),
                mounts: MountRecords::new(&root),
                store,
                lock: Mutex::new(()),
            }),
        }
    }

    /// The node's name (the CSI node id).
    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// Publish a checked request: the blocking part of `NodePublishVolume`.
    pub fn publish(&self, req: &PublishRequest) -> Result<(), Status> {
        let inner = &*self.inner;
        let _guard = inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let node = &inner.node_name;
        check_pod(req)?;
        let delivery = inner.index.get(&req.cache).map_err(internal)?.ok_or_else(|| {
            let path = inner.index.path_of(&req.cache).map(|p| p.display().to_string()).unwrap_or_default();
            Status::not_found(format!(
                "{} is not known on node {node}: the gkm agent has recorded no delivery decision for it ({path}); \
                 check that the cache exists and that gkm-agent runs on this node",
                req.cache
            ))
        })?;
        check_workload_namespace(req, &delivery)?;
        let what = format!("{} digest {}", req.cache, delivery.digest);
        let reason = delivery.reason.as_deref().unwrap_or("no reason recorded");
        match delivery.verdict {
            Verdict::Deliverable => {}
            Verdict::NotVerified => {
                return Err(Status::failed_precondition(format!(
                    "{what} is not verified: {reason}"
                )));
            }
            Verdict::Incompatible => {
                return Err(Status::failed_precondition(format!(
                    "{what} is not compatible with any GPU on node {node}: {reason}"
                )));
            }
            Verdict::NotExtracted => {
                return Err(Status::unavailable(format!(
                    "{what} is not extracted on node {node} yet: {reason}"
                )));
            }
        }
        let entry = inner.store.get(&delivery.digest).ok_or_else(|| {
            Status::unavailable(format!(
                "{what} is deliverable but its store directory {} is missing on node {node}",
                inner.store.path_of(&delivery.digest).display()
            ))
        })?;
        let tree = CacheTree::open(&entry).map_err(|e| {
            Status::failed_precondition(format!("{what} cannot be mounted on node {node}: {e}"))
        })?;
        let source = tree.mount_source();

        if let Ok(Some(existing)) = inner.mounts.get(&req.volume_id)
            && existing.target_path != req.target_path
            && mount_at(&existing.target_path).map_err(internal)?.is_some()
        {
            return Err(Status::failed_precondition(format!(
                "volume {} is already published at {}; unpublish it there first",
                req.volume_id,
                existing.target_path.display()
            )));
        }

        let record = MountRecord {
            volume_id: req.volume_id.clone(),
            pod: req.pod.clone(),
            cache: req.cache.clone(),
            digest: delivery.digest.clone(),
            target_path: req.target_path.clone(),
            published: Timestamp::now(),
        };

        if let Some(existing) = mount_at(&req.target_path).map_err(internal)? {
            let ours = same_directory(&req.target_path, &source).map_err(internal)?;
            if ours && existing.is_read_only() {
                // Published already: make sure the record is there too.
                inner.mounts.record(&record).map_err(internal)?;
                tracing::debug!(volume = %req.volume_id, target = %req.target_path.display(), "already published");
                return Ok(());
            }
            return Err(Status::failed_precondition(format!(
                "target path {} is already a mount point ({} {}{}), not the read-only {what}",
                req.target_path.display(),
                existing.fs_type,
                existing.root.display(),
                if existing.is_read_only() {
                    ", read-only"
                } else {
                    ""
                },
            )));
        }

        // Record first: the records are always a superset of the mounts, so
        // the agent never frees a digest that is mounted.
        inner.mounts.record(&record).map_err(internal)?;
        let created = match create_target(&req.target_path) {
            Ok(created) => created,
            Err(e) => {
                let _ = inner.mounts.remove(&req.volume_id);
                return Err(Status::internal(format!(
                    "creating target path {}: {e}",
                    req.target_path.display()
                )));
            }
        };
        if let Err(e) = bind_read_only(&source, &req.target_path) {
            if created {
                let _ = fs::remove_dir(&req.target_path);
            }
            let _ = inner.mounts.remove(&req.volume_id);
            return Err(Status::internal(format!(
                "bind-mounting {} read-only onto {} on node {node}: {e}",
                tree.path.display(),
                req.target_path.display()
            )));
        }
        tracing::info!(
            volume = %req.volume_id,
            pod = %format!("{}/{}", req.pod.namespace, req.pod.name),
            cache = %req.cache,
            digest = %delivery.digest,
            target = %req.target_path.display(),
            "published"
        );
        Ok(())
    }

    /// The blocking part of `NodeUnpublishVolume`: unmount `target`, remove
    /// it, forget the record. Succeeds when there is nothing to undo.
    pub fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
        let inner = &*self.inner;
        let _guard = inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let unmounted = unmount_all(target)
            .map_err(|e| Status::internal(format!("unmounting {}: {e}", target.display())))?;
        match fs::remove_dir(target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Status::internal(format!(
                    "removing target path {} after unmounting it: {e}",
                    target.display()
                )));
            }
        }
        // Keep a record naming another target that is still mounted.
        let keep = match inner.mounts.get(volume_id) {
            Ok(Some(r)) => {
                r.target_path != target && mount_at(&r.target_path).ok().flatten().is_some()
            }
            _ => false,
        };
        if !keep {
            inner.mounts.remove(volume_id).map_err(internal)?;
        }
        tracing::info!(volume = %volume_id, target = %target.display(), unmounted, "unpublished");
        Ok(())
    }
}

/// Create the target directory; whether it was created.
fn create_target(target: &Path) -> io::Result<bool> {
    if target.is_dir() {
        return Ok(false);
    }
    fs::create_dir_all(target)?;
    Ok(true)
}

fn internal(e: impl Display) -> Status {
    Status::internal(e.to_string())
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
        let req = parse_publish(request.get_ref()).inspect_err(|status| {
            tracing::warn!(volume = %request.get_ref().volume_id, error = %status.message(), "publish refused");
        })?;
        let svc = self.clone();
        let volume_id = req.volume_id.clone();
        blocking(move || svc.publish(&req)).await.inspect_err(|status| {
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

    /// None of the optional RPCs: no staging, no stats, no expansion.
    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.inner.node_name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}
