//! What a GPU must be for one target to fit it, as data: the rule of
//! [`check_target`](super::check_target) taken apart into the properties a
//! GPU publishes (backend, architecture, warp size, the driver's CUDA
//! version), so that another evaluator (a DRA device selector in CEL, say)
//! can apply the same rule without a copy of it.
//!
//! [`Requirement::admits`] applies it to a [`Gpu`]; the tests here hold it
//! to [`check_target`](super::check_target) on a table of GPUs and targets.

use super::driver::OLDEST_KNOWN_PTX;
use super::ptx::{checked_drivers, cuda_major_of_ptx, parse_version};
use super::{CUDA_WARP_SIZE, CheckOptions, CudaArchRule};
use crate::cache::Target;
use crate::gpu::{Backend, Gpu};

/// What a GPU must be for one target to fit it: [`check_target`]'s rule
/// as the properties a GPU publishes, so that another evaluator (a DRA
/// device selector in CEL) applies the same rule without a copy of it.
/// [`Requirement::admits`] gives [`check_target`]'s answer.
///
/// [`check_target`]: super::check_target
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The GPU's backend.
    pub backend: Backend,
    /// The GPU's architecture.
    pub arch: ArchRequirement,
    /// The GPU's warp size.
    pub warp_size: u32,
    /// Whether a GPU of this backend that reports no warp size fits (a CUDA
    /// GPU counts as 32, the only warp size NVIDIA has; any other such GPU
    /// does not fit).
    pub unreported_warp_size_fits: bool,
    /// CUDA versions (the GPU's driver's, [`Gpu::toolkit_version`]) that do
    /// not load the target's kernels; a GPU whose driver's version is not
    /// known is not refused for it.
    pub refused_drivers: Vec<VersionRange>,
}

/// What a GPU's architecture must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArchRequirement {
    /// A CUDA GPU of compute capability `major.minor` or, when
    /// `newer_minor` is set, `major.Z` with Z ≥ `minor`.
    ComputeCapability {
        /// The major version.
        major: u32,
        /// The (lowest) minor version.
        minor: u32,
        /// Whether newer minor versions of the same major fit too.
        newer_minor: bool,
    },
    /// A GPU whose architecture is exactly this one (a gfx target, in
    /// canonical form: `gfx90a`).
    Named(String),
}

/// The versions `major.minor` with `from` ≤ (major, minor) < `below`
/// (patch versions ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRange {
    /// The first version in the range.
    pub from: (u32, u32),
    /// The first version past the range.
    pub below: (u32, u32),
}

impl VersionRange {
    fn contains(&self, version: (u32, u32)) -> bool {
        self.from <= version && version < self.below
    }
}

/// What a GPU must be for `target` to fit it under `options`; `None` when
/// no GPU fits it (a target compiled by another Triton than the workload
/// runs).
pub fn requirement(target: &Target, options: &CheckOptions) -> Option<Requirement> {
    if let (Some(cache), Some(expected)) = (&target.triton_version, &options.triton_version)
        && cache.trim() != expected.trim()
    {
        return None;
    }
    let arch = match target.arch.compute_capability() {
        Some((major, minor)) => ArchRequirement::ComputeCapability {
            major,
            minor,
            newer_minor: options.cuda_arch_rule == CudaArchRule::BinaryCompatible
                && !target.arch.as_str().ends_with('a'),
        },
        None => ArchRequirement::Named(target.arch.as_str().to_string()),
    };
    let refused_drivers = if target.backend == Backend::Cuda {
        refused_drivers(target)
    } else {
        Vec::new()
    };
    Some(Requirement {
        backend: target.backend,
        arch,
        warp_size: target.warp_size,
        unreported_warp_size_fits: target.backend == Backend::Cuda
            && target.warp_size == CUDA_WARP_SIZE,
        refused_drivers,
    })
}

/// The drivers' CUDA versions that refuse a CUDA target's kernels: the
/// ranges of the `driver` module's rule (a PTX ISA or toolkit of a newer
/// major version than the driver's).
fn refused_drivers(target: &Target) -> Vec<VersionRange> {
    let mut ranges = Vec::new();
    if let Some(ptx) = target.ptx_version
        && ptx >= OLDEST_KNOWN_PTX
    {
        let (from, below) = checked_drivers();
        let below = match cuda_major_of_ptx(ptx) {
            Some(built) => below.min((built, 0)),
            None => below,
        };
        if from < below {
            ranges.push(VersionRange { from, below });
        }
    }
    if let Some((built, _)) = target.cuda_version.as_deref().and_then(parse_version)
        && built > 0
    {
        ranges.push(VersionRange {
            from: (0, 0),
            below: (built, 0),
        });
    }
    ranges
}

