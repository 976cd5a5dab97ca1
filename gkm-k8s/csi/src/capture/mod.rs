//! Capture: the trees workloads compile their kernel caches into, kept on
//! the node until a capture Job has read them.
//!
//! - [`tree`]: a capture tree, `<store>/captures/<namespace>/<capture>/<pod
//!   uid>`, a bounded `tmpfs` that outlives its pod and the driver;
//! - [`admission`]: which trees are made at all (enabled, a pending
//!   capture, the per-namespace and per-node caps);
//! - [`CaptureTrees`]: publishing a capture volume (the workload's own tree,
//!   writable, or a tree read-only for the capture Job) and releasing a
//!   tree;
//! - [`release`]: when a tree goes, once nothing will capture it;
//! - [`markers`]: the times of a tree the driver keeps itself, which
//!   [`release`] reads;
//! - [`delta`]: a writable cache view that names a capture keeps its upper
//!   as that capture's tree, for a delta capture on the cache.

pub mod admission;
pub mod delta;
pub mod markers;
mod publish;
pub mod release;
pub mod tree;

pub use publish::CaptureTrees;
