//! The on-cluster capture: what to do next for a `GKMCacheCapture`
//! ([`decide`], pure), read from the cluster ([`observe`], pure), the Job
//! that runs `gkm capture` for it ([`job`]), and the controller carrying
//! the decisions out ([`controller`], thin glue).
//!
//! The operator does not start the controller yet (the `GKMCacheCapture`
//! CRD, its RBAC and the admission policy for capture Jobs are not
//! installed), and nothing on the node calls the CSI driver's
//! `release_capture` when a capture is over. Until then, capture
//! off-cluster with `gkm capture`.

pub mod controller;
pub mod decide;
pub mod job;
pub mod observe;