impl Requirement {
    /// Whether `gpu` meets it: the same answer as
    /// [`check_target`](super::check_target) giving no reason.
    pub fn admits(&self, gpu: &Gpu) -> bool {
        if gpu.backend != Some(self.backend) {
            return false;
        }
        let Some(arch) = &gpu.arch else {
            return false;
        };
        let arch_fits = match &self.arch {
            ArchRequirement::ComputeCapability {
                major,
                minor,
                newer_minor,
            } => arch
                .compute_capability()
                .is_some_and(|(m, n)| m == *major && (n == *minor || (*newer_minor && n > *minor))),
            ArchRequirement::Named(name) => arch.as_str() == name,
        };
        let warp_fits = match gpu.warp_size {
            Some(warp) => warp == self.warp_size,
            None => self.unreported_warp_size_fits,
        };
        let driver_fits = gpu
            .toolkit_version
            .as_deref()
            .and_then(parse_version)
            .is_none_or(|driver| !self.refused_drivers.iter().any(|r| r.contains(driver)));
        arch_fits && warp_fits && driver_fits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compat::check_target;
    use crate::gpu::Vendor;

    fn target(spec: &str) -> Target {
        // backend/arch/warp[/ptx[/cuda[/triton]]]
        let parts: Vec<&str> = spec.split('/').collect();
        let some = |i: usize| {
            parts
                .get(i)
                .filter(|s| !s.is_empty())
                .map(|s| s.to_string())
        };
        Target {
            backend: parts[0].parse().unwrap(),
            arch: parts[1].parse().unwrap(),
            warp_size: parts[2].parse().unwrap(),
            ptx_version: some(3).map(|p| p.parse().unwrap()),
            cuda_version: some(4),
            triton_version: some(5),
        }
    }

    fn gpu(
        backend: Option<&str>,
        arch: Option<&str>,
        warp: Option<u32>,
        cuda: Option<&str>,
    ) -> Gpu {
        Gpu {
            vendor: Vendor::Nvidia,
            product: "a GPU".into(),
            backend: backend.map(|b| b.parse().unwrap()),
            arch: arch.map(|a| a.parse().unwrap()),
            warp_size: warp,
            toolkit_version: cuda.map(str::to_string),
            ..Gpu::default()
        }
    }

    /// The GPUs of the table: every kind of property a check looks at.
    fn table_gpus() -> Vec<Gpu> {
        let mut gpus = Vec::new();
        for backend in [None, Some("cuda"), Some("hip")] {
            for arch in [
                None,
                Some("75"),
                Some("80"),
                Some("86"),
                Some("90"),
                Some("90a"),
                Some("100"),
                Some("103"),
                Some("gfx90a"),
                Some("gfx942"),
            ] {
                for warp in [None, Some(32), Some(64)] {
                    for cuda in [
                        None,
                        Some("11.8"),
                        Some("12.4"),
                        Some("12.9"),
                        Some("13.0"),
                        Some("14.0"),
                        Some("8.0"),
                        Some("odd"),
                    ] {
                        gpus.push(gpu(backend, arch, warp, cuda));
                    }
                }
            }
        }
        gpus
    }

    /// The targets of the table.
    fn table_targets() -> Vec<Target> {
        [
            "cuda/75/32",
            "cuda/75/32/84",
            "cuda/80/32/87",
            "cuda/90/32/87",
            "cuda/90a/32/90",
            "cuda/100f/32/100",
            "cuda/90/32//13.0",
            "cuda/90/32/78/11.8",
            "cuda/90/64",
            "cuda/90/32/87//3.6.0",
            "cuda/90/32/87//3.5.0",
            "cuda/gfx90a/32",
            "hip/gfx90a/64",
            "hip/gfx942/64",
            "hip/gfx90a/32",
            "hip/90/64",
        ]
        .into_iter()
        .map(target)
        .collect()
    }

    #[test]
    fn the_requirement_admits_exactly_the_gpus_the_check_accepts() {
        let option_sets = [
            CheckOptions::default(),
            CheckOptions {
                cuda_arch_rule: CudaArchRule::BinaryCompatible,
                ..CheckOptions::default()
            },
            CheckOptions {
                triton_version: Some("3.6.0".into()),
                ..CheckOptions::default()
            },
        ];
        let (gpus, targets) = (table_gpus(), table_targets());
        let mut fits = 0;
        for options in &option_sets {
            for target in &targets {
                let requirement = requirement(target, options);
                for gpu in &gpus {
                    let checked = check_target(target, gpu, options).is_empty();
                    let required = requirement.as_ref().is_some_and(|r| r.admits(gpu));
                    assert_eq!(
                        required, checked,
                        "{target} ({target:?}) on {gpu:?} with {options:?}"
                    );
                    fits += usize::from(checked);
                }
            }
        }
        // The table exercises both answers.
        assert!(fits > 100, "{fits}");
    }

    #[test]
    fn a_triton_cache_asks_for_one_compute_capability_and_a_driver_of_its_major() {
        let r = requirement(&target("cuda/90/32/87"), &CheckOptions::default()).unwrap();
        assert_eq!(
            r.arch,
            ArchRequirement::ComputeCapability {
                major: 9,
                minor: 0,
                newer_minor: false
            }
        );
        assert!(r.unreported_warp_size_fits);
        // PTX ISA 8.7 is CUDA 12: drivers of CUDA 9.0 up to 11.x refuse it.
        assert_eq!(
            r.refused_drivers,
            [VersionRange {
                from: (9, 0),
                below: (12, 0)
            }]
        );
        let hip = requirement(&target("hip/gfx942/64"), &CheckOptions::default()).unwrap();
        assert_eq!(hip.arch, ArchRequirement::Named("gfx942".into()));
        assert!(!hip.unreported_warp_size_fits && hip.refused_drivers.is_empty());
    }
}
