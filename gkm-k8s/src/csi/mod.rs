//! `csi.gkm.io`: the CSI node driver that mounts an extracted kernel cache
//! read-only into pods.
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
//! The volume is an inline ephemeral volume: the `CSIDriver` object declares
//! `volumeLifecycleModes: [Ephemeral]`, `podInfoOnMount: true` (so the kubelet
//! passes `csi.storage.k8s.io/ephemeral` and the pod's namespace, name and
//! uid) and `attachRequired: false`. There is no controller service.
//!
//! # The contract with the node agent
//!
//! The driver never talks to the Kubernetes API. It reads the agent's
//! decisions from the node-local [delivery index](crate::node_files::delivery) and writes
//! [mount records](crate::node_files::mount_records::MountRecords) the agent counts pods from:
//!
//! - `NodePublishVolume` first applies the [access rules](access): a
//!   `GKMCache` only for pods of its namespace, a `ClusterGKMCache` only for
//!   pods of its `workloadNamespaces` (any namespace when unset)
//!   (`PERMISSION_DENIED` otherwise). It then looks the cache up in the
//!   index. Only when the entry is deliverable (verified, compatible with a
//!   GPU of this node, extracted) and the digest's store directory
//!   `<store>/sha256/<hex>` exists ([`gkm_oci::Store::get`]), it records the
//!   mount and bind-mounts the entry's cache tree (`io.triton.cache/` or
//!   `io.vllm.cache/`, a real directory, never a symbolic link:
//!   [`mount::CacheTree`]) onto the target path, then remounts it read-only,
//!   `nosuid`, `nodev`. The pod sees the cache at its volume root, as GKM's
//!   pods do: a Triton cache's hash directories (what `TRITON_CACHE_DIR`
//!   points at), a vLLM cache's `torch_compile_cache/`. One store copy per
//!   digest serves every pod. Otherwise it fails, and the message (shown in
//!   the pod's events) says why:
//!   - `NOT_FOUND`: the index has no entry for the cache (unknown cache, or
//!     the agent has not seen it yet);
//!   - `FAILED_PRECONDITION`: the digest is not verified, or no GPU of the
//!     node fits it (with the agent's per-GPU reasons);
//!   - `UNAVAILABLE`: not extracted yet (the kubelet retries);
//!   - `INVALID_ARGUMENT`: missing or malformed attributes, not an ephemeral
//!     volume, block access.
//! - Publishing again with the same volume id and target is a no-op once the
//!   target is that digest's read-only bind mount.
//! - `NodeUnpublishVolume` unmounts the target (tolerating one already
//!   unmounted or gone), removes the directory, then removes the record.
//!
//! # Registration with the kubelet
//!
//! [`registration`] serves the kubelet's plugin-registration API
//! (`pluginregistration.Registration`) on a socket in the kubelet's
//! `plugins_registry` directory, so no node-driver-registrar sidecar is
//! needed. The kubelet's plugin watcher sends the socket path as the HTTP/2
//! `:authority`, which h2 refuses; [`authority::AuthorityFix`] replaces it
//! with `localhost` before the server reads it. The socket path the kubelet is told (`--kubelet-registration-path`)
//! is the CSI socket as seen from the host.
//!
//! # Host setup
//!
//! The driver runs privileged, with the kubelet's pods directory mounted with
//! `mountPropagation: Bidirectional` so that its bind mounts reach the pods,
//! and the node store (the agent's `--store`) mounted at the same `--store`.

pub mod access;
pub mod authority;
pub mod client;
pub mod identity;
pub mod mount;
pub mod node;
pub mod registration;
pub mod server;
pub mod volume;

pub use identity::IdentityService;
pub use node::NodeService;
pub use server::{Driver, DriverConfig, serve_csi, serve_registration};

/// The generated CSI v1 messages and services (package `csi.v1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// The generated kubelet plugin-registration messages and service (package
/// `pluginregistration`, the kubelet's v1 API).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod registration_proto {
    tonic::include_proto!("pluginregistration");
}

/// The driver's name.
pub const DRIVER_NAME: &str = "csi.gkm.io";
/// The volume attribute naming a `GKMCache`.
pub const ATTR_CACHE: &str = "csi.gkm.io/GKMCache";
/// The volume attribute naming the `GKMCache`'s namespace.
pub const ATTR_NAMESPACE: &str = "csi.gkm.io/namespace";
/// The volume attribute naming a `ClusterGKMCache`.
pub const ATTR_CLUSTER_CACHE: &str = "csi.gkm.io/ClusterGKMCache";
/// The kubelet's marker of an inline ephemeral volume (`"true"`).
pub const CTX_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's namespace, as the kubelet passes it.
pub const CTX_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's name, as the kubelet passes it.
pub const CTX_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The pod's uid, as the kubelet passes it.
pub const CTX_POD_UID: &str = "csi.storage.k8s.io/pod.uid";
