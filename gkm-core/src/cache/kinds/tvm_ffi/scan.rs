//! Scanning a TVM-FFI cache (`TVM_FFI_CACHE_DIR`, by default
//! `~/.cache/tvm-ffi`), laid out as `apache-tvm-ffi` 0.1.12 writes it
//! (`tvm_ffi/cpp/extension.py`):
//!
//! - `<root>/<name>_<hash>/`: one module's ninja build directory
//!   (`build_inline`, lines 939-957, and `_build_impl`, lines 689-704: the
//!   hash is the first 16 hex digits of a SHA-256 of the sources, the
//!   exported functions and the extra flags, `_hash_sources`, lines
//!   68-120; not of the CUDA architectures, the compilers or any path);
//! - in it: `main.cpp` and `cuda.cu`, the inline sources
//!   (`build_inline`, lines 960-967, written only when they differ), `lock`
//!   (the `FileLock` every build holds, line 963), `build.ninja`
//!   (`_generate_ninja_build`, lines 338-578, rewritten whenever it differs,
//!   line 736: it names the sources by absolute path, `-I` the installed
//!   `tvm_ffi/include`, `-L` its `lib/`, `nvcc = $CUDA_HOME/bin/nvcc` and
//!   the `-gencode` flags of `TVM_FFI_CUDA_ARCH_LIST`, lines 164-208), the
//!   objects `c_<i>.o`, `cpp_<i>.o`, `cuda_<i>.o` (with `unified*.o` and
//!   `<name>.cubin` when cubins are embedded, lines 544-571), the `default`
//!   target (`<name>.so`, or the object `build_inline(output=…)` names), and
//!   ninja's `.ninja_log` and `.ninja_deps` (`build_ninja` runs `ninja` in
//!   the directory, lines 586-611); a compile's `$out.d` depfile lives
//!   until ninja reads it.
//!
//! A module is found again only when ninja finds it up to date: every load
//! writes `build.ninja` for the current paths and flags and runs ninja,
//! which rebuilds an output whose command line its `.ninja_log` does not
//! hold. So a module without its `default` target, with a torn one, or
//! without `build.ninja` or a `.ninja_log` that lists the target is torn.

use std::path::{Path, PathBuf};

use super::entry::{ModuleBackend, TvmFfiEntry};
use crate::cache::elf;
use crate::cache::files::{file_name, files, read_head, subdirs, torn};
use crate::cache::{CacheError, Kind};
use crate::gpu::Arch;

/// What a TVM-FFI cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a TVM-FFI cache (TVM_FFI_CACHE_DIR, \
    ~/.cache/tvm-ffi): <module>_<16 hex digits>/ ninja build directories, each \
    with the build.ninja tvm_ffi.cpp writes and the module it builds";

const BUILD_NINJA: &str = "build.ninja";
const NINJA_LOG: &str = ".ninja_log";
const NINJA_DEPS: &str = ".ninja_deps";
/// The lock every build holds.
pub(crate) const LOCK: &str = "lock";
/// The files an inline build writes its sources to.
const INLINE_SOURCES: [&str; 2] = ["main.cpp", "cuda.cu"];
/// What a module's `build.ninja` links or compiles against.
const TVM_FFI_INCLUDE: &str = "/tvm_ffi/include";
/// The rules that compile a source (`c_compile`, `compile`,
/// `compile_cuda`).
const COMPILE_RULES: [&str; 3] = ["c_compile", "compile", "compile_cuda"];

/// How much of a module's library is read for its ELF header and the CUDA
/// runtime it links (its dynamic section sits near the start).
const LIBRARY_HEAD: u64 = 1 << 20;
/// The largest `build.ninja` or `.ninja_log` read.
const MAX_DOCUMENT: u64 = 16 << 20;

/// What the scan found: the modules, and the cache root the inline ones
/// were built at (where their `build.ninja` names their sources).
pub(crate) struct Scanned {
    pub(crate) entries: Vec<TvmFfiEntry>,
    pub(crate) built_at: Option<PathBuf>,
}

