//! Whether a cache fits a node's GPUs, with a reason for every mismatch.
//!
//! Everything here is pure: the same summary, GPUs and options always give
//! the same [`Report`], with no I/O.
//!
//! # Rules
//!
//! A cache holds kernels for one or more [`Target`]s. A **GPU is compatible
//! when at least one target matches it**; a target matches when none of
//! these fails:
//!
//! - **backend**: the target's backend is the GPU's (`cuda`, `hip`…).
//! - **architecture** (when the backends agree): see [`CudaArchRule`] for
//!   CUDA; gfx targets must be equal (`gfx90a` ≠ `gfx942`; ROCm's generic
//!   targets such as `gfx9-generic` are not expanded).
//! - **warp size**: equal. A CUDA GPU whose warp size is not reported counts
//!   as 32, the only warp size NVIDIA has; for other GPUs an unknown warp
//!   size makes the GPU incompatible ([`Reason::GpuWithoutWarpSize`]).
//! - **driver** (CUDA targets, on GPUs whose driver's CUDA version,
//!   [`Gpu::toolkit_version`], is known): the driver loads the target's
//!   cubins. By CUDA's minor version compatibility a driver runs cubins
//!   built by any toolkit of its own major version, so only a toolkit of a
//!   newer major version is refused: the one the target records
//!   ([`Reason::CudaNewerThanDriver`]) and the one its PTX ISA
//!   implies ([`Reason::PtxNewerThanDriver`]; PTX ISA 9.x is CUDA 13). A
//!   Triton 3.6 cache (PTX ISA 8.7) fits a CUDA 12.4 driver. The rule, its
//!   source and why PTX JIT never comes into it are in one place, the
//!   `driver` module.
//! - **Triton version** (targets that record one, when the caller gives
//!   [`CheckOptions::triton_version`]): equal. Triton's cache key hashes its
//!   own version, so a kernel compiled by another Triton is never found.
//!
//! PyTorch caches whose kernels are all C++ (no GPU target) are judged by
//! the CPU instead: see [`cpu_mismatch`].
//!
//! A GPU without a backend (bound to `vfio-pci`, say) or without a known
//! architecture is incompatible with a reason of its own and no per-target
//! detail. An incompatible GPU lists, per target, every reason it failed;
//! a compatible one lists the targets that matched. A check against no GPUs,
//! or of a cache without targets, is incompatible with a reason in
//! [`Report::reasons`].

mod cpu;
mod driver;
mod ptx;
mod requirement;
mod target_json;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cache::{CacheManifest, Summary, Target};
use crate::gpu::{Arch, Backend, Gpu};

pub use cpu::{
    cpu_fit_mismatch, cpu_isa_from_cpuinfo, cpu_isa_from_flags, cpu_mismatch, host_cpu_isa,
};
pub use ptx::max_ptx_version;
use ptx::ptx_display;
pub use requirement::{ArchRequirement, Requirement, VersionRange, requirement};

/// NVIDIA's warp size, the same on every architecture.
const CUDA_WARP_SIZE: u32 = 32;

/// How a CUDA target's architecture must relate to the GPU's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CudaArchRule {
    /// The compute capability must be equal (`75` fits only 7.5; `90a` and
    /// `90` both fit 9.0). This is
    /// what a Triton cache needs: Triton files a kernel under a key that
    /// includes the GPU's compute capability, so on an sm_86 GPU it never
    /// looks up the kernels it compiled for sm_80, even though they could
    /// run there.
    #[default]
    Exact,
    /// NVIDIA's binary compatibility: a cubin for `XY` runs on compute
    /// capability X.Z with Z ≥ Y (an sm_80 cubin runs on 8.6, not on 7.5 or
    /// 9.0); family-specific `XYf` the same; arch-specific `XYa` (`90a`)
    /// only on exactly X.Y. For caches whose loader does not key on the
    /// exact architecture.
    BinaryCompatible,
}

