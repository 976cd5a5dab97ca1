//! Scanning a CuTe DSL cache (`CUTE_DSL_CACHE_DIR`, by default
//! `$TMPDIR/<user>/cutlass_python_cache`), laid out as
//! `nvidia-cutlass-dsl` 4.8.1 writes it (`cutlass/base_dsl/cache_helpers.py`
//! and `compile_backend.py` of `nvidia-cutlass-dsl-libs-core`):
//!
//! - `<root>/cute_dsl_<hash>.mlir`: one compiled function
//!   (`dump_cache_to_path`, `save_ir`: `f"{dsl_name.lower()}_{fname}.mlir"`,
//!   the name the DSL loads, `load_cache_from_path`), its MLIR bytecode
//!   (magic `ML\xefR`) holding the compiled kernels' cubins, followed by the
//!   CRC32 of that bytecode in the machine's byte order (little-endian on
//!   the x86-64 and Arm machines it runs on)
//!   (`write_bytecode_with_crc32`; `read_bytecode_and_check_crc32` refuses a
//!   file whose CRC does not match, and the DSL compiles again). The hash
//!   is the SHA-256 of the DSL's version (its sources and libraries), the
//!   function's IR (which holds the source locations of the workload's
//!   Python), the settings that affect compiling (`CUTE_DSL_ARCH`, the
//!   path of the `libcute_dsl_runtime.so` it links) and the compile options
//!   (`get_module_hash`, `cutlass/base_dsl/dsl.py`);
//! - `<root>/tmp.pid_<pid>_<uuid>/`: where a file is written before its
//!   `os.replace` into place (`save_ir`);
//! - `<root>/pyir_class_facts/`: the DSL's cache of parsed source facts
//!   (`<digest>.v<format>.facts`, `pyir_class_facts.py`), rebuilt from the
//!   sources when missing.

use std::path::Path;

use super::entry::CuteDslEntry;
use crate::cache::elf;
use crate::cache::files::{file_name, files, read_head, subdirs, torn};
use crate::cache::{CacheError, Kind};
use crate::gpu::Arch;

/// What a CuTe DSL cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a CuTe DSL cache (CUTE_DSL_CACHE_DIR, \
    $TMPDIR/<user>/cutlass_python_cache): cute_dsl_<64 hex digits>.mlir files of \
    compiled functions";

/// The prefix and suffix of a compiled function's file.
const PREFIX: &str = "cute_dsl_";
const SUFFIX: &str = ".mlir";
/// The prefix of the directories a file is written in before its rename.
pub(crate) const TEMP_PREFIX: &str = "tmp.pid_";
/// The DSL's cache of parsed source facts.
pub(crate) const FACTS: &str = "pyir_class_facts";
/// MLIR bytecode's magic number.
const MAGIC: &[u8] = b"ML\xefR";
/// What the compiler options recorded in the file say of the architecture.
const ARCH_OPTION: &[u8] = b"-arch sm_";
/// How nvcc's banner, recorded in the file, names the toolkit.
const TOOLKIT: &[u8] = b"Cuda compilation tools, release ";
/// The largest file read (its bytes are all read, for its CRC32).
const MAX_FILE: u64 = 1 << 30;

/// Whether `dir` is laid out as a CuTe DSL cache: it holds a compiled
/// function's file.
pub(crate) fn recognise(dir: &Path) -> Result<bool, CacheError> {
    Ok(files(dir)?.iter().any(|f| function_hash(f).is_some()))
}

/// The compiled functions of the CuTe DSL cache at `root` (recognised). A
/// file or directory CuTe DSL does not write, or a torn file, refuse it,
/// naming the path.
pub(crate) fn scan(root: &Path) -> Result<Vec<CuteDslEntry>, CacheError> {
    for sub in subdirs(root)? {
        let name = file_name(&sub);
        if name != FACTS && !name.starts_with(TEMP_PREFIX) {
            return Err(foreign(&sub, "a directory CuTe DSL does not write"));
        }
    }
    files(root)?
        .into_iter()
        .map(|name| {
            let path = root.join(&name);
            if function_hash(&name).is_none() {
                return Err(foreign(
                    &path,
                    "not a compiled function's file (cute_dsl_<64 hex digits>.mlir)",
                ));
            }
            scan_function(&path, name)
        })
        .collect()
}

/// The hash of a compiled function's file named `name`.
fn function_hash(name: &str) -> Option<&str> {
    let hash = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let hex = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    hex.then_some(hash)
}

/// One `cute_dsl_<hash>.mlir`.
fn scan_function(path: &Path, name: String) -> Result<CuteDslEntry, CacheError> {
    let bytes = read_head(path, MAX_FILE + 1)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(CacheError::Invalid {
            what: "CuTe DSL compiled function",
            reason: format!(
                "{} is larger than {} bytes, more than gkm reads",
                path.display(),
                MAX_FILE
            ),
        });
    }
    let Some(split) = bytes.len().checked_sub(4) else {
        return Err(torn(
            path,
            "shorter than its CRC32: CuTe DSL would compile it again",
        ));
    };
    let (bytecode, crc) = bytes.split_at(split);
    if !bytecode.starts_with(MAGIC) {
        return Err(torn(
            path,
            "not MLIR bytecode: CuTe DSL would compile it again",
        ));
    }
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32fast::hash(bytecode) != crc {
        return Err(torn(
            path,
            "its CRC32 does not match its bytecode: CuTe DSL would compile it again",
        ));
    }
    let arch = recorded_arch(bytecode)
        .or_else(|| {
            let sms = elf::embedded_cubin_sms(bytecode).ok()?;
            sms.first()?.to_string().parse().ok()
        })
        .ok_or_else(|| {
            torn(
                path,
                "it names no architecture and holds no cubin gkm reads: gkm cannot say which \
                 GPUs it fits",
            )
        })?;
    Ok(CuteDslEntry {
        key: name,
        arch,
        cuda_version: after(bytecode, TOOLKIT, |b| b.is_ascii_digit() || b == b'.'),
    })
}

/// The architecture of the `-arch sm_90a` compiler option the file records.
fn recorded_arch(bytes: &[u8]) -> Option<Arch> {
    after(bytes, ARCH_OPTION, |b| b.is_ascii_alphanumeric())?
        .parse()
        .ok()
}

/// The characters that `keep` takes right after the first `needle` in
/// `bytes`, if any.
fn after(bytes: &[u8], needle: &[u8], keep: impl Fn(u8) -> bool) -> Option<String> {
    let at = bytes.windows(needle.len()).position(|w| w == needle)? + needle.len();
    let value: String = bytes[at..]
        .iter()
        .take_while(|b| keep(**b))
        .map(|b| char::from(*b))
        .collect();
    (!value.is_empty()).then_some(value)
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, super::CuteDsl.title(), what, EXPECTED)
}
