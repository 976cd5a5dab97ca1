//! Real PyTorch against delivered Inductor and Mega-Cache caches, on the CPU.
//!
//! The fixture is the Inductor cache tree (`TORCHINDUCTOR_CACHE_DIR`) and
//! Mega-Cache blob (`torch.compiler.save_cache_artifacts()`) of the small
//! model in `hack/fixtures/torch_model.py`, compiled cold by
//! `hack/fixtures/torch.sh`, with the digests of its outputs: this
//! machine's own compile of it, which `hack/ci/components.sh torch` makes
//! ([`fixture`]). `fixtures/torch` holds one made on another machine, whose
//! layout the scanning tests read. [`torch_check`] runs that script's
//! `check` mode (PyTorch 2.11, installed by `hack/ci/components.sh torch`) in
//! a fresh process: it compiles the same model against a tree (after loading
//! a blob into it, when given) and reports Inductor's own cache counters (FX
//! graph and AOTAutograd hits and misses), how many C++ kernels it built, and
//! whether each output equals the cold run's.
//!
//! Unlike Triton, Inductor finds its entries and kernels by key under
//! whatever `TORCHINDUCTOR_CACHE_DIR` it is given: a tree is reused wherever
//! it is put. Its keys do hold the vector ISA of its C++ kernels (the
//! fixture's is AVX2, `cpp.simdlen=256`) and the compiler's view of the CPU
//! (Inductor preprocesses its headers with `-march=native`): a tree
//! compiled on another CPU model finds its FX graphs and builds every C++
//! kernel again. So the tests compile the fixture on the machine they run
//! on, once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde::Deserialize;

use crate::binaries::{Component, find_binary};

/// The version of PyTorch the fixture was compiled with, the one
/// `hack/ci/components.sh torch` installs.
pub const TORCH_VERSION: &str = "2.11.0";

/// Where `torch-python` runs PyTorch's virtualenv from (a link to
/// [`virtualenv`]): `<this>/bin/python`. Pods mount the virtualenv here.
pub const VIRTUALENV_LINK: &str = "/tmp/gkm-torch-2.11.0";

/// The `TORCHINDUCTOR_CACHE_DIR` `hack/fixtures/torch.sh` compiles the
/// fixture in.
pub const FIXTURE_COMPILE_PATH: &str = "/tmp/gkm-torch-fixtures/inductor";

/// How many FX graphs the fixture's model compiles (one per input shape).
pub const FIXTURE_GRAPHS: u64 = 2;

/// The vector ISA of the fixture's C++ kernels, as Inductor names it.
pub const FIXTURE_VEC_ISA: &str = "avx2";

/// The file name of the model's script in [`model_dir`].
pub const MODEL_SCRIPT: &str = "torch_model.py";

/// The fixture in the repository.
#[derive(Debug, Clone)]
pub struct TorchFixture {
    /// The Inductor cache tree.
    pub inductor: PathBuf,
    /// The Mega-Cache blob.
    pub mega_cache: PathBuf,
    /// The digests of the cold run's outputs (`expected.json`).
    pub expected: PathBuf,
}

/// The fixture as compiled on this machine
/// (`$GKM_TOOLS_DIR/torch-fixture`, made by `hack/ci/components.sh
/// torch`); an error naming what is missing and the command that makes it.
pub fn fixture() -> anyhow::Result<TorchFixture> {
    let link = crate::binaries::tools_bin_dir()
        .parent()
        .map(|tools| tools.join("torch-fixture"))
        .context("the tools directory has no parent")?;
    let root = std::fs::canonicalize(&link).with_context(|| {
        format!(
            "no torch fixture compiled on this machine at {}: run {}",
            link.display(),
            Component::Torch.install_command()
        )
    })?;
    let fixture = TorchFixture {
        inductor: root.join("inductor"),
        mega_cache: root.join("mega-cache.bin"),
        expected: root.join("expected.json"),
    };
    for path in [&fixture.inductor, &fixture.mega_cache, &fixture.expected] {
        anyhow::ensure!(
            path.exists(),
            "no {} (run {})",
            path.display(),
            Component::Torch.install_command()
        );
    }
    Ok(fixture)
}

/// The directory of PyTorch's virtualenv (`hack/ci/components.sh torch`):
/// beside the tools' `bin/`, holding `pyvenv.cfg`. Its interpreter is the
/// host's Python (`/usr/bin/python3`), so running it in a container needs
/// the host's `/usr` and its libraries too (and its `g++` for a miss).
pub fn virtualenv() -> anyhow::Result<PathBuf> {
    let bin = crate::binaries::tools_bin_dir();
    let dir = bin
        .parent()
        .map(|tools| tools.join(format!("torch-{TORCH_VERSION}")))
        .with_context(|| format!("{} has no parent", bin.display()))?;
    anyhow::ensure!(
        dir.join("pyvenv.cfg").is_file(),
        "no PyTorch virtualenv at {}: run {}",
        dir.display(),
        Component::Torch.install_command()
    );
    Ok(dir)
}

/// The directory of the model's script, `hack/fixtures`.
pub fn model_dir() -> PathBuf {
    crate::repo_root().join("hack/fixtures")
}

