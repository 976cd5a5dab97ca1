//! Scanning a FlashInfer cache (`FLASHINFER_CACHE_DIR`), laid out as
//! `flashinfer-python` 0.7.4 writes it:
//!
//! - `<root>/<flashinfer version>/<CUDA archs>/`: the workspace
//!   (`_get_workspace_dir_name`, `flashinfer/jit/env.py` lines 382-391: the
//!   archs of the process's targets, sorted, `f"{major}{minor}"` joined by
//!   `_`: `90a`, `80_90a`; the minor keeps nvcc's suffix,
//!   `CompilationContext._normalize_cuda_arch`,
//!   `flashinfer/compilation_context.py` lines 81-110), holding
//!   `cached_ops/` (`FLASHINFER_JIT_DIR`, env.py line 396), `generated/`
//!   (`FLASHINFER_GEN_SRC_DIR`, line 397: generated sources the modules are
//!   built from), `flashinfer_jit.log` (`FlashInferJITLogger`,
//!   `flashinfer/jit/core.py` lines 57-67) and `autotune/` (some ops'
//!   calibrations);
//! - `cached_ops/<name>/`: one JIT module (`JitSpec.build_dir`,
//!   `jit_library_path`, core.py lines 499-509): `build.ninja`
//!   (`write_ninja`, lines 552-571), `<name>.so` (its `default` target), the
//!   objects `<dir>_<stem>.o` / `.cuda.o` with their depfiles `$out.d`
//!   (`generate_ninja_build_for_op`, `flashinfer/jit/cpp_ext.py` lines
//!   252-403), `embedded_<i>_<object>` and the cubins it embeds, and
//!   ninja's `.ninja_log` and `.ninja_deps` (ninja runs in the module's
//!   directory, `run_ninja`, cpp_ext.py lines 411-440);
//! - `cached_ops/tmp/`: `<name>.lock` and `flashinfer_jit.ninja`
//!   (`get_tmpdir`, core.py lines 859-864; `build_jit_specs`, line 892);
//! - `<root>/autotune/v2/<environment hash>/`: the autotune store
//!   (`flashinfer/autotune_cache.py` lines 11-17, `get_default_cache_root`
//!   lines 238-245, `ManagedAutotuneCache.__init__` lines 357-379):
//!   `manifest.json` (the environment: `flashinfer_version`,
//!   `cuda_version`, `gpu`…, `autotuner.py` lines 315-370) and
//!   `entries/<op hash>.json` (`key`, `runner`, `tactic`, `publish`, lines
//!   432-470), each written through `.autotune_*.tmp` and `os.replace`
//!   (`_atomic_write_json`, line 322);
//! - `<root>/cubins/`: downloaded cubins (`_get_cubin_dir`, env.py line
//!   132), kept, not counted.
//!
//! A module is found again only when ninja finds it up to date: FlashInfer
//! writes `build.ninja` anew for the current paths on every load and runs
//! ninja (`JitSpecNvcc.build`, core.py lines 618-640; `try_load` loads a
//! JIT `.so` only through that build, lines 577-611), and ninja rebuilds an
//! output whose command line changed or that its `.ninja_log` does not
//! list. So a module without its `.so`, with an empty or truncated one, or
//! without `build.ninja` or `.ninja_log` is torn.

use std::path::{Path, PathBuf};

use super::entry::{FlashInferEntry, Part};
use crate::cache::elf;
use crate::cache::files::{file_name, files, key_below, read_head, subdirs, torn};
use crate::cache::{CacheError, Kind};
use crate::gpu::Arch;

/// What a FlashInfer cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a FlashInfer cache (FLASHINFER_CACHE_DIR, \
    ~/.cache/flashinfer): <version>/<CUDA archs>/cached_ops/<module>/ and \
    autotune/v2/<environment>/entries/";

const CACHED_OPS: &str = "cached_ops";
const GENERATED: &str = "generated";
const TMP: &str = "tmp";
const AUTOTUNE: &str = "autotune";
const SCHEMA: &str = "v2";
const ENTRIES: &str = "entries";
const STORE_MANIFEST: &str = "manifest.json";
const BUILD_NINJA: &str = "build.ninja";
const NINJA_LOG: &str = ".ninja_log";
const NINJA_DEPS: &str = ".ninja_deps";
const JIT_LOG: &str = "flashinfer_jit.log";
/// Directories FlashInfer keeps at the root beside its workspaces.
const ROOT_DIRS: [&str; 2] = ["cubins", "qwen_3_5_block"];
/// The prefix and suffix of the autotune store's temporary files.
pub(crate) const TUNING_TEMP: (&str, &str) = (".autotune_", ".tmp");

/// How much of a module's library is read for its ELF header and the CUDA
/// runtime it links (its dynamic section sits near the start).
const LIBRARY_HEAD: u64 = 1 << 20;
/// The largest `build.ninja` or store document read.
const MAX_DOCUMENT: u64 = 16 << 20;

