//! Views of a cache: the read-only view, and the copy-on-write view whose
//! writes go to an upper of its publish's own or (a delta capture) to one
//! a capture keeps ([`UpperPlace`]).
//!
//! [`Views::publish`] reads what the node holds ([`decide::Observed`]),
//! asks [`decide::decide`] (who may mount what: [`access`]), and carries the
//! decision out: it records the mount, then mounts the view
//! ([`mount::mount_read_only_view`], or [`upper::Upper::mount_view`] on a
//! fresh upper). A view at a pod's `csi.gkm.io/mountPath` stacks a
//! relocation layer, made within bounds ([`relocate`]) and, by
//! [`Views::relocate`], before the driver's lock of publishes is taken. A
//! writable view for a pod with an fsGroup makes every directory of the
//! tree writable by the group, each copied up by the driver (in its
//! memory, as the upper is a `tmpfs`), so a tree with more than
//! [`ViewsConfig::group_max_dirs`] directories is refused.

pub mod access;
pub mod decide;
pub mod layer_owners;
pub mod mount;
pub mod relocate;
pub mod upper;
pub mod usage;

use std::fmt::Display;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::OnceLock;

use gkm_core::Digest;
use gkm_core::store_layout::StoreLayout;
use gkm_core::usage::NewEntry;
use gkm_k8s_node::delivery::DeliveryIndex;
use gkm_k8s_node::mount_records::{MountRecord, MountRecords};
use gkm_k8s_node::relocation::Relocation;
use gkm_k8s_node::usage::{UsageRecord, UsageRecords};
use jiff::Timestamp;
use tonic::Status;

use crate::metrics::CsiMetrics;
use crate::volume::{CacheVolume, View};
use decide::{Decision, Entry, Observed, Recorded, TargetMount, decide};
use mount::{
    CacheTree, EmptyLayer, GroupWritable, directories_below, is_view, is_writable_view, mount_at,
    unmount_all,
};
use relocate::{RelocationConfig, Relocations};
use upper::{Upper, writable_view_name};

/// The directories a writable view for a pod with an fsGroup may make
/// writable by the group, by default.
pub const DEFAULT_GROUP_MAX_DIRS: usize = 10_000;

/// What the driver allows of the views of a cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewsConfig {
    /// The bounds on relocation layers.
    pub relocation: RelocationConfig,
    /// The most directories a writable view for a pod with an fsGroup
    /// makes writable by the group (one copy-up each, by the driver).
    pub group_max_dirs: usize,
}

impl Default for ViewsConfig {
    /// The default bounds.
    fn default() -> ViewsConfig {
        ViewsConfig {
            relocation: RelocationConfig::default(),
            group_max_dirs: DEFAULT_GROUP_MAX_DIRS,
        }
    }
}

/// Where a writable view's upper is made: a tmpfs of its publish's own
/// ([`OwnUpper`]), or a tree a capture keeps (a delta capture's).
pub trait UpperPlace {
    /// The name (mount source) of the writable view of `digest` for
    /// `volume_id`, by which a publish again knows it.
    fn view_name(&self, volume_id: &str, digest: &Digest) -> String;

    /// Once the publish of `record` from `tree` is decided, and before
    /// anything is recorded or mounted: what the upper needs of the digest
    /// (`image` is the cache's image, as the agent recorded it), or the
    /// refusal.
    fn prepare(
        &mut self,
        record: &MountRecord,
        tree: &CacheTree,
        image: Option<&str>,
    ) -> Result<(), Status>;

    /// Makes a fresh upper for `record` below the store root `root`,
    /// bounded to `max_bytes`, writable by `group`.
    fn make(
        &self,
        root: &Path,
        record: &MountRecord,
        max_bytes: u64,
        group: Option<u32>,
    ) -> io::Result<Upper>;

    /// Removes `upper`, whose view was not mounted.
    fn discard(&self, upper: &Upper);
}

/// The upper of a publish's own: `<store>/csi/uppers/<volume id>`, removed
/// with its view ([`upper`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct OwnUpper;

