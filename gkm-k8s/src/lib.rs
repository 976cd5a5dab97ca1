//! gkm's Kubernetes side: the `gkm.io/v1alpha1` custom resources, and (as they
//! land) the operator's and agent's controllers, the CSI node service, the
//! device plugin and the scheduler extender.
#![deny(missing_docs)]

pub mod agent;
pub mod cache_object;
pub mod crd;
pub mod csi;
pub mod device_plugin;
pub mod error;
pub mod extender;
pub mod fuzzing;
pub mod node_files;
pub mod operator;
pub mod podresources;
pub mod pvc;
pub mod runtime;
pub mod webhook;

pub use error::{Error, Result};
