//! gkm's domain model: GPU kernel caches, GPUs and whether one fits the other.
//!
//! This crate does no network and no Kubernetes work, so third parties can use
//! it (with `gkm-oci`) to check and extract a cache without pulling in kube.
//!
//! - [`gpu`]: the vendor-neutral GPU model every discovery backend produces.
//! - [`cache`]: cache kinds, scanning a cache directory into a
//!   [`cache::CacheManifest`] and its [`cache::Summary`].
//! - [`compat`]: matching a manifest or summary against GPUs, with a reason for
//!   every mismatch.

pub mod cache;
pub mod compat;
pub mod gpu;

pub use gpu::{Arch, Backend, Gpu, Vendor};
