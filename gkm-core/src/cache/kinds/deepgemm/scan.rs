//! Scanning a DeepGEMM cache (`DG_JIT_CACHE_DIR`, by default
//! `~/.deep_gemm`; vLLM sets `$VLLM_CACHE_ROOT/deep_gemm`), laid out as
//! DeepGEMM 2.6 writes it (`csrc/jit/compiler.hpp`, `kernel_runtime.hpp`):
//!
//! - `<root>/cache/kernel.<name>.<digest>/`: one kernel (`Compiler::build`,
//!   compiler.hpp lines 105-107; the digest, 32 hex digits: [`super::key`]),
//!   holding `kernel.cu` (its source, lines 215-216 and 290-291) and
//!   `kernel.cubin`, and with `DG_JIT_DUMP_PTX`, `DG_JIT_DUMP_SASS` or
//!   `DG_JIT_DUMP_ASM` also `kernel.ptx` and `kernel.sass` (lines
//!   117-129). It is compiled in `tmp/<uuid>/` and renamed whole into
//!   place (lines 113-145): a kernel directory without `kernel.cu` or
//!   `kernel.cubin` is torn, and DeepGEMM stops on it ("Corrupted JIT cache
//!   directory", `KernelRuntime::check_validity`, kernel_runtime.hpp lines
//!   96-110) rather than compiling again.
//! - `<root>/tmp/`: the compile directories (`make_tmp_dir`, line 68):
//!   scratch.
//!
//! SGLang's proposed warm-up completion marker (sglang#32124) is not in a
//! release: a file DeepGEMM does not write is refused, naming it.

use std::path::Path;

use super::entry::DeepGemmEntry;
use crate::cache::elf;
use crate::cache::files::{file_name, files, subdirs, torn};
use crate::cache::{CacheError, Kind};
use crate::gpu::Arch;

/// What a DeepGEMM cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a DeepGEMM cache (DG_JIT_CACHE_DIR, ~/.deep_gemm): \
    cache/kernel.<name>.<32 hex digits>/ with kernel.cu and kernel.cubin, and tmp/";

pub(crate) const CACHE: &str = "cache";
pub(crate) const TMP: &str = "tmp";
pub(crate) const SOURCE: &str = "kernel.cu";
pub(crate) const CUBIN: &str = "kernel.cubin";
/// The files `DG_JIT_DUMP_*` adds.
const DUMPS: [&str; 2] = ["kernel.ptx", "kernel.sass"];
/// The prefix of a kernel directory's name.
const KERNEL_PREFIX: &str = "kernel.";
/// How much of a cubin is read for its ELF header.
const CUBIN_HEAD: u64 = 4096;

/// Whether `dir` is laid out as a DeepGEMM cache: it holds `cache/` with
/// at least one `kernel.<name>.<digest>/`.
pub(crate) fn recognise(dir: &Path) -> Result<bool, CacheError> {
    let cache = dir.join(CACHE);
    if !cache.is_dir() {
        return Ok(false);
    }
    Ok(subdirs(&cache)?
        .iter()
        .any(|k| file_name(k).starts_with(KERNEL_PREFIX)))
}

/// A kernel directory's name and digest, from `kernel.<name>.<digest>`.
pub(crate) fn name_and_digest(dir_name: &str) -> Option<(&str, &str)> {
    let (name, digest) = dir_name.strip_prefix(KERNEL_PREFIX)?.rsplit_once('.')?;
    let hex = digest.len() == 32
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (!name.is_empty() && hex).then_some((name, digest))
}

/// The entries of the DeepGEMM cache at `root` (recognised). A file or
/// directory DeepGEMM does not write or a torn kernel refuses it, naming
/// the path.
pub(crate) fn scan(root: &Path) -> Result<Vec<DeepGemmEntry>, CacheError> {
    if let Some(file) = files(root)?.first() {
        return Err(foreign(&root.join(file), "a file at the root"));
    }
    for sub in subdirs(root)? {
        if ![CACHE, TMP].contains(&file_name(&sub).as_str()) {
            return Err(foreign(&sub, "a directory DeepGEMM does not write"));
        }
    }
    let cache = root.join(CACHE);
    if let Some(file) = files(&cache)?.first() {
        return Err(foreign(
            &cache.join(file),
            "a file where DeepGEMM keeps kernels",
        ));
    }
    subdirs(&cache)?
        .iter()
        .map(|kernel| scan_kernel(kernel))
        .collect()
}

/// One `cache/kernel.<name>.<digest>/`.
fn scan_kernel(dir: &Path) -> Result<DeepGemmEntry, CacheError> {
    let dir_name = file_name(dir);
    let (name, digest) = name_and_digest(&dir_name).ok_or_else(|| {
        foreign(
            dir,
            "not a DeepGEMM kernel directory (kernel.<name>.<32 hex digits>)",
        )
    })?;
    if let Some(sub) = subdirs(dir)?.first() {
        return Err(foreign(sub, "a directory in a kernel directory"));
    }
    let names = files(dir)?;
    for file in &names {
        if ![SOURCE, CUBIN].contains(&file.as_str()) && !DUMPS.contains(&file.as_str()) {
            return Err(foreign(&dir.join(file), "a file DeepGEMM does not write"));
        }
    }
    for needed in [SOURCE, CUBIN] {
        if !names.iter().any(|f| f == needed) {
            return Err(torn(
                dir,
                format!(
                    "no {needed}: DeepGEMM stops on it (\"Corrupted JIT cache directory\") \
                     rather than compiling the kernel again"
                ),
            ));
        }
    }
    let cubin = dir.join(CUBIN);
    let head = elf::whole_head(&cubin, CUBIN_HEAD, "a kernel cubin")?;
    let sm = elf::cubin_sm(&head).map_err(|why| torn(&cubin, format!("a kernel cubin {why}")))?;
    let arch: Arch = format!("{sm}a").parse().map_err(|_| {
        torn(
            &cubin,
            format!("a kernel cubin for SM {sm}, which no GPU has"),
        )
    })?;
    Ok(DeepGemmEntry {
        key: format!("{CACHE}/{dir_name}"),
        name: name.to_string(),
        digest: digest.to_string(),
        arch,
        compiler: None,
        deepgemm_root: None,
    })
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, super::DeepGemm.title(), what, EXPECTED)
}
