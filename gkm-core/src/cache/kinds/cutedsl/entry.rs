//! The entries of a CuTe DSL cache: one compiled function
//! (`cute_dsl_<hash>.mlir`), with the facts finding it again depends on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::cache::{EntryFacts, Target};
use crate::gpu::{Arch, Backend};

/// One compiled function of a CuTe DSL cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CuteDslEntry {
    /// Its file below the cache root: `cute_dsl_<64 hex digits>.mlir`.
    pub key: String,
    /// The CUDA architecture its kernels were compiled for (the `-arch` the
    /// file records, `CUTE_DSL_ARCH`: `90a`).
    pub arch: Arch,
    /// The CUDA toolkit it was compiled with, as the file records it
    /// (`Cuda compilation tools, release 13.4`: `13.4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
}

impl CuteDslEntry {
    fn order(&self) -> impl Ord + '_ {
        (&self.key, &self.arch, &self.cuda_version)
    }
}

impl PartialOrd for CuteDslEntry {
    fn partial_cmp(&self, other: &CuteDslEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By key first: where the entry is filed.
impl Ord for CuteDslEntry {
    fn cmp(&self, other: &CuteDslEntry) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for CuteDslEntry {
    fn key(&self) -> &str {
        &self.key
    }

    /// Its architecture (warp size 32).
    fn target(&self) -> Option<Target> {
        Some(Target {
            backend: Backend::Cuda,
            arch: self.arch.clone(),
            warp_size: 32,
            ptx_version: None,
            cuda_version: self.cuda_version.clone(),
            triton_version: None,
        })
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        self.cuda_version
            .iter()
            .map(|v| ("cuda", v.clone()))
            .collect()
    }
}
