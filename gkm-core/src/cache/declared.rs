//! What `gkm build` (or a capturing pod) declares about a cache: facts its
//! tree does not state and its kind needs, each option describing one
//! kind's caches ([`Declaration`]). A kind takes the options it reads
//! ([`Kind::declare`](super::Kind::declare)) and refuses the others,
//! naming them.

use serde::{Deserialize, Serialize};

use super::CacheError;
use super::torch_facts::CPU_ISAS;

/// The longest declared version accepted.
const MAX_DECLARED: usize = 64;
/// The longest declared path accepted.
const MAX_DECLARED_PATH: usize = 4096;

/// What the builder of a cache declares about it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Declared {
    /// The torch version that compiled the cache (`torch.__version__`):
    /// Inductor and Mega-Cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_version: Option<String>,
    /// The CPU ISA Inductor picked (one of [`CPU_ISAS`]): Inductor and
    /// Mega-Cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_isa: Option<String>,
    /// The directory of the `deep_gemm` package that compiled the cache
    /// (`os.path.dirname(deep_gemm.__file__)`): DeepGEMM, whose keys name
    /// its `include/` directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepgemm_root: Option<String>,
    /// The `CUDA_HOME` DeepGEMM compiled with, which the keys of kernels
    /// compiled by NVRTC name (default `/usr/local/cuda`): DeepGEMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_home: Option<String>,
}

/// One option of [`Declared`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declaration {
    /// `--torch-version`.
    TorchVersion,
    /// `--cpu-isa`.
    CpuIsa,
    /// `--deepgemm-root`.
    DeepGemmRoot,
    /// `--cuda-home`.
    CudaHome,
}

impl Declaration {
    /// The command-line option that declares it.
    pub fn option(self) -> &'static str {
        match self {
            Declaration::TorchVersion => "--torch-version",
            Declaration::CpuIsa => "--cpu-isa",
            Declaration::DeepGemmRoot => "--deepgemm-root",
            Declaration::CudaHome => "--cuda-home",
        }
    }

    /// The caches it describes, for messages.
    fn describes(self) -> &'static str {
        match self {
            Declaration::TorchVersion | Declaration::CpuIsa => "Inductor and Mega-Cache caches",
            Declaration::DeepGemmRoot | Declaration::CudaHome => "DeepGEMM caches",
        }
    }
}

impl Declared {
    /// The options set, in [`Declaration`]'s order.
    pub fn set(&self) -> Vec<Declaration> {
        [
            (Declaration::TorchVersion, self.torch_version.is_some()),
            (Declaration::CpuIsa, self.cpu_isa.is_some()),
            (Declaration::DeepGemmRoot, self.deepgemm_root.is_some()),
            (Declaration::CudaHome, self.cuda_home.is_some()),
        ]
        .into_iter()
        .filter_map(|(d, set)| set.then_some(d))
        .collect()
    }

    /// Whether nothing is declared.
    pub fn is_empty(&self) -> bool {
        self.set().is_empty()
    }

    /// Refuses the options set that `allowed` leaves out, naming them and
    /// the caches they describe (`kind`: the cache's kind in prose, with
    /// its article), then what is set and not well formed
    /// ([`Declared::validate`]).
    ///
    /// ```
    /// use gkm_core::cache::{Declaration, Declared};
    /// let declared = Declared { cpu_isa: Some("avx2".into()), ..Default::default() };
    /// assert!(declared.refuse_beyond(&[Declaration::CpuIsa], "an Inductor").is_ok());
    /// let err = declared.refuse_beyond(&[], "a Triton").unwrap_err().to_string();
    /// assert!(err.contains("--cpu-isa describes Inductor and Mega-Cache caches, not a Triton cache"), "{err}");
    /// ```
    pub fn refuse_beyond(&self, allowed: &[Declaration], kind: &str) -> Result<(), CacheError> {
        if let Some(other) = self.set().into_iter().find(|d| !allowed.contains(d)) {
            return Err(CacheError::Invalid {
                what: "declared facts",
                reason: format!(
                    "{} describes {}, not {kind} cache",
                    other.option(),
                    other.describes()
                ),
            });
        }
        self.validate()
    }

    /// Refuses a torch version that is not a version string
    /// (`2.11.0`, `2.11.0+cu128`), a CPU ISA Inductor does not name, and a
    /// path that is not absolute.
    ///
    /// ```
    /// use gkm_core::cache::Declared;
    /// let ok = Declared { torch_version: Some("2.11.0+cu128".into()), cpu_isa: Some("avx2".into()), ..Default::default() };
    /// assert!(ok.validate().is_ok());
    /// let bad = Declared { cpu_isa: Some("avx3".into()), ..Default::default() };
    /// assert!(bad.validate().unwrap_err().to_string().contains("avx3"));
    /// let relative = Declared { deepgemm_root: Some("site-packages/deep_gemm".into()), ..Default::default() };
    /// assert!(relative.validate().unwrap_err().to_string().contains("not an absolute path"));
    /// ```
    pub fn validate(&self) -> Result<(), CacheError> {
        if let Some(version) = &self.torch_version {
            let well_formed = !version.is_empty()
                && version.len() <= MAX_DECLARED
                && version.starts_with(|c: char| c.is_ascii_digit())
                && version
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'));
            if !well_formed {
                return Err(CacheError::Invalid {
                    what: "declared torch version",
                    reason: format!("{version:?} is not a version such as 2.11.0 or 2.11.0+cu128"),
                });
            }
        }
        if let Some(isa) = &self.cpu_isa
            && !CPU_ISAS.contains(&isa.as_str())
        {
            return Err(CacheError::Invalid {
                what: "declared CPU ISA",
                reason: format!(
                    "{isa:?} is not an ISA Inductor picks; expected one of {}",
                    CPU_ISAS.join(", ")
                ),
            });
        }
        for (what, path) in [
            ("declared deep_gemm directory", &self.deepgemm_root),
            ("declared CUDA_HOME", &self.cuda_home),
        ] {
            if let Some(path) = path {
                let well_formed = path.starts_with('/')
                    && path.len() <= MAX_DECLARED_PATH
                    && !path.chars().any(char::is_control);
                if !well_formed {
                    return Err(CacheError::Invalid {
                        what,
                        reason: format!("{path:?} is not an absolute path"),
                    });
                }
            }
        }
        Ok(())
    }
}
