//! Bounds on relocation layers ([`gkm_k8s_node::relocation`]): every new
//! `csi.gkm.io/mountPath` a pod names makes a layer of every group file of
//! its tree on the node's disk, so a tenant who may only create pods could
//! fill the disk with fresh paths. A new layer is made only
//!
//! - for a mount path of at most
//!   [`MOUNT_PATH_MAX_BYTES`](gkm_k8s_node::relocation::MOUNT_PATH_MAX_BYTES)
//!   (the volume is refused with `INVALID_ARGUMENT` before this);
//! - while the digest's layers, the layers made for the pod's namespace
//!   ([`super::layer_owners`]) and the node's, plus the new one, stay
//!   within [`RelocationConfig::digest_max_layers`],
//!   [`RelocationConfig::namespace_max_layers`] and
//!   [`RelocationConfig::node_max_layers`];
//! - while writing it leaves the store's filesystem its free-space reserve
//!   ([`RelocationConfig::keep_free`]), as the agent keeps its extractions
//!   within its own (`--keep-free`, by default the same 12%).
//!
//! Each refusal is `RESOURCE_EXHAUSTED` naming the `gkm-csi` flag, its
//! value and the chart's value to raise; the kubelet shows it in the pod's
//! `FailedMount` event and retries. A layer made already is reused whatever
//! the bounds, and a layer no view stacks goes
//! ([`Relocations::remove_unused`]), so a place under a cap is taken only
//! while a pod mounts the cache at that path. Layers are made under a lock of their own, not the driver's
//! lock of publishes ([`Relocations::ensure`]): a publish that makes a large
//! layer stalls only the others making one.
//!
//! [`admit_layer`] is the decision, pure; [`Relocations::ensure`] gathers
//! what it reads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use gkm_core::Digest;
use gkm_core::free_space::FreeSpaceReserve;
use gkm_k8s_node::mount_records::MountRecord;
use gkm_k8s_node::names::is_dns1123_subdomain;
use gkm_k8s_node::relocation::{
    Planned, Relocation, count_layers, find_layer, plan_layer, remove_unused_layers, sweep_staging,
};
use tonic::Status;

use super::layer_owners;

/// The relocation layers one digest may have on a node by default.
pub const DEFAULT_DIGEST_MAX_LAYERS: u64 = 16;
/// The relocation layers made for one namespace a node may hold by
/// default.
pub const DEFAULT_NAMESPACE_MAX_LAYERS: u64 = 64;
/// The relocation layers a node may hold by default.
pub const DEFAULT_NODE_MAX_LAYERS: u64 = 256;
/// What a new layer leaves free of the store's filesystem by default: the
/// agent's default reserve, 12% (the kubelet's eviction threshold plus a
/// margin).
pub const DEFAULT_KEEP_FREE: FreeSpaceReserve = FreeSpaceReserve::KUBELET_EVICTION_PLUS_MARGIN;

/// A bound on relocation layers: what it bounds, and how an administrator
/// sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCap {
    /// How many layers one digest has.
    DigestLayers,
    /// How many layers were made for one namespace.
    NamespaceLayers,
    /// How many layers the node holds.
    NodeLayers,
    /// The free space a new layer leaves on the store's filesystem.
    KeepFree,
}

impl LayerCap {
    /// The `gkm-csi` flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            LayerCap::DigestLayers => "--relocation-digest-max-layers",
            LayerCap::NamespaceLayers => "--relocation-namespace-max-layers",
            LayerCap::NodeLayers => "--relocation-node-max-layers",
            LayerCap::KeepFree => "--relocation-keep-free",
        }
    }

    /// The chart's value that sets the flag.
    pub fn chart_value(self) -> &'static str {
        match self {
            LayerCap::DigestLayers => "views.relocation.digestMaxLayers",
            LayerCap::NamespaceLayers => "views.relocation.namespaceMaxLayers",
            LayerCap::NodeLayers => "views.relocation.nodeMaxLayers",
            LayerCap::KeepFree => "views.relocation.keepFree",
        }
    }
}

