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

use crate::capture::{self, CaptureRequest, TreeOf, is_capture, parse_capture};
use crate::mount::{
    CacheTree, EmptyLayer, bind, is_view, is_writable_view, mount_at, mount_read_only_view,
    mount_writable_view, same_directory, unmount_all,
};
use crate::proto::node_server::Node;
use crate::proto::{
    NodeGetCapabilitiesRequest, NodeGetCapabilitiesResponse, NodeGetInfoRequest,
    NodeGetInfoResponse, NodePublishVolumeRequest, NodePublishVolumeResponse,
    NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
};
use crate::publish::{Decision, Entry, Observed, Recorded, TargetMount, decide};
use crate::upper::{self, Upper, writable_view_name};
use crate::volume::{PublishRequest, View, absolute_path, parse_publish, required};
use gkm_k8s_node::delivery::DeliveryIndex;
use gkm_k8s_node::mount_records::{MountRecord, MountRecords};
use gkm_k8s_node::relocation::{self, Relocation};

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
    /// What is allowed of capture volumes.
    capture: crate::capture_admission::CaptureConfig,
    /// The counts served on `/metrics`.
    metrics: crate::metrics::CsiMetrics,
    /// The empty layer of the read-only views, once prepared.
    empty: std::sync::OnceLock<EmptyLayer>,
    /// Publish and unpublish run one at a time: they are rare, and this
    /// keeps "check, record, mount" free of races between two requests.
    lock: Mutex<()>,
}

impl NodeService {
    /// The service for node `node_name`, delivering from `store` (whose root
    /// also holds the delivery index and the mount records), allowing
    /// `capture` of capture volumes.
    pub fn new(
        node_name: impl Into<String>,
        store: StoreLayout,
        capture: crate::capture_admission::CaptureConfig,
    ) -> NodeService {
        let root = store.root().to_path_buf();
        NodeService {
            inner: Arc::new(Inner {
                node_name: node_name.into(),
                index: DeliveryIndex::new(&root),
                mounts: MountRecords::new(&root),
                capture,
                metrics: crate::metrics::CsiMetrics::default(),
                empty: std::sync::OnceLock::new(),
                store,
                lock: Mutex::new(()),
            }),
        }
    }

    /// The node's name (the CSI node id).
    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// The counts the driver serves on `/metrics` ([`crate::metrics`]).
    pub fn metrics(&self) -> &crate::metrics::CsiMetrics {
        &self.inner.metrics
    }

    /// What is allowed of capture volumes.
    pub fn capture_config(&self) -> &crate::capture_admission::CaptureConfig {
        &self.inner.capture
    }

    /// Publish a checked request: the blocking part of `NodePublishVolume`.
    /// It reads what the node holds, [decides](crate::publish::decide), and
    /// carries the decision out.
    pub fn publish(&self, req: &PublishRequest) -> Result<(), Status> {
        let inner = &*self.inner;
        let _guard = inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let delta = delta_capture_request(req);
        if let Some(capture) = &delta {
            crate::capture_admission::check(inner.store.root(), &inner.capture, capture)?;
        }
        let (observed, tree) = self.observe(req)?;
        let image = match &observed.recorded {
            Recorded::Decision { delivery, .. } => delivery.image.clone(),
            Recorded::Nothing { .. } => None,
        };
        match decide(req, &inner.node_name, &observed, Timestamp::now())? {
            Decision::AlreadyPublished(record) => {
                inner.mounts.record(&record).map_err(internal)?;
                tracing::debug!(volume = %req.volume_id, target = %req.target_path.display(), "already published");
                Ok(())
            }
            Decision::Mount(record) => {
                // Ready entries always come with their open tree.
                let tree = tree.ok_or_else(|| Status::internal("the cache tree is not open"))?;
                match &delta {
                    None => self.mount(&record, &tree, req.view, req.mount_path.as_deref(), None),
                    Some(capture) => {
                        let base = delta_base(req, &record, &tree, image.as_deref())?;
                        let delta = DeltaTree {
                            tree: capture.tree(inner.store.root()),
                            name: captured_view_name(capture),
                            base,
                        };
                        self.mount(
                            &record,
                            &tree,
                            req.view,
                            req.mount_path.as_deref(),
                            Some(&delta),
                        )
                    }
                }
            }
        }
    }

