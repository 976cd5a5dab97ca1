//! A node's GPUs as gkm's kubelet plugins hand them to containers: the
//! node's sysfs, `/dev` and `/proc` (each root a parameter, see
//! [`NodePaths`]) read into devices ([`resources`]), each with what a
//! container needs to use it (device nodes, the IDs its variables carry),
//! and named as Kubernetes resources ([`naming`]).
//!
//! The device plugin (`gkm-k8s-device-plugin`) and the DRA plugin
//! (`gkm-k8s-dra`) both read the node through this crate, so a device is
//! the same device whichever path offers it. With the `testing` feature,
//! `node_tree` builds a simulated node's trees for tests. [`fingerprint()`]
//! tells cheaply whether the node may have changed since it was last read,
//! and [`rescan`] decides from it when a polling plugin reads it again.

mod fingerprint;
pub mod naming;
#[cfg(feature = "testing")]
pub mod node_tree;
pub mod rescan;
pub mod resources;

pub use fingerprint::{Fingerprint, fingerprint};
pub use resources::{NodePaths, Resource, ResourceKind, Snapshot, scan};