/// What the scan found: the entries, and the root the modules were built
/// at (what their `build.ninja` names).
pub(crate) struct Scanned {
    pub(crate) entries: Vec<FlashInferEntry>,
    pub(crate) built_at: Option<PathBuf>,
}

/// Whether `dir` is laid out as a FlashInfer cache: it holds
/// `<version>/<archs>/cached_ops/` or `autotune/v2/`.
pub(crate) fn recognise(dir: &Path) -> Result<bool, CacheError> {
    for sub in subdirs(dir)? {
        let name = file_name(&sub);
        if name == AUTOTUNE && sub.join(SCHEMA).is_dir() {
            return Ok(true);
        }
        if is_version(&name) && subdirs(&sub)?.iter().any(|w| w.join(CACHED_OPS).is_dir()) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The entries of the FlashInfer cache at `root` (recognised). A file or
/// directory FlashInfer does not write, a torn module or store entry, a
/// workspace of several architectures or modules built at different roots
/// refuse it, naming the path.
pub(crate) fn scan(root: &Path) -> Result<Scanned, CacheError> {
    let mut scanned = Scanned {
        entries: Vec::new(),
        built_at: None,
    };
    if let Some(file) = files(root)?.first() {
        return Err(foreign(&root.join(file), "a file at the root"));
    }
    for sub in subdirs(root)? {
        let name = file_name(&sub);
        if name == AUTOTUNE {
            scan_store(&sub, &mut scanned.entries)?;
        } else if is_version(&name) {
            for workspace in subdirs(&sub)? {
                scan_workspace(root, &workspace, &name, &mut scanned)?;
            }
            if let Some(file) = files(&sub)?.first() {
                return Err(foreign(&sub.join(file), "a file in a version directory"));
            }
        } else if !ROOT_DIRS.contains(&name.as_str()) {
            return Err(foreign(&sub, "a directory FlashInfer does not write"));
        }
    }
    Ok(scanned)
}

/// One `<version>/<archs>/` workspace.
fn scan_workspace(
    root: &Path,
    workspace: &Path,
    version: &str,
    scanned: &mut Scanned,
) -> Result<(), CacheError> {
    let archs_name = file_name(workspace);
    let archs: Vec<Arch> = archs_name
        .split('_')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| {
            foreign(
                workspace,
                "not a directory of CUDA architectures (90a, 80_90a)",
            )
        })?;
    let [arch] = archs.as_slice() else {
        return Err(CacheError::Invalid {
            what: "FlashInfer workspace",
            reason: format!(
                "{} holds modules built for the CUDA architectures {} together: FlashInfer \
                 looks them up only in a process whose GPUs are exactly those; build one cache \
                 per architecture (FLASHINFER_CUDA_ARCH_LIST=\"9.0a\", say)",
                workspace.display(),
                archs
                    .iter()
                    .map(Arch::as_str)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
        });
    };
    for file in files(workspace)? {
        if file != JIT_LOG {
            return Err(foreign(&workspace.join(file), "a file in a workspace"));
        }
    }
    for sub in subdirs(workspace)? {
        match file_name(&sub).as_str() {
            CACHED_OPS => {
                for module in subdirs(&sub)? {
                    if file_name(&module) == TMP {
                        continue;
                    }
                    let (entry, built) = scan_module(root, &module, version, arch)?;
                    super::super::ninja::same_root(
                        &mut scanned.built_at,
                        built,
                        &module,
                        "FlashInfer cache build path",
                    )?;
                    scanned.entries.push(entry);
                }
                if let Some(file) = files(&sub)?.first() {
                    return Err(foreign(
                        &sub.join(file),
                        "a file where FlashInfer keeps modules",
                    ));
                }
            }
            GENERATED | AUTOTUNE => {}
            _ => return Err(foreign(&sub, "a directory FlashInfer does not write")),
        }
    }
    Ok(())
}

/// One `cached_ops/<name>/` module: its entry and the cache root its
/// `build.ninja` says it was built at.
fn scan_module(
    root: &Path,
    module: &Path,
    version: &str,
    arch: &Arch,
) -> Result<(FlashInferEntry, PathBuf), CacheError> {
    let name = file_name(module);
    let library = format!("{name}.so");
    let names = files(module)?;
    if let Some(sub) = subdirs(module)?.first() {
        return Err(foreign(sub, "a directory in a module"));
    }
    for file in &names {
        let known = [BUILD_NINJA, NINJA_LOG, NINJA_DEPS].contains(&file.as_str())
            || [".o", ".o.d", ".so", ".cubin"]
                .iter()
                .any(|ext| file.ends_with(ext));
        if !known {
            return Err(foreign(&module.join(file), "a file ninja does not build"));
        }
    }
    for needed in [library.as_str(), BUILD_NINJA, NINJA_LOG] {
        if !names.iter().any(|f| f == needed) {
            return Err(torn(
                module,
                format!("no {needed}: FlashInfer would build the module again"),
            ));
        }
    }
    let head = elf::whole_head(&module.join(&library), LIBRARY_HEAD, "a module library")?;
    let built = built_at(&module.join(BUILD_NINJA), &library)?;
    Ok((
        FlashInferEntry {
            key: key_below(root, module),
            part: Part::Module,
            name,
            flashinfer_version: version.to_string(),
            arch: Some(arch.clone()),
            cuda_version: elf::cudart_major(&head),
            gpu: None,
        },
        built,
    ))
}

/// The cache root a module's `build.ninja` says it was built at: its
/// `build <root>/<version>/<archs>/cached_ops/<name>/<name>.so: …` line,
/// four directories above the library.
fn built_at(ninja: &Path, library: &str) -> Result<PathBuf, CacheError> {
    let text = String::from_utf8_lossy(&read_head(ninja, MAX_DOCUMENT)?).into_owned();
    let output = text.lines().find_map(|line| {
        let target = line.strip_prefix("build ")?.split(':').next()?.trim();
        target
            .ends_with(&format!("/{library}"))
            .then(|| PathBuf::from(target))
    });
    output
        .as_deref()
        .and_then(|so| so.ancestors().nth(5))
        .filter(|root| root.is_absolute())
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            torn(
                ninja,
                format!("it names no absolute build of {library}: not FlashInfer's build.ninja"),
            )
        })
}