    /// What the node holds that `req` decides on, and the cache tree to
    /// mount when there is one. Only reads.
    fn observe(&self, req: &PublishRequest) -> Result<(Observed, Option<CacheTree>), Status> {
        let inner = &*self.inner;
        let mut tree = None;
        let recorded = match inner.index.get(&req.cache).map_err(internal)? {
            None => Recorded::Nothing {
                index_file: inner
                    .index
                    .path_of(&req.cache)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            },
            Some(delivery) => {
                let entry = match inner.store.get(&delivery.digest) {
                    None => Entry::Missing {
                        path: inner.store.path_of(&delivery.digest),
                    },
                    Some(dir) if !StoreLayout::is_sealed(&dir) => Entry::Unsealed { path: dir },
                    Some(dir) => match CacheTree::open(&dir) {
                        Ok(open) => {
                            tree = Some(open);
                            Entry::Ready
                        }
                        Err(e) => Entry::Unmountable {
                            reason: e.to_string(),
                        },
                    },
                };
                Recorded::Decision { delivery, entry }
            }
        };
        let published_elsewhere = match inner.mounts.get(&req.volume_id) {
            Ok(Some(existing))
                if existing.target_path != req.target_path
                    && mount_at(&existing.target_path).map_err(internal)?.is_some() =>
            {
                Some(existing.target_path)
            }
            _ => None,
        };
        let at_target = match mount_at(&req.target_path).map_err(internal)? {
            None => None,
            Some(existing) => Some(TargetMount {
                read_only: existing.is_read_only(),
                ours: match (&recorded, req.view) {
                    (Recorded::Decision { delivery, .. }, View::ReadOnly) => {
                        is_view(&existing, &cache_view_name(&delivery.digest))
                    }
                    (Recorded::Decision { delivery, .. }, View::Writable { .. }) => {
                        let name = match delta_capture_request(req) {
                            Some(capture) => captured_view_name(&capture),
                            None => writable_view_name(&req.volume_id, &delivery.digest),
                        };
                        is_writable_view(&existing, &name)
                    }
                    (Recorded::Nothing { .. }, _) => false,
                },
                fs_type: existing.fs_type,
                root: existing.root,
            }),
        };
        let observed = Observed {
            recorded,
            published_elsewhere,
            at_target,
        };
        Ok((observed, tree))
    }

    /// Records `record`, then mounts the `view` of `tree` at its target
    /// (for a writable view, on a fresh upper), relocated to `mount_path`
    /// when the volume names the path the pod mounts it at; undoes it all
    /// if the mount fails. A writable view kept for a delta capture has its
    /// upper in `delta`'s capture tree.
    fn mount(
        &self,
        record: &MountRecord,
        tree: &CacheTree,
        view: View,
        mount_path: Option<&str>,
        delta: Option<&DeltaTree>,
    ) -> Result<(), Status> {
        let inner = &*self.inner;
        let node = &inner.node_name;
        let target = &record.target_path;
        let relocation = match mount_path {
            None => Relocation::NotNeeded,
            Some(path) => {
                relocation::ensure_layer(inner.store.root(), &record.digest, &tree.path, path)
                    .map_err(|e| {
                        Status::failed_precondition(format!(
                            "relocating {} to the pod's mount path {path}: {e}",
                            record.digest
                        ))
                    })?
            }
        };
        let relocation = match &relocation {
            Relocation::Layer(dir) => Some(dir.as_path()),
            Relocation::NotNeeded => None,
        };
        // Record first: the records are always a superset of the mounts, so
        // the agent never frees a digest that is mounted.
        inner.mounts.record(record).map_err(internal)?;
        let created = match create_target(target) {
            Ok(created) => created,
            Err(e) => {
                let _ = inner.mounts.remove(&record.volume_id);
                return Err(Status::internal(format!(
                    "creating target path {}: {e}",
                    target.display()
                )));
            }
        };
        let mounted = match view {
            View::ReadOnly => self
                .empty_layer()
                .and_then(|empty| {
                    mount_read_only_view(
                        &tree.mount_source(),
                        relocation,
                        empty,
                        &cache_view_name(&record.digest),
                        target,
                    )
                })
                .map(|()| 0),
            View::Writable { group, max_bytes } => {
                self.mount_writable(record, tree, relocation, group, max_bytes, delta)
            }
        };
        let writable_dirs = match mounted {
            Ok(dirs) => dirs,
            Err(e) => {
                if created {
                    let _ = fs::remove_dir(target);
                }
                let _ = inner.mounts.remove(&record.volume_id);
                let how = match view {
                    View::ReadOnly => "read-only",
                    View::Writable { .. } => "writable",
                };
                return Err(Status::internal(format!(
                    "mounting {} ({how}) onto {} on node {node}: {e}",
                    tree.path.display(),
                    target.display()
                )));
            }
        };
        if matches!(view, View::Writable { .. }) {
            inner.metrics.writable_published(&record.pod.namespace);
        }
        tracing::info!(
            volume = %record.volume_id,
            pod = %format!("{}/{}", record.pod.namespace, record.pod.name),
            cache = %record.cache,
            digest = %record.digest,
            target = %target.display(),
            writable = matches!(view, View::Writable { .. }),
            writable_dirs,
            "published"
        );
        Ok(())
    }

