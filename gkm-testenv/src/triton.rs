//! Real Triton against delivered cache trees.
//!
//! The fleet is `fixtures/triton`: real Triton caches of the same kernels,
//! one `TRITON_CACHE_DIR` tree per GPU target, compiled without a GPU by
//! `hack/fixtures/triton.sh`. [`triton_check`] runs `hack/fixtures/triton_fleet.py
//! check` (Triton 3.6, installed by `hack/ci/components.sh triton`), which
//! compiles those kernels again against a tree and reports, by Triton's own
//! last compile stage, whether it compiled anything, and from which directory
//! it read each kernel.
//!
//! Triton keys a kernel by its source text and line, the target, the
//! options and Triton's own build, not by any path; but its group files
//! record the absolute path of every file under the `TRITON_CACHE_DIR` the
//! kernel was compiled in, and a recorded path that does not exist is a
//! miss. So a delivered tree is reused only at its fixture's compile path
//! ([`FleetTarget::compiled_at`]), and [`CompilePaths`] puts trees there
//! under a machine-wide lock, with nothing else at that path.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use serde::Deserialize;

use crate::binaries::{Component, find_binary};

/// Which GPU profiles (of `gkm gpus --simulate`) run each fleet fixture's
/// target: the fixture's directory, then the profiles.
pub const FLEET_PROFILES: [(&str, &[&str]); 11] = [
    ("cuda-75-32", &["T4"]),
    ("cuda-80-32", &["A100", "A100-40GB"]),
    ("cuda-86-32", &["A10"]),
    ("cuda-89-32", &["L4", "L40S"]),
    ("cuda-90-32", &["H100", "H200"]),
    ("cuda-100-32", &["B200", "GB200"]),
    ("cuda-103-32", &["B300"]),
    ("cuda-120-32", &["RTX-PRO-6000"]),
    ("hip-gfx90a-64", &["MI210", "MI250X"]),
    ("hip-gfx942-64", &["MI300X", "MI325X"]),
    ("hip-gfx950-64", &["MI355X"]),
];

/// Where `hack/fixtures/triton.sh` compiles each target; trees are placed
/// and removed only below it.
pub const FIXTURE_HOME: &str = "/tmp/gkm-triton-fixtures";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One target of the fleet, as its fixture records it.
#[derive(Debug, Clone)]
pub struct FleetTarget {
    /// The fixture's directory name, e.g. `cuda-90-32`.
    pub name: String,
    /// Triton's target, `backend/arch/warp_size` (`cuda/90/32`), as the
    /// kernels' metadata records it.
    pub target: String,
    /// The fixture tree in the repository.
    pub fixture: PathBuf,
    /// The `TRITON_CACHE_DIR` the kernels were compiled in, as their group
    /// files record it: the only path Triton finds them at.
    pub compiled_at: PathBuf,
    /// How many kernels (cache entries, one group file each) it holds.
    pub kernels: usize,
}

impl FleetTarget {
    /// A GPU inventory line of `gkm gpus --simulate` for a GPU that runs
    /// this target (the first profile of [`FLEET_PROFILES`]).
    pub fn profile(&self) -> anyhow::Result<&'static str> {
        FLEET_PROFILES
            .iter()
            .find(|(name, _)| *name == self.name)
            .map(|(_, profiles)| profiles[0])
            .with_context(|| format!("no GPU profile for fleet target {}", self.name))
    }
}