/// `autotune/`: its `v2/<environment>/` stores.
fn scan_store(autotune: &Path, entries: &mut Vec<FlashInferEntry>) -> Result<(), CacheError> {
    if let Some(file) = files(autotune)?.first() {
        return Err(foreign(&autotune.join(file), "a file in autotune/"));
    }
    for schema in subdirs(autotune)? {
        if file_name(&schema) != SCHEMA {
            return Err(foreign(
                &schema,
                "an autotune schema gkm does not read (v2)",
            ));
        }
        for env in subdirs(&schema)? {
            scan_environment(autotune, &env, entries)?;
        }
    }
    Ok(())
}

/// What a store's `manifest.json` records of its environment.
#[derive(serde::Deserialize)]
struct Environment {
    #[serde(default)]
    flashinfer_version: Option<String>,
    #[serde(default)]
    cuda_version: Option<String>,
    #[serde(default)]
    gpu: Option<String>,
}

/// What a store entry holds that gkm reads.
#[derive(serde::Deserialize)]
struct StoreEntry {
    key: String,
    #[allow(dead_code)]
    runner: String,
}

/// One `v2/<environment>/` store: its tuned operations.
fn scan_environment(
    autotune: &Path,
    env: &Path,
    entries: &mut Vec<FlashInferEntry>,
) -> Result<(), CacheError> {
    let manifest_path = env.join(STORE_MANIFEST);
    let environment: Environment = read_json(&manifest_path)?;
    for file in files(env)? {
        if file != STORE_MANIFEST && !is_tuning_temp(&file) {
            return Err(foreign(&env.join(file), "a file in an autotune store"));
        }
    }
    for sub in subdirs(env)? {
        if file_name(&sub) != ENTRIES {
            return Err(foreign(&sub, "a directory in an autotune store"));
        }
        for file in files(&sub)? {
            if is_tuning_temp(&file) {
                continue;
            }
            let path = sub.join(&file);
            if !file.ends_with(".json") {
                return Err(foreign(&path, "not a store entry (<operation hash>.json)"));
            }
            let entry: StoreEntry = read_json(&path)?;
            let below = path
                .strip_prefix(autotune.parent().unwrap_or(autotune))
                .unwrap_or(&path);
            entries.push(FlashInferEntry {
                key: below.to_string_lossy().replace('\\', "/"),
                part: Part::Tuning,
                name: entry.key,
                flashinfer_version: environment.flashinfer_version.clone().unwrap_or_default(),
                arch: None,
                cuda_version: environment.cuda_version.clone(),
                gpu: environment.gpu.clone(),
            });
        }
    }
    Ok(())
}

/// A store document, parsed; one that does not parse is torn.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, CacheError> {
    if !path.is_file() {
        return Err(torn(path, "missing: the store writes it first"));
    }
    let bytes = read_head(path, MAX_DOCUMENT)?;
    serde_json::from_slice(&bytes).map_err(|e| torn(path, format!("it does not read: {e}")))
}

/// Whether `name` is one of the store's temporary files.
pub(crate) fn is_tuning_temp(name: &str) -> bool {
    name.starts_with(TUNING_TEMP.0) && name.ends_with(TUNING_TEMP.1)
}

/// A FlashInfer version directory's name (`0.7.4`, `0.7.2.post1`).
fn is_version(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_digit()) && name.contains('.')
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, super::FlashInfer.title(), what, EXPECTED)
}