impl UpperPlace for OwnUpper {
    fn view_name(&self, volume_id: &str, digest: &Digest) -> String {
        writable_view_name(volume_id, digest)
    }

    fn prepare(&mut self, _: &MountRecord, _: &CacheTree, _: Option<&str>) -> Result<(), Status> {
        Ok(())
    }

    fn make(
        &self,
        root: &Path,
        record: &MountRecord,
        max_bytes: u64,
        group: Option<u32>,
    ) -> io::Result<Upper> {
        Upper::make(root, &record.volume_id, max_bytes, group)
    }

    fn discard(&self, upper: &Upper) {
        let _ = upper::remove(&upper.dir);
    }
}

/// The views of one node's store: what they are published from, and what
/// is recorded of them.
#[derive(Debug)]
pub struct Views {
    node_name: String,
    store: StoreLayout,
    index: DeliveryIndex,
    mounts: MountRecords,
    /// The counts served on `/metrics`.
    metrics: CsiMetrics,
    /// The empty layer of the read-only views, once prepared.
    empty: OnceLock<EmptyLayer>,
    /// The relocation layers, made within their bounds.
    relocations: Relocations,
    /// [`ViewsConfig::group_max_dirs`].
    group_max_dirs: usize,
    /// When these views were opened (the driver started).
    since: Timestamp,
    /// The entries each digest's tree holds, by its kind's rules: counted
    /// once, when a first writable view of it ends.
    delivered: usage::DeliveredEntries,
}

impl Views {
    /// The views of node `node_name`, delivered from `store` (whose root
    /// also holds the delivery index and the mount records), within
    /// `config`.
    pub fn new(node_name: impl Into<String>, store: StoreLayout, config: ViewsConfig) -> Views {
        let root = store.root().to_path_buf();
        Views {
            node_name: node_name.into(),
            index: DeliveryIndex::new(&root),
            mounts: MountRecords::new(&root),
            metrics: CsiMetrics::default(),
            empty: OnceLock::new(),
            relocations: Relocations::new(config.relocation),
            group_max_dirs: config.group_max_dirs,
            since: Timestamp::now(),
            store,
            delivered: usage::DeliveredEntries::default(),
        }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        self.store.root()
    }

    /// The counts the driver serves on `/metrics`.
    pub fn metrics(&self) -> &CsiMetrics {
        &self.metrics
    }

    /// Publishes the view `req` asks for, a writable one on an upper made
    /// at `place`. It reads what the node holds, [decides](decide::decide), and
    /// carries the decision out. Blocking; the caller serializes publishes.
    pub fn publish(&self, req: &CacheVolume, place: &mut dyn UpperPlace) -> Result<(), Status> {
        let (observed, tree) = self.observe(req, place)?;
        let image = match &observed.recorded {
            Recorded::Decision { delivery, .. } => delivery.image.clone(),
            Recorded::Nothing { .. } => None,
        };
        match decide(req, &self.node_name, &observed, Timestamp::now())? {
            Decision::AlreadyPublished(record) => {
                self.mounts.record(&record).map_err(internal)?;
                tracing::debug!(volume = %req.volume_id, target = %req.target_path.display(), "already published");
                Ok(())
            }
            Decision::Mount(record) => {
                // Ready entries always come with their open tree.
                let tree = tree.ok_or_else(|| Status::internal("the cache tree is not open"))?;
                place.prepare(&record, &tree, image.as_deref())?;
                self.mount(&record, &tree, req.view, req.mount_path.as_deref(), place)
            }
        }
    }