/// What the driver allows of relocation layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelocationConfig {
    /// The most layers one digest may have on the node (one per mount path).
    pub digest_max_layers: u64,
    /// The most layers made for one namespace's pods the node may hold.
    pub namespace_max_layers: u64,
    /// The most layers the node may hold, of every digest.
    pub node_max_layers: u64,
    /// What a new layer must leave free of the store's filesystem.
    pub keep_free: FreeSpaceReserve,
}

impl Default for RelocationConfig {
    /// The default bounds.
    fn default() -> RelocationConfig {
        RelocationConfig {
            digest_max_layers: DEFAULT_DIGEST_MAX_LAYERS,
            namespace_max_layers: DEFAULT_NAMESPACE_MAX_LAYERS,
            node_max_layers: DEFAULT_NODE_MAX_LAYERS,
            keep_free: DEFAULT_KEEP_FREE,
        }
    }
}

/// The size and free space of a filesystem, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes free to unprivileged writers (`f_bavail`), as the kubelet
    /// counts `nodefs.available`.
    pub free: u64,
    /// The filesystem's size.
    pub size: u64,
}

impl Space {
    /// The filesystem holding `dir`.
    pub fn of(dir: &Path) -> std::io::Result<Space> {
        let st = rustix::fs::statvfs(dir)?;
        Ok(Space {
            free: st.f_bavail.saturating_mul(st.f_frsize),
            size: st.f_blocks.saturating_mul(st.f_frsize),
        })
    }
}

/// A new layer asked for.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// Of this digest.
    pub digest: &'a Digest,
    /// For this mount path.
    pub mount_path: &'a str,
    /// By a pod of this namespace.
    pub namespace: &'a str,
    /// Taking this many bytes of disk.
    pub bytes: u64,
}

/// How many layers there are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Of the digest asked for.
    pub of_digest: u64,
    /// Made for the namespace asking.
    pub of_namespace: u64,
    /// On the node.
    pub on_node: u64,
}

/// Whether the layer `asked` may be made, given `config`, the layers there
/// are (`held`) and the store's filesystem (`space`).
pub fn admit_layer(
    config: &RelocationConfig,
    asked: Asked<'_>,
    held: Held,
    space: Space,
) -> Result<(), Status> {
    let Asked {
        digest,
        mount_path,
        namespace,
        bytes,
    } = asked;
    let asked = format!(
        "a relocation layer of {digest} for the mount path {mount_path} (namespace {namespace})"
    );
    let refuse = |cap: LayerCap, took: String, value: String| {
        Status::resource_exhausted(format!(
            "{asked} {took}, over the cap {}={value}: mount the cache at a path its \
             pods already use (a layer goes once no pod mounts it), or raise the \
             chart's {} (gkm-csi {})",
            cap.flag(),
            cap.chart_value(),
            cap.flag(),
        ))
    };
    let whose_ns = format!("namespace {namespace}'s");
    let counts = [
        (
            LayerCap::DigestLayers,
            held.of_digest,
            config.digest_max_layers,
            "the digest's",
        ),
        (
            LayerCap::NamespaceLayers,
            held.of_namespace,
            config.namespace_max_layers,
            whose_ns.as_str(),
        ),
        (
            LayerCap::NodeLayers,
            held.on_node,
            config.node_max_layers,
            "the node's",
        ),
    ];
    for (cap, held, max, whose) in counts {
        if held.saturating_add(1) > max {
            return Err(refuse(
                cap,
                format!(
                    "would take {whose} relocation layers to {} ({held} made already)",
                    held.saturating_add(1)
                ),
                max.to_string(),
            ));
        }
    }
    let keep = config.keep_free;
    let reserve = keep.bytes_of(space.size);
    if space.free < bytes || space.free - bytes < reserve {
        return Err(refuse(
            LayerCap::KeepFree,
            format!(
                "of {bytes} bytes would leave less than the free-space reserve of {reserve} \
                 bytes ({keep} of the store's filesystem) free: {} bytes free",
                space.free
            ),
            keep.to_string(),
        ));
    }
    Ok(())
}

