//! The on-cluster capture: what to do next for a `GKMCacheCapture`
//! ([`decide`], pure), read from the cluster (`observe`, pure), the Job
//! that runs `gkm capture` for it ([`job`]), the ended workload pods it
//! acts on, watched only where a capture is under way (`workloads`), and
//! the controller carrying the decisions out (`controller`, thin glue,
//! started by [`run`]).
//!
//! Its reconciles run as every controller's do (the crate's runner: a panic
//! contained, metrics under `gkmcachecapture`, the same retries).
//!
//! The operator runs the controller when `OperatorConfig::capture` is set
//! (`gkm-operator --capture`, on by default); the chart installs the CRD,
//! its RBAC and the admission policy admitting only the capture Jobs
//! [`job`] makes. The node's captured tree is removed by the CSI driver
//! (`gkm_k8s_csi::release_captures`) once the capture is over.

mod controller;
pub mod decide;
pub mod job;
mod observe;
mod workloads;

pub use controller::{CaptureControllerOptions, run};