/// Whether `dir` is laid out as a TVM-FFI cache: one of its directories is
/// named `<name>_<16 hex digits>` and holds a `build.ninja` that builds
/// against `tvm_ffi`.
pub(crate) fn recognise(dir: &Path) -> Result<bool, CacheError> {
    for sub in subdirs(dir)? {
        if module_name(&file_name(&sub)).is_none() {
            continue;
        }
        let ninja = sub.join(BUILD_NINJA);
        if ninja.is_file() && Ninja::read(&ninja)?.builds_against_tvm_ffi() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The modules of the TVM-FFI cache at `root` (recognised). A file or
/// directory TVM-FFI does not write, a torn module, or inline modules
/// built at different roots refuse it, naming the path.
pub(crate) fn scan(root: &Path) -> Result<Scanned, CacheError> {
    let mut scanned = Scanned {
        entries: Vec::new(),
        built_at: None,
    };
    if let Some(file) = files(root)?.first() {
        return Err(foreign(&root.join(file), "a file at the root"));
    }
    for module in subdirs(root)? {
        let dir_name = file_name(&module);
        let Some(name) = module_name(&dir_name) else {
            return Err(foreign(
                &module,
                "not a module's directory (<name>_<16 hex digits>)",
            ));
        };
        let (entry, built) = scan_module(&module, &dir_name, name)?;
        if let Some(built) = built {
            super::super::ninja::same_root(
                &mut scanned.built_at,
                built,
                &module,
                "TVM-FFI cache build path",
            )?;
        }
        scanned.entries.push(entry);
    }
    Ok(scanned)
}

/// The module name of a directory named `<name>_<16 hex digits>`.
fn module_name(dir_name: &str) -> Option<&str> {
    let (name, hash) = dir_name.rsplit_once('_')?;
    let hex = hash.len() == 16 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (hex && !name.is_empty()).then_some(name)
}

/// One `<name>_<hash>/` module: its entry and, for an inline build, the
/// cache root its `build.ninja` names its sources below.
fn scan_module(
    module: &Path,
    dir_name: &str,
    name: &str,
) -> Result<(TvmFfiEntry, Option<PathBuf>), CacheError> {
    if let Some(sub) = subdirs(module)?.first() {
        return Err(foreign(sub, "a directory in a module"));
    }
    let names = files(module)?;
    for file in &names {
        let known = [BUILD_NINJA, NINJA_LOG, NINJA_DEPS, LOCK].contains(&file.as_str())
            || INLINE_SOURCES.contains(&file.as_str())
            || [".o", ".o.d", ".so", ".cubin"]
                .iter()
                .any(|ext| file.ends_with(ext));
        if !known {
            return Err(foreign(
                &module.join(file),
                "a file tvm_ffi.cpp's build does not write",
            ));
        }
    }
    for needed in [BUILD_NINJA, NINJA_LOG] {
        if !names.iter().any(|f| f == needed) {
            return Err(torn(
                module,
                format!("no {needed}: TVM-FFI would build the module again"),
            ));
        }
    }
    let ninja_path = module.join(BUILD_NINJA);
    let ninja = Ninja::read(&ninja_path)?;
    if !ninja.builds_against_tvm_ffi() {
        return Err(torn(
            &ninja_path,
            "it builds against no tvm_ffi install: not tvm_ffi.cpp's build.ninja",
        ));
    }
    let Some(output) = ninja.default_target() else {
        return Err(torn(&ninja_path, "it names no default target"));
    };
    let library = module.join(output);
    if !names.iter().any(|f| f == output) {
        return Err(torn(
            &library,
            "missing: TVM-FFI would build the module again",
        ));
    }
    let head = elf::whole_head(&library, LIBRARY_HEAD, "a module")?;
    let logged = String::from_utf8_lossy(&read_head(&module.join(NINJA_LOG), MAX_DOCUMENT)?)
        .lines()
        .any(|line| line.split('\t').nth(3) == Some(output));
    if !logged {
        return Err(torn(
            &module.join(NINJA_LOG),
            format!("it does not list {output}: ninja would build it again"),
        ));
    }

    let mut built = None;
    let mut sources = Vec::new();
    for source in ninja.sources() {
        let path = Path::new(source);
        match path.parent() {
            Some(parent) if parent.file_name() == Some(dir_name.as_ref()) => {
                if !module.join(file_name(path)).is_file() {
                    return Err(torn(
                        module,
                        format!("no {}: its build.ninja compiles it", file_name(path)),
                    ));
                }
                built = parent.parent().map(Path::to_path_buf);
            }
            _ => sources.push(source.to_string()),
        }
    }
    if let Some(root) = built.as_ref().filter(|root| !root.is_absolute()) {
        return Err(torn(
            &ninja_path,
            format!(
                "it names its sources below {}, not an absolute path",
                root.display()
            ),
        ));
    }
    let backend = ninja.backend();
    let archs = ninja.archs(&ninja_path)?;
    if backend != ModuleBackend::Cpu && archs.is_empty() {
        return Err(torn(
            &ninja_path,
            "it compiles device code for no architecture it names: gkm cannot say which GPUs \
             it fits",
        ));
    }
    Ok((
        TvmFfiEntry {
            key: dir_name.to_string(),
            name: name.to_string(),
            backend,
            archs,
            cuda_version: (backend == ModuleBackend::Cuda)
                .then(|| elf::cudart_major(&head))
                .flatten(),
            install: ninja.install(),
            sources,
        },
        built,
    ))
}

/// A module's `build.ninja`, as `_generate_ninja_build` writes it: its
/// variables (`cxxflags = …`), `build OUT: RULE IN…` lines and `default`.
struct Ninja {
    text: String,
}

impl Ninja {
    fn read(path: &Path) -> Result<Ninja, CacheError> {
        Ok(Ninja {
            text: String::from_utf8_lossy(&read_head(path, MAX_DOCUMENT)?).into_owned(),
        })
    }

    /// The value of the top-level variable `name`.
    fn variable(&self, name: &str) -> Option<&str> {
        self.text.lines().find_map(|line| {
            let (key, value) = line.split_once(" = ")?;
            (key == name).then_some(value.trim())
        })
    }

    /// Whether it compiles against a `tvm_ffi` install or links
    /// `libtvm_ffi`.
    fn builds_against_tvm_ffi(&self) -> bool {
        self.variable("ldflags")
            .is_some_and(|flags| flags.split_whitespace().any(|f| f == "-ltvm_ffi"))
            || self.install().is_some()
    }

    /// The `tvm_ffi` install the C++ flags include (`-I<dir>/include`).
    fn install(&self) -> Option<String> {
        let flags = self.variable("cxxflags").or(self.variable("cflags"))?;
        flags.split_whitespace().find_map(|flag| {
            let include = flag.strip_prefix("-I")?;
            include.ends_with(TVM_FFI_INCLUDE).then(|| {
                include
                    .strip_suffix("/include")
                    .unwrap_or(include)
                    .replace("$:", ":")
            })
        })
    }

    /// Its `default` target.
    fn default_target(&self) -> Option<&str> {
        self.text
            .lines()
            .find_map(|line| line.strip_prefix("default "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && !t.contains('/'))
    }

    /// The `(rule, inputs)` of its `build` lines.
    fn builds(&self) -> impl Iterator<Item = (&str, &str)> {
        self.text.lines().filter_map(|line| {
            let (_, rest) = line.strip_prefix("build ")?.split_once(": ")?;
            rest.split_once(' ')
        })
    }

    /// The sources it compiles (the inputs of its compile rules).
    fn sources(&self) -> Vec<&str> {
        self.builds()
            .filter(|(rule, _)| COMPILE_RULES.contains(rule))
            .flat_map(|(_, inputs)| inputs.split_whitespace())
            .collect()
    }

    /// What its sources were compiled for: CUDA or HIP when it compiles one
    /// with `compile_cuda` (HIP when its `nvcc` is `hipcc`).
    fn backend(&self) -> ModuleBackend {
        if !self.builds().any(|(rule, _)| rule == "compile_cuda") {
            ModuleBackend::Cpu
        } else if self.variable("nvcc").is_some_and(|n| n.ends_with("hipcc")) {
            ModuleBackend::Hip
        } else {
            ModuleBackend::Cuda
        }
    }

    /// The GPU architectures its device flags name, in order, each once:
    /// `code=sm_90a` of a `-gencode`, `-arch=sm_90`, `--offload-arch=gfx90a`.
    fn archs(&self, path: &Path) -> Result<Vec<Arch>, CacheError> {
        let mut archs: Vec<Arch> = Vec::new();
        let flags = self.variable("cuda_cflags").unwrap_or_default();
        for flag in flags.split_whitespace() {
            let named: Vec<&str> = if let Some(gencode) = flag.strip_prefix("-gencode=") {
                gencode
                    .split([',', '[', ']', '='])
                    .filter(|part| part.starts_with("sm_"))
                    .collect()
            } else if let Some(one) = flag
                .strip_prefix("--offload-arch=")
                .or(flag.strip_prefix("-arch="))
            {
                vec![one]
            } else {
                Vec::new()
            };
            for name in named {
                let arch: Arch = name.parse().map_err(|_| {
                    torn(
                        path,
                        format!("its device flags name {name}, which is no GPU architecture"),
                    )
                })?;
                if !archs.contains(&arch) {
                    archs.push(arch);
                }
            }
        }
        Ok(archs)
    }
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, super::TvmFfi.title(), what, EXPECTED)
}