/// The relocation layers of a node's store, made within their bounds.
#[derive(Debug, Default)]
pub struct Relocations {
    config: RelocationConfig,
    /// Held while a layer is counted, checked and made: one at a time, so
    /// two makers never both fit the last place under a cap.
    making: Mutex<()>,
}

impl Relocations {
    /// Layers made within `config`.
    pub fn new(config: RelocationConfig) -> Relocations {
        Relocations {
            config,
            making: Mutex::new(()),
        }
    }

    /// The relocation layer that makes the verified `tree` of the store
    /// entry `digest` (below the store root `store`) a hit at
    /// `mount_path` for a pod of `namespace`: the one made already, or one
    /// made now within the bounds (and counted against `namespace`).
    /// `FAILED_PRECONDITION` when the tree cannot be relocated,
    /// `RESOURCE_EXHAUSTED` past a bound ([`admit_layer`]).
    pub fn ensure(
        &self,
        store: &Path,
        digest: &Digest,
        tree: &Path,
        mount_path: &str,
        namespace: &str,
    ) -> Result<Relocation, Status> {
        let failed = |e: &dyn std::fmt::Display| {
            Status::failed_precondition(format!(
                "relocating {digest} to the pod's mount path {mount_path}: {e}"
            ))
        };
        if let Some(dir) = find_layer(store, digest, mount_path).map_err(|e| failed(&e))? {
            return Ok(Relocation::Layer(dir));
        }
        let _making = self
            .making
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Another publish may have made it while this one waited.
        let layer = match plan_layer(store, digest, tree, mount_path).map_err(|e| failed(&e))? {
            Planned::NotNeeded => return Ok(Relocation::NotNeeded),
            Planned::Exists(dir) => return Ok(Relocation::Layer(dir)),
            Planned::New(layer) => layer,
        };
        if !is_dns1123_subdomain(namespace) {
            return Err(Status::invalid_argument(format!(
                "the pod's namespace {namespace:?} is not a namespace name"
            )));
        }
        sweep_staging(store, digest).map_err(|e| failed(&e))?;
        let count = count_layers(store, digest).map_err(|e| failed(&e))?;
        let held = Held {
            of_digest: count.of_digest,
            of_namespace: layer_owners::count(store, namespace).map_err(|e| failed(&e))?,
            on_node: count.on_node,
        };
        let space = Space::of(store).map_err(|e| failed(&e))?;
        let asked = Asked {
            digest,
            mount_path,
            namespace,
            bytes: layer.bytes(),
        };
        admit_layer(&self.config, asked, held, space)?;
        // Marked first: a layer is never there uncounted.
        layer_owners::mark(store, namespace, layer.dir()).map_err(|e| failed(&e))?;
        let layer = layer.write().map_err(|e| failed(&e))?;
        tracing::info!(%digest, mount_path, layer = %layer.display(), "made a relocation layer");
        Ok(Relocation::Layer(layer))
    }
}