    /// Mounts the writable view of `tree` at the target on a fresh upper:
    /// `record`'s own, or, for a `delta` capture, one in the capture's tree
    /// (see [`Self::make_delta_upper`]); removes what it made if the view
    /// is not mounted. How many directories were made writable by `group`.
    fn mount_writable(
        &self,
        record: &MountRecord,
        tree: &CacheTree,
        relocation: Option<&Path>,
        group: Option<u32>,
        max_bytes: u64,
        delta: Option<&DeltaTree>,
    ) -> io::Result<usize> {
        let (upper, name) = match delta {
            None => (
                Upper::make(self.inner.store.root(), &record.volume_id, max_bytes, group)?,
                writable_view_name(&record.volume_id, &record.digest),
            ),
            Some(delta) => (
                self.make_delta_upper(group, max_bytes, delta)?,
                delta.name.clone(),
            ),
        };
        let mounted = mount_writable_view(
            &tree.mount_source(),
            relocation,
            &upper,
            group,
            &name,
            &record.target_path,
        );
        if mounted.is_err() {
            let _ = match delta {
                None => upper::remove(&upper.dir),
                Some(delta) => capture::remove_tree(&delta.tree),
            };
        }
        mounted
    }

    /// Makes `delta`'s capture tree (bounded to `max_bytes`), the record of
    /// its base and its upper; removes the tree if one of them is not made.
    /// A tree the pod already has for the capture is refused while in use
    /// (a second volume naming it), or holds a plain capture volume's
    /// files; one left by a publish that did not finish is made again.
    fn make_delta_upper(
        &self,
        group: Option<u32>,
        max_bytes: u64,
        delta: &DeltaTree,
    ) -> io::Result<Upper> {
        let dir = &delta.tree;
        if mount_at(dir)?.is_some() {
            let in_use = capture::mounted_trees(self.inner.store.root())?
                .iter()
                .any(|t| t.in_use && t.path == *dir);
            if in_use || !crate::delta::is_delta_tree(dir) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "the pod already has a capture tree at {} (another volume names the same capture)",
                        dir.display()
                    ),
                ));
            }
            capture::remove_tree(dir)?;
        }
        capture::make_tree(dir, max_bytes)?;
        let made =
            crate::delta::write_record(dir, &delta.base).and_then(|()| Upper::make_in(dir, group));
        if made.is_err() {
            let _ = capture::remove_tree(dir);
        }
        made
    }

    /// Removes every upper no mounted writable view names (see
    /// [`crate::upper::sweep`]): what a driver killed during a publish, or
    /// a node restarted under its pods, left. The driver calls it when it
    /// starts; the volume ids removed.
    pub fn sweep_uppers(&self) -> io::Result<Vec<String>> {
        let _guard = self
            .inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let removed = upper::sweep(self.inner.store.root())?;
        self.inner.metrics.swept(removed.len());
        for volume in &removed {
            tracing::info!(volume = %volume, "swept an upper no mounted view names");
        }
        Ok(removed)
    }

    /// Publish a capture volume (see [`crate::capture`]): the workload's own
    /// bounded tree, writable, or a workload's tree read-only for its
    /// capture Job (`NOT_FOUND` when there is none on this node).
    pub fn publish_capture(&self, req: &CaptureRequest) -> Result<(), Status> {
        let inner = &*self.inner;
        let _guard = inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        crate::capture_admission::check(inner.store.root(), &inner.capture, req)?;
        let tree = req.tree(inner.store.root());
        let target = &req.volume.target_path;
        let own = matches!(req.tree_of, TreeOf::Own { .. });
        if own {
            capture::make_tree(&tree, req.max_bytes).map_err(|e| {
                Status::internal(format!("making the capture tree {}: {e}", tree.display()))
            })?;
            if crate::delta::is_delta_tree(&tree) {
                return Err(Status::failed_precondition(format!(
                    "the pod's tree for GKMCacheCapture {}/{} holds a writable cache view's upper \
                     (another volume names the cache and the capture): a capture volume cannot share it",
                    req.volume.pod.namespace, req.capture
                )));
            }
        } else if mount_at(&tree).map_err(internal)?.is_none() {
            return Err(Status::not_found(format!(
                "no captured tree of pod {} for GKMCacheCapture {}/{} on node {}",
                tree.file_name().unwrap_or_default().to_string_lossy(),
                req.volume.pod.namespace,
                req.capture,
                inner.node_name
            )));
        }
        let view = captured_view_name(req);
        if let Some(existing) = mount_at(target).map_err(internal)? {
            let published = if own {
                same_directory(target, &tree).map_err(internal)?
            } else {
                is_view(&existing, &view)
            };
            if published {
                return Ok(());
            }
        }
        let created = create_target(target).map_err(internal)?;
        let mounted = if own {
            bind(&tree, target)
        } else {
            self.empty_layer()
                .and_then(|empty| mount_read_only_view(&tree, None, empty, &view, target))
        };
        if let Err(e) = mounted {
            if created {
                let _ = fs::remove_dir(target);
            }
            return Err(Status::internal(format!(
                "bind-mounting {} onto {}: {e}",
                tree.display(),
                target.display()
            )));
        }
        tracing::info!(volume = %req.volume.volume_id, capture = %req.capture, tree = %tree.display(), own, "published a capture volume");
        Ok(())
    }

    /// The empty layer of the read-only views, below the store root,
    /// prepared at the first publish and held open from then on.
    fn empty_layer(&self) -> io::Result<&EmptyLayer> {
        if let Some(empty) = self.inner.empty.get() {
            return Ok(empty);
        }
        let empty = EmptyLayer::prepare(&self.inner.store.root().join(EMPTY_LAYER_DIR))?;
        Ok(self.inner.empty.get_or_init(|| empty))
    }

    /// The store root (holding the node store, its records and the
    /// captured trees).
    pub fn store_root(&self) -> &std::path::Path {
        self.inner.store.root()
    }

    /// Unmounts and removes the captured tree of pod `uid` for `namespace`'s
    /// `capture` (its capture is over), and its capture's directory when
    /// that was its last tree.
    pub fn release_capture(&self, namespace: &str, capture: &str, uid: &str) -> Result<(), Status> {
        let tree = capture::released_tree(self.inner.store.root(), namespace, capture, uid)?;
        let _guard = self
            .inner
            .lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        capture::remove_tree(&tree)
            .map_err(|e| Status::internal(format!("removing {}: {e}", tree.display())))?;
        // Empty parents go too (a non-empty one stays: another pod's tree).
        let capture_dir = tree.parent();
        for dir in [capture_dir, capture_dir.and_then(Path::parent)]
            .into_iter()
            .flatten()
        {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
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
        let mut upper_bytes = 0;
        if !keep {
            // The view is gone: so is its upper, and what the pod wrote.
            if let Some(dir) = Upper::path(inner.store.root(), volume_id)
                && dir.exists()
            {
                upper_bytes = upper::used_bytes(&dir);
                upper::remove(&dir).map_err(internal)?;
            }
            inner.mounts.remove(volume_id).map_err(internal)?;
        }
        tracing::info!(volume = %volume_id, target = %target.display(), unmounted, upper_bytes, "unpublished");
        Ok(())
    }
}

