//! Scanning a TileLang cache (`TILELANG_CACHE_DIR`, by default
//! `~/.tilelang/cache`), laid out as TileLang 0.1.15 writes it:
//!
//! - `<root>/<version>/<platform>-<machine>/kernels/<key>/`: one compiled
//!   kernel (`KernelCache`, `tilelang/cache/kernel_cache.py`: the version
//!   and host directories are `_get_cache_namespace`, the key a SHA-256 of
//!   the kernel's TIR, target, backend and options with TileLang's version
//!   and the machine, `_generate_key`). It holds `device_kernel.cu`,
//!   `host_kernel.cu`, `params.json`, the backend's library (`executable.so`
//!   for `tvm_ffi`, TileLang's default; `kernel_lib.so` for `cython` and
//!   `torch`; `kernel.cubin` and `kernel.py` for `nvrtc`; `kernel.py` and
//!   `launcher_lib.so` for `cutedsl`, with `.py` sources), optionally
//!   `resource_usage.json`, and `manifest.json`, the size and SHA-256 of
//!   every other file (`_write_manifest`). TileLang checks an entry against
//!   its manifest when it loads it and deletes and compiles again one that
//!   does not match (`_verify_cache_dir_integrity`): gkm refuses such an
//!   entry, naming it, since a pod would compile it.
//! - `<root>/<version>/<host>/autotuner/<key>/`: an autotuning result
//!   (`tilelang/autotuner/param.py`, `AutotuneResult.save_to_disk`):
//!   `best_config.json`, `function.pkl` (the function, pickled: loaded with
//!   cloudpickle, so it is code, as Inductor's pickles are),
//!   `latency.json`, optionally `out_idx.json`, and the kernel's sources,
//!   library and `params.json` as above. It has no manifest: a result
//!   without one of its files is torn.
//! - `<root>/<version>/cuda-binaries/<key>/`: a device binary
//!   (`CUDABinaryCache`, `tilelang/cache/binary_cache.py`):
//!   `kernel.<cubin|fatbin|ptx>` and `metadata.json` with its format tag,
//!   size and SHA-256, checked as TileLang checks it on load.
//! - `.staging/` below a version or host directory: where entries are
//!   written before their rename into place, scratch.
//!
//! `ascend-binaries/` (Ascend NPU code) is refused: gkm checks no NPU.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::entry::{Part, TileLangEntry};
use crate::cache::elf;
use crate::cache::files::{file_name, files, key_below, read_head, subdirs, torn};
use crate::cache::{CacheError, Kind};
use crate::digest::Digest;
use crate::gpu::Arch;

/// What a TileLang cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a TileLang cache (TILELANG_CACHE_DIR, ~/.tilelang/cache): \
    <version>/<platform>-<machine>/kernels/<key>/ (with TileLang's manifest.json), \
    <version>/<platform>-<machine>/autotuner/<key>/ and <version>/cuda-binaries/<key>/";

pub(crate) const KERNELS: &str = "kernels";
pub(crate) const AUTOTUNER: &str = "autotuner";
pub(crate) const CUDA_BINARIES: &str = "cuda-binaries";
pub(crate) const STAGING: &str = ".staging";
const ASCEND_BINARIES: &str = "ascend-binaries";
const MANIFEST: &str = "manifest.json";
const METADATA: &str = "metadata.json";
const PARAMS: &str = "params.json";
/// The format tag of a device binary's `metadata.json`.
const BINARY_FORMAT: &str = "tilelang.cuda-binary-cache.v1";
/// The formats a device binary is kept in (`kernel.<format>`).
const BINARY_FORMATS: [&str; 3] = ["cubin", "fatbin", "ptx"];
/// The files an autotuning result holds beside its kernel's.
const TUNING_FILES: [&str; 3] = ["best_config.json", "function.pkl", "latency.json"];
const TUNING_OPTIONAL: &str = "out_idx.json";
/// What TileLang writes beside an entry's listed files when the kernel
/// first runs or it records resource use.
const OPTIONAL: [&str; 2] = ["resource_usage.json", "launcher.cpp"];
/// The largest JSON document read.
const MAX_DOCUMENT: u64 = 1 << 20;
/// The largest library or binary read for its device code.
const MAX_LIBRARY: u64 = 512 << 20;

/// A TileLang execution backend, by the files its entries hold.
pub(crate) struct Backend {
    /// TileLang's name for it.
    pub(crate) name: &'static str,
    /// The library file a kernel of it is loaded from.
    pub(crate) library: &'static str,
    /// The other files it needs to load.
    pub(crate) also: &'static [&'static str],
    /// The extension of its device and host sources.
    pub(crate) sources: &'static str,
}

