//! `csi.gkm.io`: the CSI node driver that mounts an extracted kernel cache
//! read-only into pods (Linux with overlayfs and the mount API, 5.2 or
//! later).
//!
//! # What a pod writes
//!
//! ```yaml
//! volumes:
//!   - name: kernels
//!     csi:
//!       driver: csi.gkm.io
//!       volumeAttributes:
//!         csi.gkm.io/GKMCache: vector-add      # a GKMCache…
//!         csi.gkm.io/namespace: ml             # …in this namespace (default: the pod's)
//!         # or: csi.gkm.io/ClusterGKMCache: vector-add
//! ```
//!
//! A pod may instead mount a capture volume (`csi.gkm.io/GKMCacheCapture:
//! <capture>`): a writable, bounded tree of its own that outlives it, which
//! the capture's Job in the same namespace then mounts read-only
//! ([`capture`]). A writable cache volume naming a capture as well keeps
//! its upper as that tree, for a delta capture on the cache ([`delta`]).
//! The driver serves its [`metrics`] with `--metrics-addr`.
//!
//! The volume is an inline ephemeral volume: the `CSIDriver` object declares
//! `volumeLifecycleModes: [Ephemeral]`, `podInfoOnMount: true` (so the kubelet
//! passes `csi.storage.k8s.io/ephemeral` and the pod's namespace, name and
//! uid) and `attachRequired: false`. There is no controller service.
//!
//! # The contract with the node agent
//!
//! The driver never talks to the Kubernetes API. It reads the agent's
//! decisions from the node-local [delivery index](gkm_k8s_node::delivery)
//! (and, to release captured trees, its [capture
//! index](gkm_k8s_node::captures): [`capture_release`]) and writes
//! [mount records](gkm_k8s_node::mount_records::MountRecords) the agent counts pods from:
//!
//! - `NodePublishVolume` first applies the access rules (`access`): a
//!   `GKMCache` only for pods of its namespace, a `ClusterGKMCache` only for
//!   pods of its `workloadNamespaces` (any namespace when unset)
//!   (`PERMISSION_DENIED` otherwise). It then looks the cache up in the
//!   index. Only when the entry is deliverable (verified, compatible with a
//!   GPU of this node, extracted) and the digest's store directory
//!   `<store>/sha256/<hex>` exists ([`gkm_core::store_layout::StoreLayout::get`])
//!   and carries its seal (the agent checks seals and quarantines a tree that
//!   changed), it records the mount and mounts a view of the entry's cache
//!   tree (`io.triton.cache/` or `io.vllm.cache/`, a real directory, never a
//!   symbolic link: [`mount::CacheTree`]) at the target path. A volume the
//!   pod mounts `readOnly` gets the read-only view: an overlay whose only
//!   layers are the tree and an empty directory, so a read-only filesystem,
//!   mounted `ro`, `nosuid`, `nodev`, read-only in the copies the host and
//!   the container runtime see ([`mount::mount_read_only_view`]). Any other
//!   gets a copy-on-write view whose writes go to an upper layer private to
//!   that publish, bounded, writable by the pod's fsGroup
//!   ([`upper`], [`mount::mount_writable_view`]). No pod can write into the
//!   store, whatever it asks. The pod sees the cache at its volume root, as GKM's
//!   pods do: a Triton cache's hash directories (what `TRITON_CACHE_DIR`
//!   points at), a vLLM cache's `torch_compile_cache/`. One store copy per
//!   digest serves every pod. Otherwise it fails, and the message (shown in
//!   the pod's events) says why:
//!   - `NOT_FOUND`: the index has no entry for the cache (unknown cache, or
//!     the agent has not seen it yet);
//!   - `FAILED_PRECONDITION`: the digest is not verified, or no GPU of the
//!     node fits it (with the agent's per-GPU reasons);
//!   - `UNAVAILABLE`: not extracted yet, or stored without a seal and about
//!     to be extracted again (the kubelet retries);
//!   - `INVALID_ARGUMENT`: missing or malformed attributes, not an ephemeral
//!     volume, block access.
//! - Publishing again with the same volume id and target is a no-op once the
//!   target is that view (its mount source names the digest:
//!   `gkm-cache:sha256:<hex>`, or `gkm-cache-rw:<volume id>:sha256:<hex>`).
//! - `NodeUnpublishVolume` unmounts the target (tolerating one already
//!   unmounted or gone), removes the directory and the volume's upper, then
//!   removes the record.
//!
//! # Registration with the kubelet
//!
//! [`serve_registration`] serves the kubelet's plugin-registration API
//! (`pluginregistration.Registration`) for [`PLUGIN`] on a socket in the
//! kubelet's `plugins_registry` directory, so no node-driver-registrar
//! sidecar is needed (`gkm_k8s_kubelet::registration`, which also answers
//! the `:authority` the kubelet's plugin watcher sends). The socket path the kubelet is told (`--kubelet-registration-path`)
//! is the CSI socket as seen from the host.
//!
//! # Host setup
//!
//! The driver runs privileged, with the kubelet's pods directory mounted with
//! `mountPropagation: Bidirectional` so that its mounts reach the pods,
//! and the node store (the agent's `--store`) mounted at the same `--store`.

mod access;
pub mod capture;
pub mod capture_admission;
pub mod capture_release;
pub mod delta;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod identity;
pub mod metrics;
pub mod mount;
mod node;
pub mod publish;
pub mod server;
pub mod upper;
pub mod volume;

pub use gkm_k8s_kubelet::proto::csi as proto;
pub use gkm_k8s_kubelet::registration::{RegistrationService, serve_registration};
pub use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CLUSTER_CACHE, ATTR_NAMESPACE, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE,
    CTX_POD_UID, DRIVER_NAME,
};
pub use identity::IdentityService;
pub use node::NodeService;
pub use server::{Driver, DriverConfig, forget_stale_mount_records, serve_csi};

/// What the driver tells the kubelet when it registers: a CSI plugin named
/// [`DRIVER_NAME`], serving CSI 1.0.0. Its registration socket is
/// `PLUGIN.socket_name()` in the kubelet's `plugins_registry`.
pub const PLUGIN: gkm_k8s_kubelet::registration::Plugin = gkm_k8s_kubelet::registration::Plugin {
    kind: gkm_k8s_kubelet::registration::CSI_PLUGIN_TYPE,
    name: DRIVER_NAME,
    versions: &["1.0.0"],
};
