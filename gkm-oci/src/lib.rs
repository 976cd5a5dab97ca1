//! OCI images of GPU kernel caches: build, push, pull, extract, store.
//!
//! The image format is GKM/MCV's: one layer holding `io.triton.cache/<tree>`
//! and `io.triton.manifest/manifest.json` (vLLM: `io.vllm.cache/`,
//! `io.vllm.manifest/`), config labels `cache.triton.image/*` (or
//! `cache.vllm.image/*`) with the target summary, which gkm also writes into
//! the manifest annotations; a delta image ([`delta`]) is its base's layers
//! then one layer of added files. The layer is gzip by default, the only
//! compression MCV and GKM's extractor read; [`Compression::Zstd`] is there
//! on request, and reading takes gzip, zstd or no compression. vLLM images
//! also carry MCV's `io.kserve.km/*` mount labels
//! ([`labels::kserve_labels`]).
//!
//! - [`build()`]: scan a cache and write a deterministic image to an OCI
//!   layout or a registry.
//! - [`Repo`], [`Image`], [`copy_image`]: read and move images.
//! - [`Store`]: the content-addressed node store, extracting through the
//!   hardened [`ExtractPolicy`], within a byte budget and a free-space
//!   reserve ([`disk`]).
//! - [`extract_to_dir`]: extract a cache tree into a directory.
//! - Multi-target images: an index of single-target variants
//!   annotated with their targets ([`assemble`], [`MultiTarget`]).
//! - [`capture::capture`]: a warmed cache directory, checked against the
//!   extraction rules ([`tree_check`]), built, pushed, signed and verified.
//! - [`delta::capture_delta`]: the upper of a writable view, harvested into
//!   a delta image: the base image's layers plus one layer of new files.
//!   Every reader applies a multi-layer image's layers in order, each later
//!   one only adding files.
//! - `fuzzing` (feature `testing`): the bodies of the fuzz targets, also run
//!   as property tests.

pub mod auth;
pub mod build;
pub mod capture;
mod copy;
pub mod delta;
pub mod disk;
mod error;
mod extract;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod host_reader;
mod image;
mod json;
pub mod labels;
mod layer;
mod layout;
pub mod mirrors;
mod multi;
mod pipeline;
pub mod progress;
pub mod reference;
pub mod repo;
pub mod seal;
pub mod sign;
mod store;
mod tar_guard;
pub mod tree_check;
mod unpack;
pub mod verify;

pub use auth::Credentials;
pub use build::{BuildOptions, Built, build, build_with_progress};
pub use copy::copy_image;
pub use disk::{FreeSpaceReserve, InvalidSize, SpaceExceeded, SpaceLimit, tree_usage};
pub use error::{Error, Result};
pub use extract::{ExtractPolicy, ExtractStats, Mapping, Rejection, Rule};
pub use gkm_core::digest::{Digest, InvalidDigest};
pub use image::{Image, Layer, Manifest, Resolution};
pub use labels::{CacheLabels, Compression};
pub use layer::LayerInfo;
pub use layout::{BlobWriter, Layout};
pub use multi::{MultiTarget, Variant, assemble};
pub use progress::{Progress, Report};
pub use reference::{ImageRef, Selector};
pub use repo::{RegistryOptions, Repo};
pub use store::{Quarantined, Store, Stored};
pub use unpack::{UnpackOptions, extract_to_dir};