/// What real `torch.compile` did compiling the fixture's model against one
/// cache (a report of `hack/fixtures/torch_model.py check`).
#[derive(Debug, Clone, Deserialize)]
pub struct CompileReport {
    /// PyTorch's version.
    pub torch: String,
    /// The vector ISA Inductor picked for its C++ kernels.
    pub vec_isa: String,
    /// The `TORCHINDUCTOR_CACHE_DIR` it compiled against.
    pub cache: PathBuf,
    /// The artefacts a loaded Mega-Cache blob held, by type, when one was
    /// loaded.
    pub mega_cache_loaded: Option<BTreeMap<String, u64>>,
    /// FX graphs Inductor found in its cache.
    pub fxgraph_cache_hit: u64,
    /// FX graphs it compiled.
    pub fxgraph_cache_miss: u64,
    /// FX graphs it would not cache.
    pub fxgraph_cache_bypass: u64,
    /// AOTAutograd entries found in the cache.
    pub autograd_cache_hit: u64,
    /// AOTAutograd entries compiled.
    pub autograd_cache_miss: u64,
    /// How many C++ kernels (shared objects) Inductor built.
    pub cpp_kernels_compiled: u64,
    /// How many graphs the model compiled (input shapes).
    pub graphs: u64,
    /// Each output, by input shape (`4x64`).
    pub outputs: BTreeMap<String, OutputReport>,
}

/// One output of a [`CompileReport`].
#[derive(Debug, Clone, Deserialize)]
pub struct OutputReport {
    /// SHA-256 of its bytes.
    pub digest: String,
    /// Whether it equals the cold run's, bit for bit; `None` for a shape
    /// the cold run never saw.
    pub equals_cold_run: Option<bool>,
    /// Whether it is close to eager PyTorch's.
    pub close_to_eager: bool,
}

impl CompileReport {
    /// Whether every graph was an FX graph cache hit: no miss, no bypass.
    pub fn all_hits(&self) -> bool {
        self.fxgraph_cache_hit == self.graphs
            && self.fxgraph_cache_miss == 0
            && self.fxgraph_cache_bypass == 0
    }

    /// Whether every output of a shape the cold run saw equals the cold
    /// run's, and every output is close to eager PyTorch's.
    pub fn outputs_as_cold_run(&self) -> bool {
        let seen = self
            .outputs
            .values()
            .filter(|o| o.equals_cold_run.is_some())
            .count();
        seen as u64 == FIXTURE_GRAPHS
            && self
                .outputs
                .values()
                .all(|o| o.equals_cold_run != Some(false) && o.close_to_eager)
    }

    /// The counters, in one line for a test's output.
    pub fn summary(&self) -> String {
        format!(
            "{} graphs: FX graph cache {} hits, {} misses; AOTAutograd cache {} hits, {} misses; \
             {} C++ kernels built (vec ISA {})",
            self.graphs,
            self.fxgraph_cache_hit,
            self.fxgraph_cache_miss,
            self.autograd_cache_hit,
            self.autograd_cache_miss,
            self.cpp_kernels_compiled,
            self.vec_isa
        )
    }
}

/// The report in `output` (the checker's standard output, or a pod's log):
/// its last line that is a JSON object.
pub fn parse_report(output: &str) -> anyhow::Result<CompileReport> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("no report in the checker's output:\n{output}"))?;
    serde_json::from_str(line).with_context(|| format!("the checker's report is not one: {line}"))
}

/// What to compile against.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The `TORCHINDUCTOR_CACHE_DIR`.
    pub cache: &'a Path,
    /// A Mega-Cache blob to load into it first.
    pub mega_cache: Option<&'a Path>,
    /// Whether to run one input shape the fixture never saw too (one more
    /// graph, a miss).
    pub new_shape: bool,
}

/// Runs real `torch.compile` (`hack/fixtures/torch_model.py check`) once,
/// in a fresh process whose environment holds nothing of PyTorch's but the
/// cache it sets, and compares its outputs with the fixture's.
pub fn torch_check(check: Check<'_>) -> anyhow::Result<CompileReport> {
    let fixture = fixture()?;
    let home = crate::temp_dir()?;
    let mut command = Command::new(find_binary(Component::Torch)?);
    command
        .arg(model_dir().join(MODEL_SCRIPT))
        .arg("check")
        .arg("--cache")
        .arg(check.cache)
        .arg("--expected")
        .arg(&fixture.expected)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("TMPDIR", home.path());
    if let Some(blob) = check.mega_cache {
        command.arg("--mega").arg(blob);
    }
    if check.new_shape {
        command.arg("--new-shape");
    }
    let out = command.output().context("running torch-python")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "hack/fixtures/torch_model.py check {check:?} failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    parse_report(&stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_the_last_json_line_of_the_output() {
        let line = r#"{"torch": "2.11.0+cu130", "vec_isa": "avx2", "cache": "/c", "mega_cache_loaded": null, "fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0, "fxgraph_cache_bypass": 0, "autograd_cache_hit": 2, "autograd_cache_miss": 0, "autograd_cache_bypass": 0, "cpp_kernels_compiled": 0, "cpp_built": [], "graphs": 2, "outputs": {"4x64": {"digest": "a", "equals_cold_run": true, "close_to_eager": true}, "8x64": {"digest": "b", "equals_cold_run": true, "close_to_eager": true}}}"#;
        let report = parse_report(&format!("UserWarning: something\n{line}\n")).expect("report");
        assert!(
            report.all_hits() && report.outputs_as_cold_run(),
            "{report:#?}"
        );
        let err = parse_report("Traceback (most recent call last):\n").expect_err("no report");
        assert!(format!("{err:#}").contains("no report"), "{err:#}");
    }
}
