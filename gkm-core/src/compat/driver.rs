//! Whether a GPU's CUDA driver loads a CUDA target's kernels.
//!
//! # What is loaded
//!
//! Triton (and every cache built on it: vLLM's, Inductor's) loads the
//! kernel's **cubin**, the SASS `ptxas` assembled for one architecture
//! (`CompiledKernel` hands `asm["cubin"]` to `cuModuleLoadData`); the `.ptx`
//! next to it is an intermediate stage that is never loaded. gkm's
//! architecture rules ([`CudaArchRule`](super::CudaArchRule)) accept a
//! target only where that SASS runs natively on the GPU, so a compatible
//! target never needs the driver to JIT-compile PTX. A target that would
//! need PTX JIT (an sm_80 cache on an sm_90 GPU) is refused by the
//! architecture rule ([`Reason::ArchMismatch`]), whatever the driver:
//! Triton compiles such a kernel again rather than JIT its PTX.
//!
//! # The rule
//!
//! NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility"
//! (<https://docs.nvidia.com/deploy/cuda-compatibility/#minor-version-compatibility>):
//! an application built with any toolkit of a CUDA major version runs on a
//! driver of the same major version, even an older minor one (a 12.8 build
//! on a 12.4 driver), given the family's minimum driver (525.60.13 for 12.x,
//! 580 for 13.x: the first drivers to report that major, so every driver
//! that reports it qualifies). The limit the guide names is PTX: a driver
//! JIT-compiles only the PTX ISA versions it knows, which does not apply to
//! a cubin. Across major versions only backward compatibility holds: a
//! newer driver runs older builds, an older driver does not run a newer
//! major's (that needs the forward compatibility package).
//!
//! So a CUDA target's kernels load on a driver whose CUDA version is known
//! unless the toolkit that built them is of a **newer major version** than
//! the driver's:
//!
//! - a recorded toolkit version (`cuda_version`, MCV's summaries) gives the
//!   major directly ([`Reason::CudaNewerThanDriver`]);
//! - the PTX ISA bounds it, whether a toolkit version is recorded or not:
//!   the `ptxas` that assembled PTX ISA 8.7 is CUDA 12.8 or newer, so a 9.x
//!   ISA means a CUDA 13 toolkit ([`Reason::PtxNewerThanDriver`]). An ISA of a major the table does not
//!   know (10.0) is refused by every driver the table covers; a driver newer
//!   than the table (or older than CUDA 9.0) is not checked.
//!
//! A Triton 3.6 cache (PTX ISA 8.7, `ptxas` 12.8) thus loads on a CUDA 12.4
//! driver and on 13.0, not on 11.8.

use super::Reason;
use super::ptx::{cuda_major_of_ptx, max_ptx_version, parse_version};
use crate::cache::Target;

/// The oldest PTX ISA the table knows (6.0, CUDA 9.0): older ISAs come from
/// toolkits older than any driver checked here.
pub(super) const OLDEST_KNOWN_PTX: u32 = 60;

/// Every reason a driver supporting CUDA `driver` (`"12.4"`) cannot load a
/// CUDA target's kernels; empty when it can, or when `driver` does not parse.
pub(super) fn driver_reasons(target: &Target, driver: &str) -> Vec<Reason> {
    let Some((driver_major, _)) = parse_version(driver) else {
        return Vec::new();
    };
    let driver_cuda_version = driver.trim().to_string();
    let mut reasons = Vec::new();
    if let Some(ptx) = target.ptx_version
        && ptx >= OLDEST_KNOWN_PTX
        && let Some(max) = max_ptx_version(driver)
        && cuda_major_of_ptx(ptx).is_none_or(|built| built > driver_major)
    {
        reasons.push(Reason::PtxNewerThanDriver {
            ptx_version: ptx,
            max_ptx_version: max,
            driver_cuda_version: driver_cuda_version.clone(),
        });
    }
    if let Some(built) = &target.cuda_version
        && let Some((built_major, _)) = parse_version(built)
        && built_major > driver_major
    {
        reasons.push(Reason::CudaNewerThanDriver {
            cuda_version: built.trim().to_string(),
            driver_cuda_version,
        });
    }
    reasons
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Backend;

    fn target(ptx: Option<u32>, cuda: Option<&str>) -> Target {
        Target {
            backend: Backend::Cuda,
            arch: "90".parse().unwrap(),
            warp_size: 32,
            ptx_version: ptx,
            cuda_version: cuda.map(str::to_string),
            triton_version: None,
        }
    }

    fn loads(ptx: Option<u32>, cuda: Option<&str>, driver: &str) -> bool {
        driver_reasons(&target(ptx, cuda), driver).is_empty()
    }

    #[test]
    fn a_newer_minor_loads_a_newer_major_does_not() {
        // Triton 3.6: PTX ISA 8.7 from ptxas 12.8.
        assert!(loads(Some(87), None, "12.4"));
        assert!(loads(Some(87), None, "12.0"));
        assert!(loads(Some(87), None, "13.0"));
        assert!(!loads(Some(87), None, "11.8"));
        assert!(!loads(Some(90), None, "12.9"));
        assert!(loads(Some(92), None, "13.0"));
        assert!(!loads(Some(100), None, "13.1"));
        // A driver newer than the table is not checked.
        assert!(loads(Some(100), None, "14.0"));
        assert!(loads(Some(50), None, "11.0"));
        assert!(loads(None, Some("12.8"), "12.2"));
        assert!(!loads(None, Some("13.0"), "12.8"));
        assert!(loads(Some(87), None, "a driver"));
    }
}