/// The directory below the store root holding the empty layer of the
/// read-only views.
const EMPTY_LAYER_DIR: &str = "csi/empty-layer";

/// The name (mount source) of the read-only view of a cache's `digest`.
fn cache_view_name(digest: &gkm_core::Digest) -> String {
    format!("gkm-cache:{digest}")
}

/// The name of the read-only view of the captured tree `req` asks for.
fn captured_view_name(req: &CaptureRequest) -> String {
    let uid = match &req.tree_of {
        TreeOf::Own { uid } | TreeOf::Captured { uid } => uid,
    };
    capture::view_name(&req.volume.pod.namespace, &req.capture, uid)
}

/// A writable view's upper kept for a delta capture: the capture tree, the
/// view's name, and the base it records.
struct DeltaTree {
    tree: PathBuf,
    name: String,
    base: crate::delta::DeltaBase,
}

/// The capture volume a writable cache view naming a capture also is: the
/// pod's own tree of that capture, bounded as the view is.
fn delta_capture_request(req: &PublishRequest) -> Option<CaptureRequest> {
    let capture = req.capture.clone()?;
    let uid = req.pod.uid.clone()?;
    let View::Writable { max_bytes, .. } = req.view else {
        return None;
    };
    Some(CaptureRequest {
        volume: crate::volume::PodVolume {
            volume_id: req.volume_id.clone(),
            target_path: req.target_path.clone(),
            pod: req.pod.clone(),
        },
        capture,
        tree_of: TreeOf::Own { uid },
        max_bytes,
    })
}

