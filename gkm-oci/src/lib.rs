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
//! - [`erofs`]: a layer's EROFS twin, which a node can mount instead of
//!   extracting the tree ([`BuildOptions::erofs`]), named in the tar
//!   layer's descriptor; and the superblock check a blob passes before a
//!   node would mount it ([`erofs::superblock::check`]).
//! - `fuzzing` (feature `testing`): the bodies of the fuzz targets, also run
//!   as property tests.

pub mod capture;
mod error;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod image;
mod json;
pub mod progress;
mod registry;
pub mod sign;
mod store;
pub mod verify;

pub use capture::delta;
pub use image::{build, erofs, labels};
pub use registry::{auth, mirrors, reference, repo};
pub use store::{disk, seal, tree_check};

pub use error::{Error, Result};
pub use gkm_core::digest::{Digest, InvalidDigest};
pub use image::assemble::assemble;
pub use image::build::{BuildOptions, Built, build, build_with_progress};
pub use image::copy::copy_image;
pub use image::labels::{CacheLabels, Compression};
pub use image::layer::LayerInfo;
pub use image::manifest::{Layer, Manifest};
pub use image::multi::{MultiTarget, Variant};
pub use image::{Image, Resolution};
pub use progress::{Progress, Report};
pub use registry::auth::Credentials;
pub use registry::layout::{BlobWriter, Layout};
pub use registry::reference::{ImageRef, Selector};
pub use registry::repo::{RegistryOptions, Repo};
pub use store::disk::{
    FreeSpaceReserve, InvalidReserve, InvalidSize, SpaceExceeded, SpaceLimit, tree_usage,
};
pub use store::extract::{ExtractPolicy, ExtractStats, Mapping};
pub use store::rejection::{Rejection, Rule};
pub use store::unpack::{UnpackOptions, extract_to_dir};
pub use store::{Quarantined, Store, Stored};
