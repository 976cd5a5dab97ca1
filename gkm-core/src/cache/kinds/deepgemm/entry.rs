//! The entries of a DeepGEMM cache: one compiled kernel each
//! (`cache/kernel.<name>.<digest>/`), with the facts its key depends on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::cache::{EntryFacts, Target};
use crate::gpu::{Arch, Backend};

/// One kernel of a DeepGEMM cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeepGemmEntry {
    /// Its directory below the cache root: `cache/kernel.<name>.<digest>`.
    pub key: String,
    /// The kernel's name (`sm90_fp8_gemm_1d2d`).
    pub name: String,
    /// The 32 hex digits of its key.
    pub digest: String,
    /// The CUDA architecture it was compiled for: the SM its cubin names,
    /// with the suffix its key was found with (`90a`, `100f`); before the
    /// key is checked, DeepGEMM's suffix for that SM (`a`).
    pub arch: Arch,
    /// The compiler its key names (`NVCC12.9`, `NVRTC13.0`), once checked
    /// against the declared install ([`super::key::binding`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiler: Option<String>,
    /// The `deep_gemm` package directory its key names, once checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepgemm_root: Option<String>,
}

impl DeepGemmEntry {
    /// The CUDA version of its compiler (`12.9`), once checked.
    pub fn cuda_version(&self) -> Option<&str> {
        let compiler = self.compiler.as_deref()?;
        compiler
            .strip_prefix("NVCC")
            .or_else(|| compiler.strip_prefix("NVRTC"))
    }

    fn order(&self) -> impl Ord + '_ {
        (
            &self.key,
            &self.name,
            &self.digest,
            &self.arch,
            &self.compiler,
            &self.deepgemm_root,
        )
    }
}

impl PartialOrd for DeepGemmEntry {
    fn partial_cmp(&self, other: &DeepGemmEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By key first: where the entry is filed.
impl Ord for DeepGemmEntry {
    fn cmp(&self, other: &DeepGemmEntry) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for DeepGemmEntry {
    fn key(&self) -> &str {
        &self.key
    }

    /// Its CUDA architecture (warp size 32) and compiler version.
    fn target(&self) -> Option<Target> {
        Some(Target {
            backend: Backend::Cuda,
            arch: self.arch.clone(),
            warp_size: 32,
            ptx_version: None,
            cuda_version: self.cuda_version().map(str::to_string),
            triton_version: None,
        })
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        self.cuda_version()
            .map(|v| ("cuda", v.to_string()))
            .into_iter()
            .collect()
    }
}