/// Every target of the fleet (`fixtures/triton/<target>`), sorted by name.
pub fn fleet() -> anyhow::Result<Vec<FleetTarget>> {
    let root = repo_root().join("fixtures/triton");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root)
        .with_context(|| format!("{} (hack/fixtures/triton.sh writes it)", root.display()))?
    {
        let fixture = entry?.path();
        if fixture.is_dir() {
            out.push(fleet_target(&fixture)?);
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Reads a fixture: its target from a kernel's metadata, its compile path
/// from a group file, its kernel count from the group files.
fn fleet_target(fixture: &Path) -> anyhow::Result<FleetTarget> {
    let name = fixture
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (mut target, mut compiled_at, mut kernels) = (None, None, 0);
    for key in std::fs::read_dir(fixture)? {
        for file in std::fs::read_dir(key?.path())? {
            let file = file?.path();
            let file_name = file.file_name().unwrap_or_default().to_string_lossy();
            if !file_name.ends_with(".json") {
                continue;
            }
            let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            if file_name.starts_with("__grp__") {
                kernels += 1;
                let child = json["child_paths"]
                    .as_object()
                    .and_then(|c| c.values().next())
                    .and_then(serde_json::Value::as_str)
                    .with_context(|| format!("{} names no file", file.display()))?;
                compiled_at = Path::new(child).ancestors().nth(2).map(Path::to_path_buf);
            } else if let Some(t) = json.get("target") {
                let arch = match &t["arch"] {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                target = Some(format!(
                    "{}/{arch}/{}",
                    t["backend"].as_str().unwrap_or("?"),
                    t["warp_size"]
                ));
            }
        }
    }
    let missing = |what: &str| anyhow::anyhow!("fixture {} has no {what}", fixture.display());
    let compiled_at = compiled_at.ok_or_else(|| missing("group file"))?;
    anyhow::ensure!(
        compiled_at.starts_with(FIXTURE_HOME),
        "{name} was compiled at {}, not below {FIXTURE_HOME}: write it again with hack/fixtures/triton.sh",
        compiled_at.display()
    );
    Ok(FleetTarget {
        target: target.ok_or_else(|| missing("kernel metadata"))?,
        compiled_at,
        kernels,
        fixture: fixture.to_path_buf(),
        name,
    })
}

/// The fleet's target whose fixture directory is `name` (`cuda-75-32`).
pub fn fleet_target_named(name: &str) -> anyhow::Result<FleetTarget> {
    fleet()?
        .into_iter()
        .find(|t| t.name == name)
        .with_context(|| format!("no fleet target {name} in fixtures/triton"))
}

/// The version of Triton the fleet was compiled with, the one
/// `hack/ci/components.sh triton` installs.
pub const TRITON_VERSION: &str = "3.6.0";

/// Where `triton-python` runs Triton's virtualenv from (a link to
/// [`virtualenv`]), as the fixtures were compiled: `<this>/bin/python`.
pub const VIRTUALENV_LINK: &str = "/tmp/gkm-triton-3.6.0";

/// The directory of Triton's virtualenv (`hack/ci/components.sh triton`):
/// beside the tools' `bin/`, holding `pyvenv.cfg`. Its interpreter is the
/// host's Python (`/usr/bin/python3`), so running it elsewhere (in a
/// container) needs the host's `/usr` and its libraries too.
pub fn virtualenv() -> anyhow::Result<PathBuf> {
    let bin = crate::binaries::tools_bin_dir();
    let dir = bin
        .parent()
        .map(|tools| tools.join(format!("triton-{TRITON_VERSION}")))
        .with_context(|| format!("{} has no parent", bin.display()))?;
    anyhow::ensure!(
        dir.join("pyvenv.cfg").is_file(),
        "no Triton virtualenv at {}: run {}",
        dir.display(),
        Component::Triton.install_command()
    );
    Ok(dir)
}

/// The directory of the fleet's checker, `hack/fixtures`: `triton_fleet.py`
/// and the `triton_calls.py` it imports.
pub fn checker_dir() -> PathBuf {
    crate::repo_root().join("hack/fixtures")
}

/// The name of the directory under `TRITON_CACHE_DIR` that holds the kernel
/// whose hash (a [`KernelReport::hash`], hex SHA-256) is `hash`: Triton's
/// `_base32` of its bytes, RFC 4648 base32 without padding.
pub fn key_dir(hash: &str) -> anyhow::Result<String> {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    anyhow::ensure!(
        hash.len().is_multiple_of(2) && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "kernel hash {hash:?} is not hex"
    );
    let bytes: Vec<u8> = (0..hash.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hash[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .with_context(|| format!("kernel hash {hash:?} is not hex"))?;
    let mut out = String::new();
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in bytes {
        buffer = (buffer << 8) | u32::from(byte);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(char::from(ALPHABET[((buffer >> bits) & 31) as usize]));
        }
        buffer &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(char::from(ALPHABET[((buffer << (5 - bits)) & 31) as usize]));
    }
    Ok(out)
}

/// What Triton did compiling the fleet's kernels for one target against one
/// cache tree (a report of `hack/fixtures/triton_fleet.py check`).
#[derive(Debug, Clone, Deserialize)]
pub struct TritonReport {
    /// The target, `backend/arch/warp_size`.
    pub target: String,
    /// Triton's version.
    pub triton: String,
    /// The `TRITON_CACHE_DIR` it compiled against.
    pub cache: PathBuf,
    /// Each kernel.
    pub kernels: Vec<KernelReport>,
    /// How many kernels Triton compiled (its last stage ran).
    pub compiled: usize,
    /// How many it found in a cache.
    pub reused: usize,
}

/// One kernel of a [`TritonReport`].
#[derive(Debug, Clone, Deserialize)]
pub struct KernelReport {
    /// The kernel and its configuration.
    pub kernel: String,
    /// Triton's cache key of it.
    pub hash: String,
    /// Whether Triton compiled it.
    pub compiled: bool,
    /// The cache directories holding the files Triton used for it.
    pub read_from: Vec<PathBuf>,
}

impl TritonReport {
    /// Whether Triton compiled nothing and read every kernel from the tree
    /// it was given.
    pub fn reused_whole(&self) -> bool {
        self.compiled == 0
            && self
                .kernels
                .iter()
                .all(|k| !k.compiled && k.read_from == [self.cache.clone()])
    }
}

/// Runs real Triton (`hack/fixtures/triton_fleet.py check`) once over every
/// `(target, cache tree)` pair, in order; its environment holds nothing of
/// Triton's but the cache directory it sets for each pair.
pub fn triton_check(pairs: &[(&str, &Path)]) -> anyhow::Result<Vec<TritonReport>> {
    let home = crate::temp_dir()?;
    let mut command = Command::new(find_binary(Component::Triton)?);
    command
        .arg(repo_root().join("hack/fixtures/triton_fleet.py"))
        .arg("check")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path());
    for (target, cache) in pairs {
        command.args(["--target", target, "--cache"]).arg(cache);
    }
    let out = command.output().context("running triton-python")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "hack/fixtures/triton_fleet.py check {pairs:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<TritonReport>, _>>()
        .with_context(|| format!("hack/fixtures/triton_fleet.py check printed:\n{stdout}"))?;
    anyhow::ensure!(
        reports.len() == pairs.len(),
        "{} reports for {} trees",
        reports.len(),
        pairs.len()
    );
    Ok(reports)
}

/// The fixtures' compile paths, held under the machine-wide lock that
/// `hack/fixtures/triton.sh` takes too, so runs side by side never check
/// one another's trees. Every tree placed is removed on drop.
pub struct CompilePaths {
    _lock: File,
    placed: Vec<PathBuf>,
}

impl CompilePaths {
    /// Waits for the lock on the compile paths.
    pub fn lock() -> anyhow::Result<CompilePaths> {
        let lock = File::create(format!("{FIXTURE_HOME}.lock"))?;
        lock.lock()
            .context("locking the Triton fixtures' compile paths")?;
        Ok(CompilePaths {
            _lock: lock,
            placed: Vec::new(),
        })
    }

    /// Empties `target`'s compile path, for a tree to be written there;
    /// returns it.
    pub fn clear(&mut self, target: &FleetTarget) -> anyhow::Result<PathBuf> {
        let path = target.compiled_at.clone();
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("clearing {}", path.display()))?;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        self.placed.push(path.clone());
        Ok(path)
    }

    /// Copies `tree` (what was delivered for `target`) to its compile path,
    /// replacing whatever was there; returns the path.
    pub fn place(&mut self, target: &FleetTarget, tree: &Path) -> anyhow::Result<PathBuf> {
        let path = self.clear(target)?;
        copy_tree(tree, &path)
            .with_context(|| format!("copying {} to {}", tree.display(), path.display()))?;
        Ok(path)
    }
}

impl Drop for CompilePaths {
    fn drop(&mut self) {
        for path in &self.placed {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Checks with real Triton that every delivered tree is reused whole: each
/// `(target, tree)` is copied to the target's compile path and one Triton
/// run compiles the fleet's kernels for every target against them. Fails
/// with Triton's reports unless Triton compiled nothing and read every
/// kernel from the delivered tree.
pub fn check_delivered(delivered: &[(&FleetTarget, PathBuf)]) -> anyhow::Result<Vec<TritonReport>> {
    let mut paths = CompilePaths::lock()?;
    let mut pairs = Vec::new();
    for (target, tree) in delivered {
        pairs.push((target.target.as_str(), paths.place(target, tree)?));
    }
    let pairs: Vec<(&str, &Path)> = pairs.iter().map(|(t, p)| (*t, p.as_path())).collect();
    let reports = triton_check(&pairs)?;
    for ((target, _), report) in delivered.iter().zip(&reports) {
        anyhow::ensure!(
            report.reused_whole() && report.kernels.len() == target.kernels,
            "real Triton did not reuse the delivered {} tree whole: {report:#?}",
            target.name
        );
    }
    Ok(reports)
}

pub use crate::trees::copy_tree;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_tree_missing_a_kernel_is_not_reused_whole() {
        let fleet = fleet().expect("fleet");
        let target = fleet
            .iter()
            .find(|t| t.name == "cuda-75-32")
            .expect("cuda-75-32");
        let work = crate::temp_dir().expect("tempdir");
        let whole = work.path().join("whole");
        copy_tree(&target.fixture, &whole).expect("copy");
        let short = work.path().join("short");
        copy_tree(&target.fixture, &short).expect("copy");
        let first_key = std::fs::read_dir(&short)
            .expect("read")
            .next()
            .expect("a kernel")
            .expect("entry")
            .path();
        std::fs::remove_dir_all(first_key).expect("remove a kernel");

        let reports = check_delivered(&[(target, whole)]).expect("the whole tree is reused");
        assert!(reports[0].reused_whole(), "{reports:#?}");
        let refused = check_delivered(&[(target, short)]).expect_err("a kernel is missing");
        let message = format!("{refused:#}");
        assert!(
            message.contains("did not reuse the delivered cuda-75-32 tree")
                && message.contains("compiled: 1,"),
            "{message}"
        );
    }

    #[test]
    fn a_kernels_key_directory_is_the_base32_of_its_hash() {
        // Python: base64.b32encode(bytes.fromhex(h)).decode().rstrip("=")
        assert_eq!(key_dir("").expect("empty"), "");
        assert_eq!(key_dir("66").expect("f"), "MY");
        assert_eq!(key_dir("666f6f626172").expect("foobar"), "MZXW6YTBOI");
        let fixture = fleet_target_named("cuda-75-32").expect("cuda-75-32");
        for key in std::fs::read_dir(&fixture.fixture).expect("read") {
            let key = key.expect("entry").path();
            for file in std::fs::read_dir(&key).expect("read") {
                let file = file.expect("entry").path();
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                if name.ends_with(".json") && !name.starts_with("__grp__") {
                    let json: serde_json::Value =
                        serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
                    let hash = json["hash"].as_str().expect("hash");
                    assert_eq!(
                        key_dir(hash).expect("hex"),
                        key.file_name().unwrap_or_default().to_string_lossy()
                    );
                }
            }
        }
        assert!(key_dir("6g").is_err());
        assert!(key_dir("abc").is_err());
    }

    #[test]
    fn every_fixture_has_a_profile_and_its_own_compile_path() {
        let fleet = fleet().expect("fleet");
        assert_eq!(fleet.len(), FLEET_PROFILES.len());
        for t in &fleet {
            assert_eq!(t.target.replace('/', "-"), t.name, "{t:?}");
            assert_eq!(t.compiled_at, Path::new(FIXTURE_HOME).join(&t.name));
            assert!(t.kernels > 0, "{t:?}");
            t.profile().expect("profile");
        }
    }
}
