//! Scanning a vLLM `torch_compile_cache` (layouts: see the
//! [`cache`](crate::cache) module).

use std::fs::File;
use std::path::{Path, PathBuf};

use super::artefacts::{self, VllmArtefacts};
use super::{VllmCppKernel, VllmFacts, VllmKernel};
use crate::cache::files::{files, subdirs};
use crate::cache::kinds::inductor::{self, CppKernel};
use crate::cache::kinds::triton::TEMP_PREFIX;
use crate::cache::kinds::triton::scan as triton;
use crate::cache::{
    CacheEntry, CacheError, CacheKind, CacheManifest, Facts, TritonKernel, VllmFormat, blob,
};

/// What a vLLM cache directory is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "a vLLM cache: torch_compile_cache/<hash>/rank_<rank>_<dp_rank>/ \
    (the torch_compile_cache directory, its parent, or one <hash> directory)";

/// vLLM's name for its compile cache directory.
const COMPILE_CACHE_DIR: &str = "torch_compile_cache";

/// The directory `aot_compile` hash directories live in.
const AOT_DIR: &str = "torch_aot_compile";

/// The file an `aot_compile` rank directory holds the model in.
const AOT_MODEL: &str = "model";

/// The directory vLLM points `TORCHINDUCTOR_CACHE_DIR` at, in a hash
/// directory (AOT compile) or a rank directory: an Inductor tree.
const INDUCTOR_CACHE_DIR: &str = "inductor_cache";

/// Prefix of Inductor standalone artefacts.
const ARTIFACT_PREFIX: &str = "artifact_";

/// How deep below a hash directory kernels are looked for.
const MAX_DEPTH: usize = 12;

/// Which part of a vLLM cache a directory is.
enum Place {
    /// The cache root (`VLLM_CACHE_ROOT`), holding `torch_compile_cache/`.
    Root,
    /// `torch_compile_cache/` itself, or its `torch_aot_compile/` (`aot`).
    CompileCache { aot: bool },
    /// One hash directory, below `torch_aot_compile/` when `aot`.
    HashDir { aot: bool },
}

/// Which part of a vLLM cache `dir` is, if any.
fn place(dir: &Path) -> Result<Option<Place>, CacheError> {
    let is_aot_dir = |p: Option<&Path>| p.and_then(Path::file_name).is_some_and(|n| n == AOT_DIR);
    Ok(if dir.join(COMPILE_CACHE_DIR).is_dir() {
        Some(Place::Root)
    } else if is_compile_cache_dir(dir)? {
        Some(Place::CompileCache {
            aot: is_aot_dir(Some(dir)),
        })
    } else if has_rank_dirs(dir)? {
        Some(Place::HashDir {
            aot: is_aot_dir(dir.parent()),
        })
    } else {
        None
    })
}

/// Where `dir` sits below its vLLM cache root: empty for the root itself,
/// `torch_compile_cache` (or `torch_compile_cache/torch_aot_compile`) for
/// the compile cache directory, `torch_compile_cache/<hash>` (or
/// `torch_compile_cache/torch_aot_compile/<hash>`) for one hash directory.
/// `None` when `dir` is not laid out as a vLLM cache.
pub(crate) fn offset_from_root(dir: &Path) -> Result<Option<PathBuf>, CacheError> {
    let compile = Path::new(COMPILE_CACHE_DIR);
    let aot_dir = compile.join(AOT_DIR);
    let name = dir.file_name().map(PathBuf::from).unwrap_or_default();
    Ok(place(dir)?.map(|place| match place {
        Place::Root => PathBuf::new(),
        Place::CompileCache { aot: false } => compile.to_path_buf(),
        Place::CompileCache { aot: true } => aot_dir,
        Place::HashDir { aot: false } => compile.join(name),
        Place::HashDir { aot: true } => aot_dir.join(name),
    }))
}