/// What a check is told besides the cache and the GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckOptions {
    /// The Triton version the workload runs; checked against targets that
    /// record the version that compiled them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triton_version: Option<String>,
    /// How CUDA architectures match.
    #[serde(default)]
    pub cuda_arch_rule: CudaArchRule,
}

/// The options a node checks whether its GPUs fit a cache with: the agent
/// when it decides what its node holds and delivers, the operator when it
/// renders the DeviceClass selector of a cache ([`requirement`]), so that
/// both decide alike. No Triton version (a node does not know which
/// Triton its workloads run) and the exact CUDA architecture
/// ([`CudaArchRule::Exact`], what a Triton cache needs).
pub const NODE_CHECK: CheckOptions = CheckOptions {
    triton_version: None,
    cuda_arch_rule: CudaArchRule::Exact,
};

/// Why a cache does not fit a GPU (or a node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "reason",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Reason {
    /// There are no GPUs to check against.
    NoGpus,
    /// The cache records no compiled kernel, so no target.
    NoTargets,
    /// The GPU has no compiler backend (for example it is bound to
    /// `vfio-pci`).
    GpuWithoutBackend,
    /// The GPU's architecture is unknown.
    GpuWithoutArch,
    /// The GPU's warp size is unknown (and it is not an NVIDIA GPU).
    GpuWithoutWarpSize,
    /// The target's backend is not the GPU's.
    BackendMismatch {
        /// The target's.
        cache: Backend,
        /// The GPU's.
        gpu: Backend,
    },
    /// The target's architecture does not run on the GPU's.
    ArchMismatch {
        /// The target's.
        cache: Arch,
        /// The GPU's.
        gpu: Arch,
        /// The rule that was applied.
        rule: CudaArchRule,
    },
    /// The warp sizes differ.
    WarpSizeMismatch {
        /// The target's.
        cache: u32,
        /// The GPU's.
        gpu: u32,
    },
    /// The kernels' PTX ISA comes from a toolkit of a newer CUDA major
    /// version than the GPU's driver supports (PTX ISA 9.0 on a CUDA 12.8
    /// driver): the driver cannot load its cubins.
    PtxNewerThanDriver {
        /// The target's PTX ISA version (84 for 8.4).
        ptx_version: u32,
        /// The newest the driver supports.
        max_ptx_version: u32,
        /// The CUDA version the driver supports.
        driver_cuda_version: String,
    },
    /// The kernels were built with a CUDA toolkit of a newer major version
    /// than the GPU's driver supports (CUDA's minor version compatibility
    /// stops at the major version).
    CudaNewerThanDriver {
        /// The toolkit version the cache records.
        cuda_version: String,
        /// The CUDA version the driver supports.
        driver_cuda_version: String,
    },
    /// The kernels were compiled by another Triton than the workload runs.
    TritonVersionMismatch {
        /// The version that compiled the kernels.
        cache: String,
        /// The version the workload runs.
        expected: String,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoGpus => f.write_str("there are no GPUs to run it on"),
            Reason::NoTargets => f.write_str("the cache holds no compiled kernel"),
            Reason::GpuWithoutBackend => {
                f.write_str("the GPU has no compiler backend (it may be bound to vfio-pci)")
            }
            Reason::GpuWithoutArch => f.write_str("the GPU's architecture is unknown"),
            Reason::GpuWithoutWarpSize => f.write_str("the GPU's warp size is unknown"),
            Reason::BackendMismatch { cache, gpu } => {
                write!(
                    f,
                    "backend mismatch: the cache targets {cache}, the GPU is {gpu}"
                )
            }
            Reason::ArchMismatch { cache, gpu, rule } => {
                let name = |a: &Arch| a.sm_name().unwrap_or_else(|| a.to_string());
                let how = match rule {
                    CudaArchRule::Exact if cache.is_cuda() => {
                        " (Triton only reuses kernels compiled for the exact compute capability)"
                    }
                    CudaArchRule::BinaryCompatible if cache.is_cuda() => " (not binary compatible)",
                    _ => "",
                };
                write!(
                    f,
                    "architecture mismatch: the cache targets {}, the GPU is {}{how}",
                    name(cache),
                    name(gpu)
                )
            }
            Reason::WarpSizeMismatch { cache, gpu } => {
                write!(
                    f,
                    "warp size mismatch: the cache targets {cache}, the GPU has {gpu}"
                )
            }
            Reason::PtxNewerThanDriver {
                ptx_version,
                max_ptx_version,
                driver_cuda_version,
            } => write!(
                f,
                "PTX ISA {} comes from a newer CUDA major version than the driver's \
                 (CUDA {driver_cuda_version}: up to PTX ISA {}); minor version \
                 compatibility stops at the major version",
                ptx_display(*ptx_version),
                ptx_display(*max_ptx_version)
            ),
            Reason::CudaNewerThanDriver {
                cuda_version,
                driver_cuda_version,
            } => write!(
                f,
                "the kernels were built with CUDA {cuda_version}, newer than the driver's CUDA {driver_cuda_version}"
            ),
            Reason::TritonVersionMismatch { cache, expected } => write!(
                f,
                "Triton version mismatch: the kernels were compiled by Triton {cache}, the workload runs {expected}"
            ),
        }
    }
}

