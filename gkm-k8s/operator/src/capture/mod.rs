//! The on-cluster capture's decisions, pure and unit-tested: what to do
//! next for a `GKMCacheCapture` ([`decide`]) and the Job that runs
//! `gkm capture` for it ([`job`]).
//!
//! Not wired yet: no controller watches captures, and `csi.gkm.io` does not
//! yet serve capture volumes (`csi.gkm.io/GKMCacheCapture`), so the
//! `GKMCacheCapture` CRD is not installed. Until then, capture off-cluster
//! with `gkm capture`.

pub mod decide;
pub mod job;
