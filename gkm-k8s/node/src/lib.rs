//! What gkm's node components share on a node, readable without the
//! Kubernetes API: the [CSI volume](volume) a pod mounts a cache with, and
//! the node-local files through which the node agent and the CSI driver
//! cooperate: the [delivery index](delivery) (agent → driver), the [mount
//! records](mount_records) (driver → agent) and their [check against the
//! kernel](mount_table), which reads the kernel's [mount table](mountinfo),
//! and the [capture index](captures) (agent → driver): what the cluster says
//! of the captures whose trees are on the node.
//!
//! These files live beside the content-addressed store
//! ([`gkm_core::store_layout::StoreLayout`], whose entries are
//! `<store>/sha256/<hex>/`):
//!
//! - The **delivery index**, written by the agent, read by the CSI driver: per
//!   cache, the digest to deliver and whether it may be delivered on this node.
//!   - `<store>/delivery/gkmcache/<namespace>/<name>.json` for a `GKMCache`,
//!   - `<store>/delivery/clustergkmcache/<name>.json` for a `ClusterGKMCache`,
//!
//!   each `{"digest": "sha256:…", "deliverable": bool, "verdict": …,
//!   "reason": "…", "updated": "<RFC 3339>", "workloadNamespaces": […]}`
//!   (the last for a `ClusterGKMCache` that names them), where `verdict` is one of
//!   `deliverable`, `notVerified`, `incompatible`, `notExtracted` and `reason`
//!   (absent when deliverable) says why not, in words that end up in the pod's
//!   events.
//! - The **mount records**, written by the CSI driver, read by the agent: one
//!   `<store>/mounts/<volume-file>.json` per published volume (pod namespace,
//!   name and uid, the cache, the digest, the target path), written before the
//!   bind mount and removed after the unmount, so the records are always a
//!   superset of what is mounted. The agent counts pods per digest from them,
//!   and must not remove a store directory some record still names.
//! - The **capture index**, written by the agent, read by the CSI driver:
//!   `<store>/delivery/captures.json`, the state (`open`, `over`, `gone`) of
//!   each `GKMCacheCapture` a captured tree on the node names, from which the
//!   driver decides which trees to remove ([`captures`]).
//!
//! Readers ignore fields they do not know, so an agent and a driver of
//! neighbouring versions (their DaemonSets roll separately) still agree.
//!
//! Every file is written atomically (a temporary file in the same directory,
//! synced, then renamed over the old one), so a reader sees the old or the new
//! content, never a torn one. Cache and namespace names are checked to be
//! Kubernetes object names before they become paths.
//!
//! ```
//! use gkm_core::CacheKey;
//! use gkm_k8s_node::delivery::{Delivery, DeliveryIndex, Verdict};
//!
//! let store = tempfile::tempdir()?;
//! let index = DeliveryIndex::new(store.path());
//! let key = CacheKey::namespaced("ml", "llama");
//! let digest: gkm_core::Digest =
//!     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".parse()?;
//!
//! // The agent: this node's GPUs do not fit the cache.
//! index.publish(&key, &Delivery::refused(digest.clone(), Verdict::Incompatible, "GPU 0 Tesla T4: no target fits"))?;
//!
//! // The CSI driver: refuses the mount, saying why.
//! let delivery = index.get(&key)?.expect("recorded");
//! assert!(!delivery.is_deliverable());
//! assert_eq!(delivery.reason.as_deref(), Some("GPU 0 Tesla T4: no target fits"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod captures;
pub mod delivery;
mod error;
mod json_file;
pub mod mount_records;
pub mod mount_table;
pub mod mountinfo;
pub mod names;
pub mod relocation;
pub mod usage;
pub mod volume;

pub use error::{Error, Result};

/// The delivery index's directory under the store root.
pub const DELIVERY_DIR: &str = "delivery";
/// The mount records' directory under the store root.
pub const MOUNTS_DIR: &str = "mounts";

/// Digests and cache keys for the node files' tests.
#[cfg(test)]
mod test_keys {
    use gkm_core::{CacheKey, Digest};

    /// A digest told apart by `n`.
    pub(super) fn digest(n: u8) -> Digest {
        Digest::of(&[n])
    }

    /// The key of the namespaced cache `ns/name`.
    pub(super) fn ns_key(ns: &str, name: &str) -> CacheKey {
        CacheKey::namespaced(ns, name)
    }

    /// The key of the cluster cache `name`.
    pub(super) fn cluster_key(name: &str) -> CacheKey {
        CacheKey::cluster(name)
    }
}