/// The base of a delta capture of `req`: the digest `record` publishes, in
/// the repository of the cache's `image` (as the agent recorded it), built
/// where `tree`'s groups say.
fn delta_base(
    req: &PublishRequest,
    record: &MountRecord,
    tree: &CacheTree,
    image: Option<&str>,
) -> Result<crate::delta::DeltaBase, Status> {
    let image = image.ok_or_else(|| {
        Status::failed_precondition(format!(
            "{} names a capture, but the gkm agent recorded no image for {} (an older agent): \
             the delta's base cannot be named",
            req.volume_id, req.cache
        ))
    })?;
    let build_path = gkm_core::cache::tree_build_path(&tree.path).map_err(|e| {
        Status::failed_precondition(format!(
            "reading the build path of {} digest {}: {e}",
            req.cache, record.digest
        ))
    })?;
    Ok(crate::delta::delta_base(image, &record.digest, build_path))
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
        if is_capture(request.get_ref()) && !capture::names_cache(request.get_ref()) {
            let req = parse_capture(request.get_ref())?;
            let svc = self.clone();
            blocking(move || svc.publish_capture(&req)).await?;
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
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
        blocking(move || {
            // A capture volume's tree may go once it leaves its last pod.
            let tree = capture::tree_behind(svc.store_root(), &target).unwrap_or(None);
            svc.unpublish(&volume_id, &target)?;
            if let Some((capture, uid)) = tree {
                crate::capture_release::unmounted(&svc, &capture, &uid);
            }
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    /// `VOLUME_MOUNT_GROUP` only (the kubelet passes the pod's fsGroup,
    /// which may write in a writable view, and changes no ownership
    /// itself): no staging, no stats, no expansion.
    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use crate::proto::node_service_capability::{Rpc, Type, rpc};
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![crate::proto::NodeServiceCapability {
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
            node_id: self.inner.node_name.clone(),
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
            crate::capture_admission::CaptureConfig::default(),
        );
        let first = "0b7c1a52-5d0e-4c39-9a57-3f1f6f3a0a01";
        let second = "0b7c1a52-5d0e-4c39-9a57-3f1f6f3a0a02";
        let dir = capture::capture_dir(store.path(), "team-a", "warm");
        for uid in [first, second] {
            fs::create_dir_all(dir.join(uid)).unwrap();
            fs::write(dir.join(uid).join("kernel.cubin"), b"k").unwrap();
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
