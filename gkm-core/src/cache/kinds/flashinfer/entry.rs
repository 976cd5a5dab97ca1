//! The entries of a FlashInfer cache: a JIT-built module
//! (`cached_ops/<name>/`) or one tuned operation of the autotune store
//! (`autotune/v2/<environment>/entries/<operation>.json`), each with the
//! facts its lookup depends on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::cache::{EntryFacts, Target};
use crate::gpu::{Arch, Backend};

/// Which part of a FlashInfer cache an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// A JIT-built module: `<version>/<archs>/cached_ops/<name>/<name>.so`.
    Module,
    /// A tuned operation's winner: `autotune/v2/<env>/entries/<op>.json`.
    Tuning,
}

/// One entry of a FlashInfer cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlashInferEntry {
    /// Its directory or file below the cache root, `/`-separated.
    pub key: String,
    /// Module or tuning.
    pub part: Part,
    /// The module's name (`batch_decode_with_kv_cache_dtype_q_f16_…`), or
    /// the tuned operation's key as FlashInfer records it.
    pub name: String,
    /// The FlashInfer version it was built or tuned by: the workspace
    /// directory's name (modules), the store's `flashinfer_version`
    /// (tunings).
    pub flashinfer_version: String,
    /// The CUDA architecture a module was compiled for (its workspace
    /// directory's name: `90a`, `120f`); none for a tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<Arch>,
    /// The CUDA version: the major version of the CUDA runtime a module
    /// links (`libcudart.so.12`: `12`), the store's `cuda_version` for a
    /// tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// The GPU a tuning was measured on (the store's `gpu`, a device name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
}

impl FlashInferEntry {
    fn order(&self) -> impl Ord + '_ {
        (
            &self.key,
            self.part,
            &self.name,
            &self.flashinfer_version,
            &self.arch,
            &self.cuda_version,
            &self.gpu,
        )
    }
}

impl PartialOrd for FlashInferEntry {
    fn partial_cmp(&self, other: &FlashInferEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By key first: where the entry is filed.
impl Ord for FlashInferEntry {
    fn cmp(&self, other: &FlashInferEntry) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for FlashInferEntry {
    fn key(&self) -> &str {
        &self.key
    }

    /// A module's CUDA architecture (warp size 32); none for a tuning,
    /// which records a device name, not an architecture.
    fn target(&self) -> Option<Target> {
        Some(Target {
            backend: Backend::Cuda,
            arch: self.arch.clone()?,
            warp_size: 32,
            ptx_version: None,
            cuda_version: self.cuda_version.clone(),
            triton_version: None,
        })
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        let mut versions = vec![("flashinfer", self.flashinfer_version.clone())];
        versions.extend(self.cuda_version.iter().map(|v| ("cuda", v.clone())));
        versions
    }
}
