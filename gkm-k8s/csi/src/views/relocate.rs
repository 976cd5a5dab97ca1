//! Bounds on relocation layers ([`gkm_k8s_node::relocation`]): every new
//! `csi.gkm.io/mountPath` a pod names makes a layer of every group file of
//! its tree on the node's disk, so a tenant who may only create pods could
//! fill the disk with fresh paths. A new layer is made only
//!
//! - for a mount path of at most
//!   [`MOUNT_PATH_MAX_BYTES`](gkm_k8s_node::relocation::MOUNT_PATH_MAX_BYTES)
//!   (the volume is refused with `INVALID_ARGUMENT` before this);
//! - while the digest's layers, and the node's, plus the new one stay
//!   within [`RelocationConfig::digest_max_layers`] and
//!   [`RelocationConfig::node_max_layers`];
//! - while writing it leaves the store's filesystem its free-space reserve
//!   ([`RelocationConfig::keep_free`]), as the agent keeps its extractions
//!   within its own (`--keep-free`, by default the same 12%).
//!
//! Each refusal is `RESOURCE_EXHAUSTED` naming the `gkm-csi` flag, its
//! value and the chart's value to raise; the kubelet shows it in the pod's
//! `FailedMount` event and retries. A layer made already is reused whatever
//! the bounds. Layers are made under a lock of their own, not the driver's
//! lock of publishes ([`Relocations::ensure`]): a publish that makes a large
//! layer stalls only the others making one.
//!
//! [`admit_layer`] is the decision, pure; [`Relocations::ensure`] gathers
//! what it reads.

use std::path::Path;
use std::sync::Mutex;

use gkm_core::Digest;
use gkm_core::free_space::FreeSpaceReserve;
use gkm_k8s_node::relocation::{
    LayerCount, Planned, Relocation, count_layers, find_layer, plan_layer, sweep_staging,
};
use tonic::Status;

/// The relocation layers one digest may have on a node by default.
pub const DEFAULT_DIGEST_MAX_LAYERS: u64 = 16;
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
            LayerCap::NodeLayers => "--relocation-node-max-layers",
            LayerCap::KeepFree => "--relocation-keep-free",
        }
    }

    /// The chart's value that sets the flag.
    pub fn chart_value(self) -> &'static str {
        match self {
            LayerCap::DigestLayers => "views.relocation.digestMaxLayers",
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

/// Whether a new layer of `bytes` for `digest` at `mount_path` may be
/// made, given `config`, the layers there are (`count`) and the store's
/// filesystem (`space`).
pub fn admit_layer(
    config: &RelocationConfig,
    digest: &Digest,
    mount_path: &str,
    count: LayerCount,
    bytes: u64,
    space: Space,
) -> Result<(), Status> {
    let asked = format!("a relocation layer of {digest} for the mount path {mount_path}");
    let refuse = |cap: LayerCap, took: String, value: String| {
        Status::resource_exhausted(format!(
            "{asked} {took}, over the cap {}={value}: mount the cache at a path its \
             pods already use, or raise the chart's {} (gkm-csi {})",
            cap.flag(),
            cap.chart_value(),
            cap.flag(),
        ))
    };
    let counts = [
        (
            LayerCap::DigestLayers,
            count.of_digest,
            config.digest_max_layers,
            "the digest's",
        ),
        (
            LayerCap::NodeLayers,
            count.on_node,
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
    /// `mount_path`: the one made already, or one made now within the
    /// bounds. `FAILED_PRECONDITION` when the tree cannot be relocated,
    /// `RESOURCE_EXHAUSTED` past a bound ([`admit_layer`]).
    pub fn ensure(
        &self,
        store: &Path,
        digest: &Digest,
        tree: &Path,
        mount_path: &str,
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
        sweep_staging(store, digest).map_err(|e| failed(&e))?;
        let count = count_layers(store, digest).map_err(|e| failed(&e))?;
        let space = Space::of(store).map_err(|e| failed(&e))?;
        admit_layer(
            &self.config,
            digest,
            mount_path,
            count,
            layer.bytes(),
            space,
        )?;
        let layer = layer.write().map_err(|e| failed(&e))?;
        tracing::info!(%digest, mount_path, layer = %layer.display(), "made a relocation layer");
        Ok(Relocation::Layer(layer))
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

    fn count(of_digest: u64, on_node: u64) -> LayerCount {
        LayerCount { of_digest, on_node }
    }

    #[test]
    fn a_layer_past_a_count_cap_is_refused_naming_the_flag_and_the_chart_value() {
        let config = RelocationConfig {
            digest_max_layers: 2,
            node_max_layers: 3,
            ..RelocationConfig::default()
        };
        let digest = Digest::of(b"cache");
        let admit = |count, space| admit_layer(&config, &digest, "/mnt/x", count, 8192, space);
        assert!(admit(count(1, 2), room()).is_ok());
        let digest_cap = admit(count(2, 2), room()).expect_err("digest cap");
        assert_eq!(digest_cap.code(), Code::ResourceExhausted);
        for named in [
            "--relocation-digest-max-layers=2",
            "views.relocation.digestMaxLayers",
            "/mnt/x",
        ] {
            assert!(digest_cap.message().contains(named), "{digest_cap:?}");
        }
        let node_cap = admit(count(0, 3), room()).expect_err("node cap");
        for named in [
            "--relocation-node-max-layers=3",
            "views.relocation.nodeMaxLayers",
        ] {
            assert!(node_cap.message().contains(named), "{node_cap:?}");
        }
    }

    #[test]
    fn a_layer_that_would_eat_into_the_free_space_reserve_is_refused() {
        let config = RelocationConfig::default();
        let digest = Digest::of(b"cache");
        let space = Space {
            free: 12 * GIB + 8192,
            size: 100 * GIB,
        };
        assert!(admit_layer(&config, &digest, "/m", count(0, 0), 8192, space).is_ok());
        let refused = admit_layer(&config, &digest, "/m", count(0, 0), 8193, space)
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
        assert!(admit_layer(&none, &digest, "/m", count(0, 0), 8192, full).is_err());
        let bytes = RelocationConfig {
            keep_free: FreeSpaceReserve::bytes(GIB),
            ..none
        };
        let refused = admit_layer(
            &bytes,
            &digest,
            "/m",
            count(0, 0),
            8192,
            Space {
                free: GIB,
                size: 100 * GIB,
            },
        )
        .expect_err("into a reserve of bytes");
        assert!(
            refused.message().contains("--relocation-keep-free=1GiB"),
            "{refused:?}"
        );
    }
}