/// The manifest of the vLLM cache at `dir`, or `None` when `dir` is not laid
/// out as one.
pub(crate) fn scan(dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
    let hash_dirs = match place(dir)? {
        Some(Place::Root) => {
            let nested = dir.join(COMPILE_CACHE_DIR);
            let found = hash_dirs(&nested)?;
            if found.is_empty() {
                return Err(CacheError::NotACache {
                    path: nested,
                    expected: EXPECTED.into(),
                });
            }
            found
        }
        Some(Place::CompileCache { .. }) => hash_dirs(dir)?,
        Some(Place::HashDir { aot }) => vec![(dir.to_path_buf(), aot)],
        None => return Ok(None),
    };
    let mut entries: Vec<CacheEntry> = Vec::new();
    let mut cpp = Vec::new();
    let mut formats = Vec::new();
    let mut records = Vec::new();
    for (hash_dir, aot) in hash_dirs {
        let found = scan_hash_dir(&hash_dir, aot)?;
        formats.push(found.format);
        entries.extend(found.kernels.into_iter().map(CacheEntry::new));
        cpp.extend(found.cpp);
        records.extend(Some(found.artefacts).filter(|a| !a.is_empty()));
    }
    inductor::cpp::kernels_isa(cpp.iter().map(|k| &k.kernel), &dir.display().to_string())?;
    entries.extend(cpp.into_iter().map(CacheEntry::new));
    let format = [
        VllmFormat::AotCompile,
        VllmFormat::Binary,
        VllmFormat::Triton,
    ]
    .into_iter()
    .find(|f| formats.contains(f));
    let facts = VllmFacts {
        format,
        artefacts: records,
    };
    Ok(Some(CacheManifest::of_kind(
        CacheKind::Vllm,
        entries,
        Facts::of(facts),
    )))
}