/// One target a GPU did not match, and every reason why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetMismatch {
    /// The cache's target.
    #[serde(with = "target_json::one")]
    pub target: Target,
    /// Never empty.
    pub reasons: Vec<Reason>,
}

/// The verdict for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuReport {
    /// The GPU's index on its node.
    pub index: u32,
    /// `0 Tesla T4 (cuda/75/32)`.
    pub description: String,
    /// The GPU's UUID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Whether some target matches.
    pub compatible: bool,
    /// The targets that match.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "target_json::many"
    )]
    pub matching_targets: Vec<Target>,
    /// Reasons about the GPU itself (no backend, unknown architecture).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Reason>,
    /// For an incompatible GPU, why each target did not match.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mismatches: Vec<TargetMismatch>,
}

impl GpuReport {
    /// Every reason, the GPU's own and each target's.
    pub fn all_reasons(&self) -> impl Iterator<Item = &Reason> {
        self.reasons
            .iter()
            .chain(self.mismatches.iter().flat_map(|m| &m.reasons))
    }
}

/// The verdict for a cache on a set of GPUs (a node).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Whether at least one GPU is compatible.
    pub compatible: bool,
    /// Reasons about the check as a whole: no GPUs, no targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Reason>,
    /// One per GPU, in the order given.
    pub gpus: Vec<GpuReport>,
}

impl Report {
    /// The GPUs the cache fits.
    pub fn compatible_gpus(&self) -> impl Iterator<Item = &GpuReport> {
        self.gpus.iter().filter(|g| g.compatible)
    }

    /// The GPUs the cache does not fit.
    pub fn incompatible_gpus(&self) -> impl Iterator<Item = &GpuReport> {
        self.gpus.iter().filter(|g| !g.compatible)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for reason in &self.reasons {
            writeln!(f, "incompatible: {reason}")?;
        }
        for gpu in &self.gpus {
            if gpu.compatible {
                let targets: Vec<String> =
                    gpu.matching_targets.iter().map(Target::to_string).collect();
                writeln!(
                    f,
                    "GPU {}: compatible ({})",
                    gpu.description,
                    targets.join(", ")
                )?;
                continue;
            }
            writeln!(f, "GPU {}: incompatible", gpu.description)?;
            for reason in &gpu.reasons {
                writeln!(f, "  {reason}")?;
            }
            for mismatch in &gpu.mismatches {
                for reason in &mismatch.reasons {
                    writeln!(f, "  {}: {reason}", mismatch.target)?;
                }
            }
        }
        Ok(())
    }
}

