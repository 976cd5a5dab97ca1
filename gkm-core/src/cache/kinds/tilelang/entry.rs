//! The entries of a TileLang cache: a compiled kernel
//! (`<version>/<host>/kernels/<key>/`), an autotuning result
//! (`<version>/<host>/autotuner/<key>/`) or a device binary
//! (`<version>/cuda-binaries/<key>/`), each with the facts its lookup
//! depends on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::cache::{EntryFacts, Target};
use crate::gpu::{Arch, Backend};

/// Which part of a TileLang cache an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// A compiled kernel (`KernelCache`): its sources, library and
    /// parameters, with TileLang's own `manifest.json` of their digests.
    Kernel,
    /// An autotuning result (`AutoTuner`): the best configuration, its
    /// latency, the pickled function and its compiled kernel.
    Tuning,
    /// A device binary (`CUDABinaryCache`): a cubin, fatbin or PTX with
    /// its `metadata.json`.
    Binary,
}

/// One entry of a TileLang cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TileLangEntry {
    /// Its directory below the cache root, `/`-separated.
    pub key: String,
    /// Kernel, tuning or binary.
    pub part: Part,
    /// The TileLang version it was compiled by: its version directory's
    /// name (`0.1.15`; a local version's `+` written `_`, as TileLang
    /// does).
    pub tilelang_version: String,
    /// The host a kernel or tuning was compiled on, as TileLang names its
    /// directory (`linux-x86_64`); none for a binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// How TileLang runs it: the execution backend its library names
    /// (`tvm_ffi`, `cython`, `nvrtc`, `cutedsl`), a binary's format
    /// (`cubin`, `fatbin`, `ptx`).
    pub backend: String,
    /// The CUDA architectures of the device code it holds (the SMs of its
    /// cubins, ascending); empty when it holds none gkm can read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archs: Vec<Arch>,
}

impl TileLangEntry {
    fn order(&self) -> impl Ord + '_ {
        (
            &self.key,
            self.part,
            &self.tilelang_version,
            &self.host,
            &self.backend,
            &self.archs,
        )
    }
}

impl PartialOrd for TileLangEntry {
    fn partial_cmp(&self, other: &TileLangEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By key first: where the entry is filed.
impl Ord for TileLangEntry {
    fn cmp(&self, other: &TileLangEntry) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for TileLangEntry {
    fn key(&self) -> &str {
        &self.key
    }

    /// Its first CUDA architecture (warp size 32): TileLang keys a kernel
    /// on the target it was asked for, one architecture in all but a
    /// fatbin of several.
    fn target(&self) -> Option<Target> {
        self.archs.first().map(|arch| Target {
            backend: Backend::Cuda,
            arch: arch.clone(),
            warp_size: 32,
            ptx_version: None,
            cuda_version: None,
            triton_version: None,
        })
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        vec![("tilelang", self.tilelang_version.clone())]
    }
}
