//! Real TVM-FFI (`tvm_ffi.cpp`, the apache-tvm-ffi wheel TileLang brings,
//! `hack/ci/components.sh tilelang`) building modules into a cache on this
//! machine, without a GPU: `hack/fixtures/tvm_ffi_modules.py`, with
//! `CUDA_HOME` at the toolkit from NVIDIA's wheels the component lays out
//! as a CUDA install.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;

use crate::{Component, find_binary, repo_root};

/// The script that builds the modules, below the repository.
pub const MODULES_SCRIPT: &str = "hack/fixtures/tvm_ffi_modules.py";
/// The C++ compiler modules are built with (`CXX`, which a module's
/// `build.ninja` names): `g++`, which resolves in `/usr/bin` alone (`c++`,
/// TVM-FFI's default, goes through `/etc/alternatives`), so a pod given the
/// host's `/usr` runs the same command line.
pub const CXX: &str = "g++";
/// The virtualenv TVM-FFI is installed in, in the tools directory.
pub const VIRTUALENV: &str = "tilelang-0.1.15";

/// The virtualenv TVM-FFI runs from, at its real path (what a module's
/// `build.ninja` names: `tvm_ffi` resolves its own install's path).
pub fn virtualenv() -> anyhow::Result<PathBuf> {
    let wrapper = find_binary(Component::TileLang)?;
    let tools = wrapper
        .parent()
        .and_then(Path::parent)
        .context("the tools directory above the TileLang wrapper")?;
    Ok(tools.join(VIRTUALENV))
}

/// `CUDA_HOME` for TVM-FFI's CUDA modules: the component's `cuda-home/`.
pub fn cuda_home() -> anyhow::Result<PathBuf> {
    Ok(virtualenv()?.join("cuda-home"))
}

/// What the script said building `modules` into the cache at `cache`, the
/// CUDA ones for `cuda_archs` (`TVM_FFI_CUDA_ARCH_LIST`: `9.0a`): each
/// module's "hit" or "miss", and the seconds it took.
pub fn build_modules(cache: &Path, cuda_archs: &str, modules: &[&str]) -> anyhow::Result<Value> {
    let venv = virtualenv()?;
    let home = tempfile::tempdir()?;
    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join(MODULES_SCRIPT))
        .args(modules)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TVM_FFI_CACHE_DIR", cache)
        .env("TVM_FFI_CUDA_ARCH_LIST", cuda_archs)
        .env("CUDA_HOME", cuda_home()?)
        .env("CXX", CXX)
        .output()
        .with_context(|| format!("running {}", venv.join("bin/python").display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{MODULES_SCRIPT} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("the script's JSON")
}
