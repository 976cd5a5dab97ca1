//! `csi.gkm.io`: the CSI node driver that mounts verified, compatible kernel
//! caches into pods, and keeps what pods compile for a capture (Linux with
//! overlayfs and the mount API, 5.2 or later).
//!
//! It mounts four trees, each one [`Volume`] a request is read into
//! ([`parse_volume`]):
//!
//! - the **read-only view** of a cache (a volume the pod mounts
//!   `readOnly`);
//! - a **copy-on-write view** of a cache, whose writes go to an upper of
//!   that publish's own, bounded, removed with the view;
//! - a **capture tree**: a workload's own writable, bounded tree that
//!   outlives it, which the capture's Job then mounts read-only;
//! - a **copy-on-write view keeping a delta upper**: a writable cache
//!   volume that also names a capture keeps its upper as that capture's
//!   tree, for a delta capture on the cache.
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
//! ([`CaptureTrees`]). A writable cache volume naming a capture as well keeps
//! its upper as that tree, for a delta capture on the cache. [`run`] owns
//! the driver's lifecycle: the kubelet registration, the sweeps of stale
//! mount records and uppers, the release of capture trees
//! ([`release_captures`]), serving CSI ([`serve_csi`]) and its metrics
//! ([`CsiCollector`]).
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
//! index](gkm_k8s_node::captures): [`release_captures`]) and writes
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
//!   symbolic link) at the target path. A volume the
//!   pod mounts `readOnly` gets the read-only view: an overlay whose only
//!   layers are the tree and an empty directory, so a read-only filesystem,
//!   mounted `ro`, `nosuid`, `nodev`, read-only in the copies the host and
//!   the container runtime see. Any other
//!   gets a copy-on-write view whose writes go to an upper layer private to
//!   that publish, bounded, writable by the pod's fsGroup
//!   ([`WRITABLE_MAX_BYTES`]). No pod can write into the
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

mod capture;
mod driver;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod identity;
mod metrics;
mod node;
mod views;
mod volume;

pub use capture::CaptureTrees;
pub use capture::admission::{
    Cap, CaptureConfig, DEFAULT_NAMESPACE_MAX_BYTES, DEFAULT_NAMESPACE_MAX_TREES,
    DEFAULT_NODE_MAX_BYTES, DEFAULT_NODE_MAX_TREES, DEFAULT_UNREAD_GRACE,
};
pub use capture::delta::{DeltaBase, read_record as read_delta_record};
pub use capture::release::{ReleaseOptions, release_captures};
pub use capture::tree::{
    CAPTURE_MAX_BYTES, CAPTURE_MAX_INODES, CAPTURE_MIN_BYTES, make_tree, remove_tree,
};
pub use driver::{
    BadEndpoint, CAPTURE_RELEASE_CHECK, Driver, DriverConfig, MOUNT_RECORD_CHECK, PLUGIN,
    Registration, RunConfig, RunError, endpoint_socket, forget_stale_mount_records,
    remove_unused_layers, run, serve_csi,
};
pub use gkm_k8s_kubelet::proto::csi as proto;
pub use gkm_k8s_kubelet::registration::{RegistrationService, serve_registration};
pub use gkm_k8s_node::captures::{DELTA_RECORD_FILE, DELTA_UPPER_DIR};
pub use gkm_k8s_node::volume::{
    ATTR_CACHE, ATTR_CLUSTER_CACHE, ATTR_NAMESPACE, CTX_EPHEMERAL, CTX_POD_NAME, CTX_POD_NAMESPACE,
    CTX_POD_UID, DRIVER_NAME,
};
pub use identity::IdentityService;
pub use metrics::{CsiCollector, CsiMetrics};
pub use node::NodeService;
pub use views::mount::{bind, mount_at, unmount_all};
pub use views::relocate::{
    DEFAULT_DIGEST_MAX_LAYERS, DEFAULT_KEEP_FREE, DEFAULT_NAMESPACE_MAX_LAYERS,
    DEFAULT_NODE_MAX_LAYERS, LayerCap, RelocationConfig,
};
pub use views::upper::{WRITABLE_MAX_BYTES, WRITABLE_MAX_BYTES_LIMIT};
pub use views::{DEFAULT_GROUP_MAX_DIRS, GROUP_MAX_DIRS_FLAG, GROUP_MAX_DIRS_VALUE, ViewsConfig};
pub use volume::{
    CacheVolume, CaptureVolume, PodVolume, TreeOf, View, Volume, parse as parse_volume,
};