/// Check a cache's summary against a node's GPUs.
///
/// ```
/// use gkm_core::cache::Summary;
/// use gkm_core::compat::{CheckOptions, Reason, check_summary};
/// use gkm_core::{Backend, Gpu, Vendor};
///
/// let summary = Summary::from_label(
///     r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32,"ptx_version":84}]}"#,
/// ).unwrap();
/// let t4 = Gpu {
///     vendor: Vendor::Nvidia,
///     product: "Tesla T4".into(),
///     backend: Some(Backend::Cuda),
///     arch: Some("sm_75".parse().unwrap()),
///     warp_size: Some(32),
///     toolkit_version: Some("12.4".into()),
///     ..Default::default()
/// };
/// let a100 = Gpu { index: 1, product: "A100".into(), arch: Some("80".parse().unwrap()), ..t4.clone() };
/// // CUDA's minor version compatibility: a 12.2 driver runs 12.4's cubins…
/// let older_minor = Gpu { index: 2, toolkit_version: Some("12.2".into()), ..t4.clone() };
/// // …an 11.8 driver does not.
/// let older_major = Gpu { index: 3, toolkit_version: Some("11.8".into()), ..t4.clone() };
///
/// let report = check_summary(&summary, &[t4, a100, older_minor, older_major], &CheckOptions::default());
/// assert!(report.compatible);
/// assert!(report.gpus[0].compatible);
/// assert!(matches!(report.gpus[1].mismatches[0].reasons[..], [Reason::ArchMismatch { .. }]));
/// assert!(report.gpus[2].compatible);
/// assert_eq!(
///     report.gpus[3].mismatches[0].reasons[0].to_string(),
///     "PTX ISA 8.4 comes from a newer CUDA major version than the driver's \
///      (CUDA 11.8: up to PTX ISA 7.8); minor version compatibility stops at the major version"
/// );
/// ```
pub fn check_summary(summary: &Summary, gpus: &[Gpu], options: &CheckOptions) -> Report {
    let mut reasons = Vec::new();
    if gpus.is_empty() {
        reasons.push(Reason::NoGpus);
    }
    if summary.targets.is_empty() {
        reasons.push(Reason::NoTargets);
    }
    let gpus: Vec<GpuReport> = gpus
        .iter()
        .map(|gpu| check_gpu(&summary.targets, gpu, options))
        .collect();
    Report {
        compatible: gpus.iter().any(|g| g.compatible),
        reasons,
        gpus,
    }
}

/// Check a cache's manifest against a node's GPUs: the same as checking its
/// [summary](CacheManifest::summary).
pub fn check_manifest(manifest: &CacheManifest, gpus: &[Gpu], options: &CheckOptions) -> Report {
    check_summary(&manifest.summary(), gpus, options)
}

/// Every reason one target does not match one GPU; empty when it matches.
/// The GPU's own shortcomings (no backend, unknown architecture or warp
/// size) are reasons here too.
pub fn check_target(target: &Target, gpu: &Gpu, options: &CheckOptions) -> Vec<Reason> {
    let mut reasons = gpu_reasons(gpu);
    let Some(backend) = gpu.backend else {
        return reasons;
    };
    if target.backend != backend {
        reasons.push(Reason::BackendMismatch {
            cache: target.backend,
            gpu: backend,
        });
    } else if let Some(arch) = &gpu.arch
        && !arch_runs(&target.arch, arch, options.cuda_arch_rule)
    {
        reasons.push(Reason::ArchMismatch {
            cache: target.arch.clone(),
            gpu: arch.clone(),
            rule: options.cuda_arch_rule,
        });
    }
    if let Some(warp) = gpu_warp_size(gpu)
        && warp != target.warp_size
    {
        reasons.push(Reason::WarpSizeMismatch {
            cache: target.warp_size,
            gpu: warp,
        });
    }
    if target.backend == Backend::Cuda
        && backend == Backend::Cuda
        && let Some(driver) = &gpu.toolkit_version
    {
        reasons.extend(driver::driver_reasons(target, driver));
    }
    if let (Some(cache), Some(expected)) = (&target.triton_version, &options.triton_version)
        && cache.trim() != expected.trim()
    {
        reasons.push(Reason::TritonVersionMismatch {
            cache: cache.clone(),
            expected: expected.clone(),
        });
    }
    reasons
}

