//! Publishing capture volumes and releasing their trees: what
//! [`admission`](super::admission) allows, mounted as a
//! [tree](super::tree) says.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use gkm_k8s_node::captures::CaptureIndex;
use tonic::Status;

use super::admission::{Asked, CaptureConfig, GrantedTree, admit};
use super::markers::Marker;
use super::tree::{is_delta_tree, make_tree, mounted_trees, released_tree, remove_tree};
use crate::views::mount::{bind, is_view, mount_at, mount_read_only_view, same_directory};
use crate::views::{Views, create_target, internal};
use crate::volume::{CaptureVolume, TreeOf};

/// The capture trees of one node's store, and what is allowed of them.
/// Clones share the lock that serializes the driver's publishes.
#[derive(Debug, Clone)]
pub struct CaptureTrees {
    root: PathBuf,
    node_name: String,
    config: CaptureConfig,
    lock: Arc<Mutex<()>>,
}

impl CaptureTrees {
    /// The capture trees below the store root `root` of node `node_name`,
    /// allowing `config`; `lock` is the one publishes and unpublishes hold.
    pub fn new(
        root: impl Into<PathBuf>,
        node_name: impl Into<String>,
        config: CaptureConfig,
        lock: Arc<Mutex<()>>,
    ) -> CaptureTrees {
        CaptureTrees {
            root: root.into(),
            node_name: node_name.into(),
            config,
            lock,
        }
    }

    /// The store root (holding the captured trees).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What is allowed of capture volumes.
    pub fn config(&self) -> &CaptureConfig {
        &self.config
    }

    /// Holds the lock publishes and unpublishes hold.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether the checked request `req` may be published: reads the
    /// capture index and the trees mounted now, and asks admission's `admit`.
    /// Blocking.
    pub fn admit(&self, req: &CaptureVolume) -> Result<(), Status> {
        let (root, config) = (self.root.as_path(), &self.config);
        if !config.enabled {
            return admit(config, Asked::Existing, None, &[]);
        }
        let capture = req.capture_name();
        let own = matches!(req.tree_of, TreeOf::Own { .. });
        let tree = req.tree(root);
        if !own || mount_at(&tree).map_err(internal)?.is_some() {
            return admit(config, Asked::Existing, None, &[]);
        }
        let index = CaptureIndex::new(root);
        let captures = index.read().map_err(|e| {
            Status::unavailable(format!(
                "the capture index cannot be read ({e}): whether GKMCacheCapture {capture} is pending is unknown"
            ))
        })?;
        let granted: Vec<GrantedTree> = mounted_trees(root)
            .map_err(internal)?
            .into_iter()
            .map(|t| t.granted)
            .collect();
        let asked = Asked::NewTree {
            capture: &capture,
            bytes: req.max_bytes,
        };
        admit(config, asked, captures.as_ref(), &granted)
    }

    /// Publishes a capture volume: the workload's own bounded tree,
    /// writable, or a workload's tree read-only (a view made as `views`
    /// make theirs) for its capture Job (`NOT_FOUND` when there is none on
    /// this node). Blocking; the caller holds [`Self::lock`].
    pub fn publish(&self, views: &Views, req: &CaptureVolume) -> Result<(), Status> {
        self.admit(req)?;
        let tree = req.tree(&self.root);
        let target = &req.volume.target_path;
        let own = matches!(req.tree_of, TreeOf::Own { .. });
        if own {
            make_tree(&tree, req.max_bytes).map_err(|e| {
                Status::internal(format!("making the capture tree {}: {e}", tree.display()))
            })?;
            mark_published(&self.root, req);
            if is_delta_tree(&tree) {
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
                self.node_name
            )));
        }
        let view = req.view_name();
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
            views
                .empty_layer()
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

    /// Unmounts and removes the captured tree of pod `uid` for
    /// `namespace`'s `capture` (its capture is over), and its capture's
    /// directory when that was its last tree. Takes [`Self::lock`].
    pub fn release(&self, namespace: &str, capture: &str, uid: &str) -> Result<(), Status> {
        let tree = released_tree(&self.root, namespace, capture, uid)?;
        let _guard = self.lock();
        remove_tree(&tree)
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
}

/// Records that the driver publishes `req`'s tree to its workload now
/// ([`Marker::Published`]). A failure is logged: a tree without the record
/// is marked when the release next looks, so it is only kept longer.
pub(crate) fn mark_published(root: &Path, req: &CaptureVolume) {
    if let Err(e) = Marker::Published.set(root, &req.capture_name(), req.uid()) {
        tracing::warn!(error = %e, capture = %req.capture, pod = %req.uid(),
            "recording a capture tree's publish");
    }
}