    /// Makes the relocation layer `req` needs, when it names a mount path
    /// and what the node holds decides that it is mounted: what
    /// [`Views::publish`] then finds made. Only reads, but for the layer;
    /// needs no lock of publishes (the layers have their own,
    /// [`Relocations::ensure`]), so a large layer does not stall them.
    pub fn relocate(&self, req: &CacheVolume, place: &dyn UpperPlace) -> Result<(), Status> {
        let Some(path) = req.mount_path.as_deref() else {
            return Ok(());
        };
        let (observed, tree) = self.observe(req, place)?;
        match decide(req, &self.node_name, &observed, Timestamp::now())? {
            Decision::AlreadyPublished(_) => Ok(()),
            Decision::Mount(record) => {
                let tree = tree.ok_or_else(|| Status::internal("the cache tree is not open"))?;
                self.relocations
                    .ensure(
                        self.store.root(),
                        &record.digest,
                        &tree.path,
                        path,
                        &record.pod.namespace,
                    )
                    .map(drop)
            }
        }
    }

    /// What the node holds that `req` decides on, and the cache tree to
    /// mount when there is one. Only reads.
    fn observe(
        &self,
        req: &CacheVolume,
        place: &dyn UpperPlace,
    ) -> Result<(Observed, Option<CacheTree>), Status> {
        let mut tree = None;
        let recorded = match self.index.get(&req.cache).map_err(internal)? {
            None => Recorded::Nothing {
                index_file: self
                    .index
                    .path_of(&req.cache)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            },
            Some(delivery) => {
                let entry = match self.store.get(&delivery.digest) {
                    None => Entry::Missing {
                        path: self.store.path_of(&delivery.digest),
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
        let published_elsewhere = match self.mounts.get(&req.volume_id) {
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
                        is_writable_view(
                            &existing,
                            &place.view_name(&req.volume_id, &delivery.digest),
                        )
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
    /// (for a writable view, on a fresh upper made at `place`), relocated
    /// to `mount_path` when the volume names the path the pod mounts it
    /// at; undoes it all if the mount fails.
    fn mount(
        &self,
        record: &MountRecord,
        tree: &CacheTree,
        view: View,
        mount_path: Option<&str>,
        place: &dyn UpperPlace,
    ) -> Result<(), Status> {
        let node = &self.node_name;
        let target = &record.target_path;
        let relocation = match mount_path {
            None => Relocation::NotNeeded,
            Some(path) => self.relocations.ensure(
                self.store.root(),
                &record.digest,
                &tree.path,
                path,
                &record.pod.namespace,
            )?,
        };
        let relocation = match &relocation {
            Relocation::Layer(dir) => Some(dir.as_path()),
            Relocation::NotNeeded => None,
        };
        let group_dirs = match view {
            View::Writable {
                group: Some(gid), ..
            } => Some(self.group_directories(record, tree, gid)?),
            _ => None,
        };
        // Record first: the records are always a superset of the mounts, so
        // the agent never frees a digest that is mounted.
        self.mounts.record(record).map_err(internal)?;
        let created = match create_target(target) {
            Ok(created) => created,
            Err(e) => {
                let _ = self.mounts.remove(&record.volume_id);
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
                    mount::mount_read_only_view(
                        &tree.mount_source(),
                        relocation,
                        empty,
                        &cache_view_name(&record.digest),
                        target,
                    )
                })
                .map(|()| 0),
            View::Writable { group, max_bytes } => {
                let writable = group
                    .zip(group_dirs.as_deref())
                    .map(|(gid, dirs)| GroupWritable { gid, dirs });
                self.mount_writable(record, tree, relocation, writable, max_bytes, place)
            }
        };
        let writable_dirs = match mounted {
            Ok(dirs) => dirs,
            Err(e) => {
                if created {
                    let _ = fs::remove_dir(target);
                }
                let _ = self.mounts.remove(&record.volume_id);
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
            self.metrics.writable_published(&record.pod.namespace);
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

    /// Mounts the writable view of `tree` at the target on a fresh upper
    /// made at `place`, which removes it if the view is not mounted. How
    /// many directories were made writable by `group`.
    fn mount_writable(
        &self,
        record: &MountRecord,
        tree: &CacheTree,
        relocation: Option<&Path>,
        group: Option<GroupWritable<'_>>,
        max_bytes: u64,
        place: &dyn UpperPlace,
    ) -> io::Result<usize> {
        let gid = group.map(|g| g.gid);
        let upper = place.make(self.store.root(), record, max_bytes, gid)?;
        let name = place.view_name(&record.volume_id, &record.digest);
        let mounted = upper.mount_view(
            &tree.mount_source(),
            relocation,
            group,
            &name,
            &record.target_path,
        );
        if mounted.is_err() {
            place.discard(&upper);
        }
        mounted
    }

    /// The directories of `tree` a writable view for fsGroup `gid` makes
    /// writable by the group, before anything is recorded or made:
    /// `RESOURCE_EXHAUSTED` when there are more than the driver allows
    /// (each is copied up by the driver, in its memory).
    fn group_directories(
        &self,
        record: &MountRecord,
        tree: &CacheTree,
        gid: u32,
    ) -> Result<Vec<std::path::PathBuf>, Status> {
        let max = self.group_max_dirs;
        match directories_below(&tree.mount_source(), max) {
            Ok(Some(dirs)) => Ok(dirs),
            Ok(None) => Err(Status::resource_exhausted(format!(
                "a writable view of {} for a pod with fsGroup {gid} makes every directory of its \
                 tree writable by the group, each copied up by the CSI driver, and the tree has \
                 more than {max} directories, over the cap {GROUP_MAX_DIRS_FLAG}={max}: mount the \
                 volume readOnly, or raise the chart's {GROUP_MAX_DIRS_VALUE} (gkm-csi \
                 {GROUP_MAX_DIRS_FLAG})",
                record.digest
            ))),
            Err(e) => Err(Status::internal(format!(
                "listing the directories of {}: {e}",
                tree.path.display()
            ))),
        }
    }

    /// Removes every upper no mounted writable view names (see
    /// [`upper::sweep`]): what a driver killed during a publish, or a node
    /// restarted under its pods, left. The volume ids removed.
    pub fn sweep_uppers(&self) -> io::Result<Vec<String>> {
        let removed = upper::sweep(self.store.root())?;
        self.metrics.swept(removed.len());
        for volume in &removed {
            tracing::info!(volume = %volume, "swept an upper no mounted view names");
        }
        Ok(removed)
    }

    /// Removes the relocation layers no view stacks, made more than `grace`
    /// ago ([`Relocations::remove_unused`], from the mount records);
    /// the caller holds the lock of publishes. The layers removed.
    pub fn remove_unused_layers(
        &self,
        grace: std::time::Duration,
    ) -> io::Result<Vec<std::path::PathBuf>> {
        let records = self.mounts.list().map_err(io::Error::other)?;
        let removed =
            self.relocations
                .remove_unused(self.store.root(), &records, self.since, grace)?;
        for layer in &removed {
            tracing::info!(layer = %layer.display(), "removed a relocation layer no view stacks");
        }
        Ok(removed)
    }

    /// The empty layer of the read-only views, below the store root,
    /// prepared at the first publish and held open from then on.
    pub fn empty_layer(&self) -> io::Result<&EmptyLayer> {
        if let Some(empty) = self.empty.get() {
            return Ok(empty);
        }
        let empty = EmptyLayer::prepare(&self.store.root().join(EMPTY_LAYER_DIR))?;
        Ok(self.empty.get_or_init(|| empty))
    }

    /// The blocking part of `NodeUnpublishVolume`: unmount `target`, remove
    /// it, forget the record and the view's upper. Succeeds when there is
    /// nothing to undo.
    pub fn unpublish(&self, volume_id: &str, target: &Path) -> Result<(), Status> {
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
        let record = self.mounts.get(volume_id).ok().flatten();
        let keep = record.as_ref().is_some_and(|r| {
            r.target_path != target && mount_at(&r.target_path).ok().flatten().is_some()
        });
        let mut upper_bytes = 0;
        if !keep {
            // The view is gone: so is its upper, and what the pod wrote,
            // once it is counted.
            if let Some(dir) = Upper::path(self.store.root(), volume_id)
                && dir.exists()
            {
                upper_bytes = upper::used_bytes(&dir);
                if let Some(record) = &record {
                    self.account_ended_view(record, &dir.join(upper::UPPER_DIR));
                }
                upper::remove(&dir).map_err(internal)?;
            }
            self.mounts.remove(volume_id).map_err(internal)?;
        }
        tracing::info!(volume = %volume_id, target = %target.display(), unmounted, upper_bytes, "unpublished");
        Ok(())
    }
}

impl Views {
    /// Counts what the pod of `record` compiled into its view's `upper`
    /// (by the kind of the tree it viewed), records it in the store's
    /// usage records and the driver's metrics, and logs it. Never fails:
    /// what cannot be read is logged and left uncounted.
    pub fn account_ended_view(&self, record: &MountRecord, upper: &Path) {
        let Some(entry) = self.store.get(&record.digest) else {
            return;
        };
        // The kind is the one whose layer directory the entry holds (the
        // tree the view showed, `CacheTree::open`).
        let Some(layout) = gkm_core::image_layout::ALL
            .into_iter()
            .find(|layout| entry.join(layout.cache_dir).is_dir())
        else {
            return;
        };
        let (kind, tree) = (layout.kind, entry.join(layout.cache_dir));
        let delivered = self.delivered.of(&record.digest, &tree, kind);
        let counted = usage::walk_upper(upper, kind)
            .map(|walked| (kind, gkm_core::usage::account(kind, &walked)))
            .map_err(|e| e.to_string());
        let (kind, account) = match counted {
            Ok(counted) => counted,
            Err(e) => {
                tracing::warn!(volume = %record.volume_id, upper = %upper.display(), error = %e, "could not count what the pod wrote into its view");
                return;
            }
        };
        self.metrics
            .view_ended(record, kind.as_str(), account.new_entries);
        let reasons = if account.all_hits() {
            Vec::new()
        } else {
            self.delivered.reasons(&record.digest, &tree, upper)
        };
        let names: Vec<&str> = account.named.iter().map(NewEntry::shown).collect();
        tracing::info!(
            volume = %record.volume_id,
            pod = %format!("{}/{}", record.pod.namespace, record.pod.name),
            cache = %record.cache,
            digest = %record.digest,
            kind = kind.as_str(),
            new_entries = account.new_entries,
            delivered_entries = ?delivered,
            new_bytes = account.new_bytes,
            scratch = account.scratch,
            new = ?names,
            why = ?reasons,
            "counted what the pod compiled into its view"
        );
        let usage = UsageRecord {
            mount: record.clone(),
            kind: kind.as_str().to_string(),
            ended: Timestamp::now(),
            delivered,
            reasons,
            usage: account,
        };
        if let Err(e) = UsageRecords::new(self.store.root()).record(&usage) {
            tracing::warn!(volume = %record.volume_id, error = %e, "could not record what the pod compiled");
        }
    }
}

/// The `gkm-csi` flag that sets [`ViewsConfig::group_max_dirs`].
pub const GROUP_MAX_DIRS_FLAG: &str = "--writable-group-max-dirs";
/// The chart's value that sets [`GROUP_MAX_DIRS_FLAG`].
pub const GROUP_MAX_DIRS_VALUE: &str = "views.writableGroupMaxDirs";

/// The directory below the store root holding the empty layer of the
/// read-only views.
const EMPTY_LAYER_DIR: &str = "csi/empty-layer";

/// The name (mount source) of the read-only view of a cache's `digest`.
fn cache_view_name(digest: &Digest) -> String {
    format!("gkm-cache:{digest}")
}

/// Create the target directory; whether it was created.
pub fn create_target(target: &Path) -> io::Result<bool> {
    if target.is_dir() {
        return Ok(false);
    }
    fs::create_dir_all(target)?;
    Ok(true)
}

/// An `INTERNAL` status saying `e`.
pub fn internal(e: impl Display) -> Status {
    Status::internal(e.to_string())
}