/// TileLang's backends (`jit/adapter/*/kernel_cache.py`), in the order an
/// entry is matched against them: a CuTe DSL entry also holds the
/// `kernel.cubin` an NVRTC one does, and is told apart by its launcher.
pub(crate) const BACKENDS: [Backend; 4] = [
    Backend {
        name: "cutedsl",
        library: "kernel.py",
        also: &["launcher_lib.so"],
        sources: "py",
    },
    Backend {
        name: "nvrtc",
        library: "kernel.cubin",
        also: &["kernel.py"],
        sources: "cu",
    },
    Backend {
        name: "tvm_ffi",
        library: "executable.so",
        also: &[],
        sources: "cu",
    },
    Backend {
        name: "cython",
        library: "kernel_lib.so",
        also: &[],
        sources: "cu",
    },
];

/// Whether `dir` is laid out as a TileLang cache: a version directory
/// holding `cuda-binaries/`, or a host directory with `kernels/` or
/// `autotuner/`.
pub(crate) fn recognise(dir: &Path) -> Result<bool, CacheError> {
    for version in subdirs(dir)? {
        if !is_version(&file_name(&version)) {
            continue;
        }
        if version.join(CUDA_BINARIES).is_dir() {
            return Ok(true);
        }
        for host in subdirs(&version)? {
            if is_host(&file_name(&host))
                && (host.join(KERNELS).is_dir() || host.join(AUTOTUNER).is_dir())
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// A version directory's name: TileLang's version with `+` written `_`
/// (`_format_version_namespace`).
fn is_version(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// A host directory's name: `<platform>-<machine>` (`linux-x86_64`).
fn is_host(name: &str) -> bool {
    name.split_once('-')
        .is_some_and(|(platform, machine)| !platform.is_empty() && !machine.is_empty())
}

/// The entries of the TileLang cache at `root` (recognised). A file or
/// directory TileLang does not write, or a torn entry, refuses it, naming
/// the path.
pub(crate) fn scan(root: &Path) -> Result<Vec<TileLangEntry>, CacheError> {
    if let Some(file) = files(root)?.first() {
        return Err(foreign(&root.join(file), "a file at the root"));
    }
    let mut entries = Vec::new();
    for version_dir in subdirs(root)? {
        let version = file_name(&version_dir);
        if !is_version(&version) {
            return Err(foreign(&version_dir, "not a TileLang version directory"));
        }
        if let Some(file) = files(&version_dir)?.first() {
            return Err(foreign(
                &version_dir.join(file),
                "a file in a version directory",
            ));
        }
        for sub in subdirs(&version_dir)? {
            let name = file_name(&sub);
            match name.as_str() {
                STAGING => {}
                CUDA_BINARIES => {
                    for dir in entry_dirs(&sub)? {
                        entries.push(scan_binary(root, &dir, &version)?);
                    }
                }
                ASCEND_BINARIES => {
                    return Err(foreign(
                        &sub,
                        "Ascend NPU binaries, which gkm checks against no device",
                    ));
                }
                host if is_host(host) => scan_host(root, &sub, &version, &mut entries)?,
                _ => return Err(foreign(&sub, "a directory TileLang does not write")),
            }
        }
    }
    Ok(entries)
}

/// A `<version>/<host>/` directory's kernels and tunings.
fn scan_host(
    root: &Path,
    dir: &Path,
    version: &str,
    entries: &mut Vec<TileLangEntry>,
) -> Result<(), CacheError> {
    if let Some(file) = files(dir)?.first() {
        return Err(foreign(&dir.join(file), "a file in a host directory"));
    }
    let host = file_name(dir);
    for sub in subdirs(dir)? {
        let part = match file_name(&sub).as_str() {
            STAGING => continue,
            KERNELS => Part::Kernel,
            AUTOTUNER => Part::Tuning,
            _ => return Err(foreign(&sub, "a directory TileLang does not write")),
        };
        for entry in entry_dirs(&sub)? {
            entries.push(scan_kernel(root, &entry, part, version, &host)?);
        }
    }
    Ok(())
}

/// The entry directories of `dir` (`kernels/`, `autotuner/`,
/// `cuda-binaries/`), refusing a file among them.
fn entry_dirs(dir: &Path) -> Result<Vec<std::path::PathBuf>, CacheError> {
    if let Some(file) = files(dir)?.first() {
        return Err(foreign(
            &dir.join(file),
            "a file where TileLang keeps entries",
        ));
    }
    subdirs(dir)
}

/// One kernel (`kernels/<key>/`) or autotuning result (`autotuner/<key>/`).
fn scan_kernel(
    root: &Path,
    dir: &Path,
    part: Part,
    version: &str,
    host: &str,
) -> Result<TileLangEntry, CacheError> {
    if let Some(sub) = subdirs(dir)?.first() {
        return Err(foreign(sub, "a directory in an entry"));
    }
    let names = files(dir)?;
    let has = |name: &str| names.iter().any(|f| f == name);
    let backend = BACKENDS
        .iter()
        .find(|b| has(b.library) && b.also.iter().all(|f| has(f)))
        .ok_or_else(|| {
            torn(
                dir,
                "no kernel library of any TileLang backend (executable.so, kernel_lib.so, \
                 kernel.cubin with kernel.py, kernel.py with launcher_lib.so): TileLang would \
                 compile it again",
            )
        })?;
    let device = format!("device_kernel.{}", backend.sources);
    let host_source = format!("host_kernel.{}", backend.sources);
    let mut needed: Vec<&str> = vec![&device, &host_source, PARAMS, backend.library];
    needed.extend(backend.also);
    match part {
        Part::Kernel => needed.push(MANIFEST),
        Part::Tuning => needed.extend(TUNING_FILES),
        Part::Binary => {}
    }
    if let Some(missing) = needed.iter().find(|f| !has(f)) {
        return Err(torn(
            dir,
            format!("no {missing}: TileLang would compile it again"),
        ));
    }
    // The cubin a CuTe DSL kernel saves when it first runs.
    let late_cubin = (backend.name == "cutedsl").then_some("kernel.cubin");
    for name in &names {
        let known = needed.contains(&name.as_str())
            || OPTIONAL.contains(&name.as_str())
            || late_cubin == Some(name.as_str())
            || (part == Part::Tuning && name == TUNING_OPTIONAL);
        if !known {
            return Err(foreign(&dir.join(name), "a file TileLang does not write"));
        }
    }
    // A kernel's files are each read once: checked against its manifest,
    // then its device code read for its architectures.
    let mut read = if part == Part::Kernel {
        check_manifest(dir, &names, late_cubin)?
    } else {
        BTreeMap::new()
    };
    let device_code = if backend.name == "cutedsl" {
        late_cubin.filter(|c| has(c))
    } else {
        Some(backend.library)
    };
    let archs = match device_code {
        Some(name) => {
            let file = dir.join(name);
            let bytes = match read.remove(name) {
                Some(bytes) => bytes,
                None => read_whole(&file)?,
            };
            archs_of(&file, &bytes)?
        }
        None => Vec::new(),
    };
    Ok(TileLangEntry {
        key: key_below(root, dir),
        part,
        tilelang_version: version.to_string(),
        host: Some(host.to_string()),
        backend: backend.name.to_string(),
        archs,
    })
}

/// TileLang's `manifest.json` of a kernel.
#[derive(Deserialize)]
struct Manifest {
    version: u32,
    files: BTreeMap<String, Listed>,
}

/// A file as a manifest lists it.
#[derive(Deserialize)]
struct Listed {
    size: u64,
    sha256: String,
}

/// Checks a kernel's files against its `manifest.json`: each it lists is
/// there with its size and digest, and it lists every file but itself and
/// the file its backend adds later (`late`: a CuTe DSL kernel's cubin).
/// The contents of the files it lists, by name.
fn check_manifest(
    dir: &Path,
    names: &[String],
    late: Option<&str>,
) -> Result<BTreeMap<String, Vec<u8>>, CacheError> {
    let path = dir.join(MANIFEST);
    let manifest: Manifest = serde_json::from_slice(&read_head(&path, MAX_DOCUMENT)?)
        .map_err(|e| torn(&path, format!("not TileLang's kernel manifest: {e}")))?;
    if manifest.version != 1 {
        return Err(torn(
            &path,
            format!(
                "a kernel manifest of version {}, which gkm does not read (1)",
                manifest.version
            ),
        ));
    }
    let mut read = BTreeMap::new();
    for (name, listed) in &manifest.files {
        let file = dir.join(name);
        if name.contains('/') || !names.contains(name) {
            return Err(torn(
                &path,
                format!(
                    "it lists {name}, which the entry does not hold: TileLang would compile it again"
                ),
            ));
        }
        let bytes = read_whole(&file)?;
        as_recorded(
            &file,
            &bytes,
            (listed.size, &listed.sha256),
            "its manifest",
            "TileLang would delete the entry and compile it again",
        )?;
        read.insert(name.clone(), bytes);
    }
    let unlisted = names.iter().find(|n| {
        n.as_str() != MANIFEST && Some(n.as_str()) != late && !manifest.files.contains_key(*n)
    });
    if let Some(name) = unlisted {
        return Err(foreign(
            &dir.join(name),
            "a file its TileLang manifest does not list",
        ));
    }
    Ok(read)
}

/// A device binary, `cuda-binaries/<key>/`.
fn scan_binary(root: &Path, dir: &Path, version: &str) -> Result<TileLangEntry, CacheError> {
    if let Some(sub) = subdirs(dir)?.first() {
        return Err(foreign(sub, "a directory in a device binary's entry"));
    }
    let names = files(dir)?;
    let binaries: Vec<&String> = names.iter().filter(|n| n.as_str() != METADATA).collect();
    let [binary] = binaries.as_slice() else {
        return Err(torn(
            dir,
            format!(
                "{} binaries beside metadata.json, where TileLang writes one, kernel.<cubin|fatbin|ptx>",
                binaries.len()
            ),
        ));
    };
    let format = binary
        .strip_prefix("kernel.")
        .filter(|f| BINARY_FORMATS.contains(f))
        .ok_or_else(|| foreign(&dir.join(binary), "a file TileLang does not write"))?;
    if !names.iter().any(|n| n == METADATA) {
        return Err(torn(
            dir,
            "no metadata.json: TileLang would compile it again",
        ));
    }
    #[derive(Deserialize)]
    struct Metadata {
        format: String,
        size: u64,
        sha256: String,
    }
    let meta_path = dir.join(METADATA);
    let meta: Metadata = serde_json::from_slice(&read_head(&meta_path, MAX_DOCUMENT)?)
        .map_err(|e| torn(&meta_path, format!("not TileLang's binary metadata: {e}")))?;
    if meta.format != BINARY_FORMAT {
        return Err(torn(
            &meta_path,
            format!(
                "format {:?}, where TileLang {version} reads {BINARY_FORMAT:?}: it would compile it again",
                meta.format
            ),
        ));
    }
    let file = dir.join(binary);
    let bytes = read_whole(&file)?;
    as_recorded(
        &file,
        &bytes,
        (meta.size, &meta.sha256),
        "its metadata.json",
        "TileLang would compile it again",
    )?;
    let archs = if format == "ptx" {
        ptx_arch(&bytes).into_iter().collect()
    } else {
        archs_of(&file, &bytes)?
    };
    Ok(TileLangEntry {
        key: key_below(root, dir),
        part: Part::Binary,
        tilelang_version: version.to_string(),
        host: None,
        backend: format.to_string(),
        archs,
    })
}

/// The whole of `file`, at most [`MAX_LIBRARY`] bytes: a larger one is
/// refused, naming its size.
fn read_whole(file: &Path) -> Result<Vec<u8>, CacheError> {
    let bytes = read_head(file, MAX_LIBRARY + 1)?;
    if bytes.len() as u64 > MAX_LIBRARY {
        return Err(torn(
            file,
            format!("more than the {MAX_LIBRARY} bytes gkm reads of a file of a TileLang entry"),
        ));
    }
    Ok(bytes)
}

/// Checks `bytes`, the contents of `file`, against the size and SHA-256
/// its `record` (TileLang's manifest or metadata) says; `then` is what
/// TileLang does with a file that does not match.
fn as_recorded(
    file: &Path,
    bytes: &[u8],
    (size, sha256): (u64, &str),
    record: &str,
    then: &str,
) -> Result<(), CacheError> {
    let digest = Digest::of(bytes);
    if bytes.len() as u64 == size && digest.hex() == sha256 {
        return Ok(());
    }
    Err(torn(
        file,
        format!(
            "{} bytes of SHA-256 {}, where {record} says {size} bytes of {sha256}: {then}",
            bytes.len(),
            digest.hex()
        ),
    ))
}

/// The CUDA architectures of the cubins `file` (its contents `bytes`) is
/// or embeds.
fn archs_of(file: &Path, bytes: &[u8]) -> Result<Vec<Arch>, CacheError> {
    let name = file_name(file);
    let whole_elf = name.ends_with(".so") || name.ends_with(".cubin");
    if let Some(why) = elf::not_whole(bytes, bytes.len() as u64).filter(|_| whole_elf) {
        return Err(torn(file, format!("a kernel library {why}")));
    }
    let sms = elf::embedded_cubin_sms(bytes)
        .map_err(|why| torn(file, format!("a kernel library {why}")))?;
    sms.into_iter()
        .map(|sm| {
            sm.to_string()
                .parse()
                .map_err(|_| torn(file, format!("a cubin for SM {sm}, which no GPU has")))
        })
        .collect()
}

/// The architecture a PTX file's `.target sm_XY` names.
fn ptx_arch(bytes: &[u8]) -> Option<Arch> {
    String::from_utf8_lossy(bytes).lines().find_map(|line| {
        let target = line.trim().strip_prefix(".target")?.trim();
        target.split(',').next()?.trim().parse().ok()
    })
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, super::TileLang.title(), what, EXPECTED)
}