/// Whether `dir` is a `torch_compile_cache` directory: it holds
/// `torch_aot_compile/` or a hash directory with rank directories.
fn is_compile_cache_dir(dir: &Path) -> Result<bool, CacheError> {
    for sub in subdirs(dir)? {
        if sub.file_name().is_some_and(|n| n == AOT_DIR) || has_rank_dirs(&sub)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The hash directories of a `torch_compile_cache`, with whether they are
/// `aot_compile` ones; directories without rank directories are skipped.
fn hash_dirs(compile_cache: &Path) -> Result<Vec<(PathBuf, bool)>, CacheError> {
    let mut out = Vec::new();
    for sub in subdirs(compile_cache)? {
        if sub.file_name().is_some_and(|n| n == AOT_DIR) {
            for aot in subdirs(&sub)? {
                if has_rank_dirs(&aot)? {
                    out.push((aot, true));
                }
            }
        } else if has_rank_dirs(&sub)? {
            // `compile_cache` may be `torch_aot_compile` itself.
            let aot = compile_cache.file_name().is_some_and(|n| n == AOT_DIR);
            out.push((sub, aot));
        }
    }
    Ok(out)
}

/// Whether `dir` holds a `rank_<rank>_<dp_rank>` directory.
fn has_rank_dirs(dir: &Path) -> Result<bool, CacheError> {
    Ok(subdirs(dir)?.iter().any(|d| {
        d.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_rank_dir)
    }))
}

/// `rank_<digits>_<digits>`.
pub(crate) fn is_rank_dir(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("rank_") else {
        return false;
    };
    let mut parts = rest.split('_');
    let digits =
        |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    digits(parts.next()) && digits(parts.next()) && parts.next().is_none()
}

/// What one hash directory holds.
struct HashDir {
    /// Its layout.
    format: VllmFormat,
    /// Its Triton kernels.
    kernels: Vec<VllmKernel>,
    /// The C++ kernels of its `inductor_cache/` directories.
    cpp: Vec<VllmCppKernel>,
    /// Its artefact records.
    artefacts: VllmArtefacts,
}

/// The layout, kernels and artefact records of one hash directory.
fn scan_hash_dir(hash_dir: &Path, aot: bool) -> Result<HashDir, CacheError> {
    let vllm_hash = hash_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let mut walk = Walk {
        root: hash_dir,
        aot,
        artefacts: false,
        entries: Vec::new(),
        cpp: Vec::new(),
    };
    walk.dir(hash_dir, 0)?;
    let format = if aot {
        VllmFormat::AotCompile
    } else if walk.artefacts {
        VllmFormat::Binary
    } else {
        VllmFormat::Triton
    };
    let mut entries: Vec<VllmKernel> = walk
        .entries
        .into_iter()
        .map(|kernel| VllmKernel {
            kernel,
            vllm_hash: vllm_hash.clone(),
            cache_format: Some(format),
        })
        .collect();
    entries.sort();
    entries.dedup();
    let cpp = walk
        .cpp
        .into_iter()
        .map(|kernel| VllmCppKernel {
            vllm_hash: vllm_hash.clone(),
            kernel,
            cache_format: Some(format),
        })
        .collect();
    let records = artefacts::of_hash_dir(
        hash_dir,
        vllm_hash.as_deref().unwrap_or_default(),
        aot,
        |name| name.starts_with(ARTIFACT_PREFIX),
    )?;
    Ok(HashDir {
        format,
        kernels: entries,
        cpp,
        artefacts: records,
    })
}

/// A walk of one hash directory.
struct Walk<'a> {
    root: &'a Path,
    aot: bool,
    /// Whether an Inductor standalone artefact was seen.
    artefacts: bool,
    entries: Vec<TritonKernel>,
    /// The C++ kernels of its `inductor_cache/` directories, filed under
    /// their path below the hash directory.
    cpp: Vec<CppKernel>,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path, depth: usize) -> Result<(), CacheError> {
        self.entries.extend(triton::scan_key_dir(dir)?);
        for name in files(dir)? {
            let artefact = name.starts_with(ARTIFACT_PREFIX);
            self.artefacts |= artefact;
            if artefact || (self.aot && name == AOT_MODEL) {
                self.blob(&dir.join(name))?;
            }
        }
        if depth >= MAX_DEPTH {
            return Ok(());
        }
        for sub in subdirs(dir)? {
            let name = sub.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with(TEMP_PREFIX) {
                continue;
            }
            if name == INDUCTOR_CACHE_DIR {
                self.inductor(&sub)?;
                continue;
            }
            self.artefacts |= sub
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(ARTIFACT_PREFIX));
            self.dir(&sub, depth + 1)?;
        }
        Ok(())
    }

    /// An `inductor_cache/` directory, read by the Inductor kind's rules:
    /// its Triton kernels filed under their key directory (as in any Triton
    /// cache directory), its C++ kernels under their path below the hash
    /// directory.
    fn inductor(&mut self, dir: &Path) -> Result<(), CacheError> {
        let tree = inductor::scan_tree(dir)?;
        let below = self.key_of(dir);
        self.entries
            .extend(tree.triton.into_iter().map(|mut kernel| {
                if let Some(key) = kernel.dummy_key.rsplit('/').next() {
                    kernel.dummy_key = key.to_string();
                }
                kernel
            }));
        self.cpp.extend(tree.cpp.into_iter().map(|mut kernel| {
            kernel.key = format!("{below}/{}", kernel.key);
            kernel
        }));
        Ok(())
    }

    /// `path` below the hash directory, `/`-separated.
    fn key_of(&self, path: &Path) -> String {
        crate::cache::files::key_below(self.root, path)
    }

    /// Kernels bundled in a single-file artefact, filed under its path.
    fn blob(&mut self, path: &Path) -> Result<(), CacheError> {
        let io = |source| CacheError::Io {
            path: path.to_path_buf(),
            source,
        };
        let found = blob::kernels_in(File::open(path).map_err(io)?).map_err(io)?;
        let key = path
            .strip_prefix(self.root)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        self.entries.extend(found.into_iter().map(|mut e| {
            e.dummy_key.clone_from(&key);
            e
        }));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_dirs() {
        assert!(is_rank_dir("rank_0_0"));
        assert!(is_rank_dir("rank_12_3"));
        for bad in ["rank_0", "rank__0", "rank_0_0_0", "rank_a_0", "ranks_0_0"] {
            assert!(!is_rank_dir(bad), "{bad}");
        }
    }
}
