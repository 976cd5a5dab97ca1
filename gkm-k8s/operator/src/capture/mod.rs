//! The on-cluster capture's decisions, pure and unit-tested: what to do
//! next for a `GKMCacheCapture` ([`decide`]) and the Job that runs
//! `gkm capture` for it ([`job`]).
//!
//! Not wired yet: no controller watches captures or carries these
//! decisions out, and nothing calls the CSI driver's `release_capture`, so
//! the `GKMCacheCapture` CRD is not installed. `csi.gkm.io` serves the
//! capture volumes (`gkm_k8s_csi::capture`), and
//! `bins/gkm-local/tests/real_capture.rs` runs these decisions and this Job
//! by hand on a real node, standing in for the controller. Until the
//! controller exists, capture off-cluster with `gkm capture`.

pub mod decide;
pub mod job;
