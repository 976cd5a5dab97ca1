//! Scan a Triton or vLLM kernel cache and check it against GPUs.
//!
//! ```text
//! cargo run -p gkm-examples --example check_cache -- DIR GPU...
//! ```
//!
//! Each GPU is `BACKEND/ARCH/WARP_SIZE[@CUDA]`, for example `cuda/sm_75/32@12.4`
//! (a Tesla T4 whose driver supports CUDA 12.4) or `hip/gfx90a/64` (an
//! MI210). Prints the cache's targets and, per GPU, whether the cache fits
//! and why not. Exits 0 when some GPU fits, 1 when none does, 2 on an error.
//!
//! ```text
//! $ cargo run -p gkm-examples --example check_cache -- \
//!     ../shared/fixtures/caches/triton-vector-add-cuda-sm75 cuda/75/32@12.4 cuda/80/32@12.4
//! triton cache, 1 kernel(s), targets: cuda/75/32
//! GPU 0 device (cuda/75/32): compatible (cuda/75/32)
//! GPU 1 device (cuda/80/32): incompatible
//!   cuda/75/32: architecture mismatch: the cache targets sm_75, the GPU is sm_80 (…)
//! ```

// An example may unwrap: a panic is how a short program reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use gkm_core::cache;
use gkm_core::compat::{CheckOptions, check_manifest};
use gkm_core::{Arch, Backend, Gpu};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((dir, gpus)) = args.split_first() else {
        eprintln!("usage: check_cache DIR BACKEND/ARCH/WARP_SIZE[@CUDA]...");
        return ExitCode::from(2);
    };
    match run(Path::new(dir), gpus) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(message) => {
            eprintln!("check_cache: {message}");
            ExitCode::from(2)
        }
    }
}

/// Scan, check, print; whether some GPU fits.
fn run(dir: &Path, specs: &[String]) -> Result<bool, String> {
    let manifest = cache::scan(dir).map_err(|e| e.to_string())?;
    let gpus = specs
        .iter()
        .enumerate()
        .map(|(index, spec)| gpu(index, spec))
        .collect::<Result<Vec<_>, _>>()?;
    let kind = manifest.kind().as_str();
    let report = check_manifest(&manifest, &gpus, &CheckOptions::default());
    let mut out = std::io::stdout().lock();
    write!(
        out,
        "{kind} cache, {} kernel(s), targets: {}\n{report}",
        manifest.entries().len(),
        manifest.summary()
    )
    .map_err(|e| format!("writing the report: {e}"))?;
    Ok(report.compatible)
}

/// A GPU from `BACKEND/ARCH/WARP_SIZE[@CUDA]`.
fn gpu(index: usize, spec: &str) -> Result<Gpu, String> {
    let bad = |why: String| format!("GPU {spec:?}: {why}; expected BACKEND/ARCH/WARP_SIZE[@CUDA]");
    let (target, cuda) = match spec.split_once('@') {
        Some((target, cuda)) => (target, Some(cuda.to_string())),
        None => (spec, None),
    };
    let [backend, arch, warp] = target.split('/').collect::<Vec<_>>()[..] else {
        return Err(bad("not three parts".into()));
    };
    let backend: Backend = backend.parse().map_err(|e| bad(format!("{e}")))?;
    let arch: Arch = arch.parse().map_err(|e| bad(format!("{e}")))?;
    let warp_size: u32 = warp.parse().map_err(|e| bad(format!("warp size: {e}")))?;
    Ok(Gpu {
        index: u32::try_from(index).map_err(|e| bad(e.to_string()))?,
        product: "device".into(),
        backend: Some(backend),
        arch: Some(arch),
        warp_size: Some(warp_size),
        toolkit_version: cuda,
        ..Default::default()
    })
}
