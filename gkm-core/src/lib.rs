//! gkm's domain model: GPU kernel caches, GPUs and whether one fits the other.
//!
//! This crate does no network and no Kubernetes work, so third parties can use
//! it (with `gkm-oci`) to check and extract a cache without pulling in kube.
//!
//! - [`assignment`]: the `gkm.io/gpu-assignment` pod annotation a scheduler
//!   writes and the device plugin honours.
//! - [`gpu`]: the vendor-neutral GPU model every discovery backend produces.
//! - [`cache`]: cache kinds, each a [`cache::Kind`] registered in
//!   [`cache::kinds::REGISTRY`], scanning a cache directory into a
//!   [`cache::CacheManifest`] and its [`cache::Summary`].
//! - [`variant`]: which variant of a multi-target image a node's GPUs get.
//! - [`compat`]: matching a manifest or summary against GPUs, with a reason for
//!   every mismatch.
//! - [`digest`]: the `sha256:<hex>` digests that name images, blobs and store
//!   entries.
//! - [`image_layout`] and [`store_layout`]: where a cache sits in its image
//!   layer, and where a node store keeps each extracted image.
//! - [`cache_key`]: naming a `GKMCache` or `ClusterGKMCache`.
//! - [`delta`]: which entries of a writable view's overlay upper make a
//!   delta image of its base, and the [`delta::DeltaBase`] record.
//! - [`duration`]: durations as cache specs and flags write them (`90s`,
//!   `1h30m`).
//!
//! ```no_run
//! use gkm_core::{Gpu, cache, compat};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manifest = cache::scan("/home/me/.triton/cache".as_ref())?;
//! println!("{} kernels for {}", manifest.entries().len(), manifest.summary());
//! let gpus: Vec<Gpu> = serde_json::from_str(&std::fs::read_to_string("gpus.json")?)?;
//! let report = compat::check_manifest(&manifest, &gpus, &compat::CheckOptions::default());
//! print!("{report}");
//! # Ok(()) }
//! ```

pub mod assignment;
pub mod bytes;
pub mod cache;
pub mod cache_key;
pub mod compat;
pub mod delta;
pub mod digest;
pub mod duration;
pub mod explain;
pub mod free_space;
pub mod gpu;
pub mod image_layout;
pub mod policy;
mod refusal;
pub mod store_layout;
pub mod usage;
pub mod variant;
pub mod view;

pub use cache_key::{CacheKey, Scope};
pub use digest::Digest;
pub use gpu::{Arch, Backend, Gpu, Vendor};
pub use refusal::Refusal;
