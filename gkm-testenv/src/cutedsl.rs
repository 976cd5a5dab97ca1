//! Real CuTe DSL (NVIDIA's CUTLASS Python DSL, `hack/ci/components.sh
//! cutedsl`) compiling kernels into its file cache on this machine, without
//! a GPU: `hack/fixtures/cutedsl_kernels.py`, run from the repository (the
//! DSL's key holds the source locations of the kernels it compiles, so a
//! pod runs the script at the same path to find them).

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;

use crate::{Component, find_binary, repo_root};

/// The script that compiles the kernels, below the repository.
pub const KERNELS_SCRIPT: &str = "hack/fixtures/cutedsl_kernels.py";

/// What the script said compiling `kernels` for `arch` (`sm_90a`) against
/// the cache at `cache`: each kernel's "hit" or "miss", and the seconds it
/// took.
pub fn compile_kernels(cache: &Path, arch: &str, kernels: &[&str]) -> anyhow::Result<Value> {
    let python = find_binary(Component::CuteDsl)?;
    let home = tempfile::tempdir()?;
    let out = Command::new(&python)
        .arg(repo_root().join(KERNELS_SCRIPT))
        .arg(arch)
        .args(kernels)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TMPDIR", home.path())
        .env("CUTE_DSL_CACHE_DIR", cache)
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{KERNELS_SCRIPT} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("the script's JSON")
}