impl Relocations {
    /// Removes the relocation layers below the store root `store` that no
    /// view stacks, as `records` (the mount records, a superset of the
    /// views mounted) say, and that were made more than `grace` ago (a
    /// publish makes its layer before it records its mount). A record
    /// naming no mount path published before `since` (when this driver
    /// started) may come from a driver that recorded none: every layer of
    /// its digest is kept while it stands. The caller holds the lock of publishes, so no
    /// publish records a view of one meanwhile. The layers removed.
    pub fn remove_unused(
        &self,
        store: &Path,
        records: &[MountRecord],
        since: jiff::Timestamp,
        grace: Duration,
    ) -> std::io::Result<Vec<PathBuf>> {
        let _making = self
            .making
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (earlier, recorded): (Vec<&MountRecord>, Vec<&MountRecord>) = records
            .iter()
            .partition(|r| r.published < since && r.mount_path.is_none());
        let kept: Vec<&Digest> = earlier.iter().map(|r| &r.digest).collect();
        let in_use: Vec<(&Digest, &Path)> = recorded
            .iter()
            .filter_map(|r| Some((&r.digest, Path::new(r.mount_path.as_deref()?))))
            .collect();
        let made_before = SystemTime::now()
            .checked_sub(grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        remove_unused_layers(store, &in_use, &kept, made_before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    const GIB: u64 = 1 << 30;

    fn room() -> Space {
        Space {
            free: 50 * GIB,
            size: 100 * GIB,
        }
    }

    fn held(of_digest: u64, of_namespace: u64, on_node: u64) -> Held {
        Held {
            of_digest,
            of_namespace,
            on_node,
        }
    }

    fn asked<'a>(digest: &'a Digest, mount_path: &'a str, bytes: u64) -> Asked<'a> {
        Asked {
            digest,
            mount_path,
            namespace: "team",
            bytes,
        }
    }

    #[test]
    fn a_layer_past_a_count_cap_is_refused_naming_the_flag_and_the_chart_value() {
        let config = RelocationConfig {
            digest_max_layers: 2,
            namespace_max_layers: 3,
            node_max_layers: 4,
            ..RelocationConfig::default()
        };
        let digest = Digest::of(b"cache");
        let admit = |held| admit_layer(&config, asked(&digest, "/mnt/x", 8192), held, room());
        assert!(admit(held(1, 2, 3)).is_ok());
        let digest_cap = admit(held(2, 2, 2)).expect_err("digest cap");
        assert_eq!(digest_cap.code(), Code::ResourceExhausted);
        for named in [
            "--relocation-digest-max-layers=2",
            "views.relocation.digestMaxLayers",
            "/mnt/x",
        ] {
            assert!(digest_cap.message().contains(named), "{digest_cap:?}");
        }
        let namespace_cap = admit(held(0, 3, 3)).expect_err("namespace cap");
        for named in [
            "--relocation-namespace-max-layers=3",
            "views.relocation.namespaceMaxLayers",
            "namespace team's",
        ] {
            assert!(namespace_cap.message().contains(named), "{namespace_cap:?}");
        }
        let node_cap = admit(held(0, 0, 4)).expect_err("node cap");
        for named in [
            "--relocation-node-max-layers=4",
            "views.relocation.nodeMaxLayers",
        ] {
            assert!(node_cap.message().contains(named), "{node_cap:?}");
        }
    }

    #[test]
    fn a_layer_that_would_eat_into_the_free_space_reserve_is_refused() {
        let config = RelocationConfig::default();
        let digest = Digest::of(b"cache");
        let none_held = Held::default();
        let space = Space {
            free: 12 * GIB + 8192,
            size: 100 * GIB,
        };
        assert!(admit_layer(&config, asked(&digest, "/m", 8192), none_held, space).is_ok());
        let refused = admit_layer(&config, asked(&digest, "/m", 8193), none_held, space)
            .expect_err("into the reserve");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        for named in ["--relocation-keep-free=12%", "views.relocation.keepFree"] {
            assert!(refused.message().contains(named), "{refused:?}");
        }
        let full = Space {
            free: 4096,
            size: 100 * GIB,
        };
        let none = RelocationConfig {
            keep_free: FreeSpaceReserve::NONE,
            ..config
        };
        assert!(admit_layer(&none, asked(&digest, "/m", 8192), none_held, full).is_err());
        let bytes = RelocationConfig {
            keep_free: FreeSpaceReserve::bytes(GIB),
            ..none
        };
        let little = Space {
            free: GIB,
            size: 100 * GIB,
        };
        let refused = admit_layer(&bytes, asked(&digest, "/m", 8192), none_held, little)
            .expect_err("into a reserve of bytes");
        assert!(
            refused.message().contains("--relocation-keep-free=1GiB"),
            "{refused:?}"
        );
    }
}