/// The verdict for one GPU.
fn check_gpu(targets: &[Target], gpu: &Gpu, options: &CheckOptions) -> GpuReport {
    let mut report = GpuReport {
        index: gpu.index,
        description: gpu.describe(),
        uuid: gpu.uuid.clone(),
        compatible: false,
        matching_targets: Vec::new(),
        reasons: gpu_reasons(gpu),
        mismatches: Vec::new(),
    };
    if !report.reasons.is_empty() {
        return report;
    }
    for target in targets {
        let reasons = check_target(target, gpu, options);
        if reasons.is_empty() {
            report.matching_targets.push(target.clone());
        } else {
            report.mismatches.push(TargetMismatch {
                target: target.clone(),
                reasons,
            });
        }
    }
    report.compatible = !report.matching_targets.is_empty();
    if report.compatible {
        report.mismatches.clear();
    }
    report
}

/// What the GPU itself lacks for any target to be checked against it.
fn gpu_reasons(gpu: &Gpu) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if gpu.backend.is_none() {
        reasons.push(Reason::GpuWithoutBackend);
        return reasons;
    }
    if gpu.arch.is_none() {
        reasons.push(Reason::GpuWithoutArch);
    }
    if gpu_warp_size(gpu).is_none() {
        reasons.push(Reason::GpuWithoutWarpSize);
    }
    reasons
}

/// The GPU's warp size, 32 for a CUDA GPU that does not report it.
fn gpu_warp_size(gpu: &Gpu) -> Option<u32> {
    gpu.warp_size
        .or((gpu.backend == Some(Backend::Cuda)).then_some(CUDA_WARP_SIZE))
}

/// Whether code compiled for `cache` runs on (and is used by) a GPU of
/// architecture `gpu`.
fn arch_runs(cache: &Arch, gpu: &Arch, rule: CudaArchRule) -> bool {
    let (Some((cache_major, cache_minor)), Some(gpu_cc)) =
        (cache.compute_capability(), gpu.compute_capability())
    else {
        return cache == gpu;
    };
    let arch_specific = cache.as_str().ends_with('a');
    match rule {
        CudaArchRule::Exact => (cache_major, cache_minor) == gpu_cc,
        CudaArchRule::BinaryCompatible if arch_specific => (cache_major, cache_minor) == gpu_cc,
        CudaArchRule::BinaryCompatible => cache_major == gpu_cc.0 && cache_minor <= gpu_cc.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arch(s: &str) -> Arch {
        s.parse().unwrap()
    }

    #[test]
    fn cuda_arch_rules() {
        use CudaArchRule::*;
        let cases = [
            ("75", "75", true, true),
            ("80", "86", false, true),
            ("86", "80", false, false),
            ("80", "90", false, false),
            ("90a", "90", true, true),
            ("90a", "100", false, false),
            ("100f", "103", false, true),
            ("100a", "103", false, false),
            ("gfx90a", "gfx90a", true, true),
            ("gfx90a", "gfx942", false, false),
            ("75", "gfx90a", false, false),
        ];
        for (cache, gpu, exact, binary) in cases {
            assert_eq!(
                arch_runs(&arch(cache), &arch(gpu), Exact),
                exact,
                "{cache} on {gpu}, exact"
            );
            assert_eq!(
                arch_runs(&arch(cache), &arch(gpu), BinaryCompatible),
                binary,
                "{cache} on {gpu}"
            );
        }
    }
}
