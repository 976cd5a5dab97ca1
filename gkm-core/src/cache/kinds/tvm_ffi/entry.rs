//! The entries of a TVM-FFI cache: one module `tvm_ffi.cpp` built in its
//! `<name>_<hash>/` directory, with the facts finding it again depends on.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::cache::{EntryFacts, Target};
use crate::gpu::{Arch, Backend};

/// What a module's sources were compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModuleBackend {
    /// C or C++ only: host code, built with the host's compiler.
    Cpu,
    /// CUDA sources, built with `$CUDA_HOME/bin/nvcc`.
    Cuda,
    /// HIP sources, built with `$ROCM_HOME/bin/hipcc`.
    Hip,
}

impl ModuleBackend {
    /// Its name: `cpu`, `cuda`, `hip`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleBackend::Cpu => "cpu",
            ModuleBackend::Cuda => "cuda",
            ModuleBackend::Hip => "hip",
        }
    }
}

/// One module of a TVM-FFI cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TvmFfiEntry {
    /// Its directory below the cache root: `<name>_<hash>`.
    pub key: String,
    /// The module's name (`build_inline(name=…)`).
    pub name: String,
    /// What its sources were compiled for.
    pub backend: ModuleBackend,
    /// The GPU architectures its device code was compiled for, in the order
    /// its `build.ninja` names them (`-gencode=…,code=sm_90a`,
    /// `--offload-arch=gfx90a`); empty for a C++ module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub archs: Vec<Arch>,
    /// The major version of the CUDA runtime a CUDA module links
    /// (`libcudart.so.13`: `13`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// The `tvm_ffi` install its `build.ninja` compiles against (the
    /// directory holding `include/`): the same install, at the same path,
    /// finds the module built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<String>,
    /// The sources it was built from outside its directory (`tvm_ffi.cpp.build`
    /// of a project's files): ninja finds the module built only while they
    /// are at these paths and no newer than it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
}

impl TvmFfiEntry {
    fn order(&self) -> impl Ord + '_ {
        (
            &self.key,
            &self.name,
            self.backend,
            &self.archs,
            &self.cuda_version,
            &self.install,
            &self.sources,
        )
    }
}

impl PartialOrd for TvmFfiEntry {
    fn partial_cmp(&self, other: &TvmFfiEntry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By key first: where the entry is filed.
impl Ord for TvmFfiEntry {
    fn cmp(&self, other: &TvmFfiEntry) -> Ordering {
        self.order().cmp(&other.order())
    }
}

impl EntryFacts for TvmFfiEntry {
    fn key(&self) -> &str {
        &self.key
    }

    /// A GPU module's first architecture (TVM-FFI builds a module for the
    /// architectures of `TVM_FFI_CUDA_ARCH_LIST`, or else of the first GPU
    /// it finds, and finds it built only for the same ones); none for a
    /// C++ module.
    fn target(&self) -> Option<Target> {
        let (backend, warp_size) = match self.backend {
            ModuleBackend::Cpu => return None,
            ModuleBackend::Cuda => (Backend::Cuda, 32),
            ModuleBackend::Hip => (Backend::Hip, 64),
        };
        Some(Target {
            backend,
            arch: self.archs.first()?.clone(),
            warp_size,
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
