//! Scanning a PyTorch Inductor cache (`TORCHINDUCTOR_CACHE_DIR`, by default
//! `/tmp/torchinductor_<user>`), laid out as torch 2.11 writes it:
//!
//! - `fxgraph/<key[1:3]>/<key>/<entry>`: FX graph cache entries
//!   (`FxGraphCache._get_tmp_dir_for_key`, `torch/_inductor/codecache.py`);
//! - `aotautograd/<key>/<entry>`: AOTAutograd cache entries
//!   (`AOTAutogradCache._get_tmp_dir_for_key`,
//!   `torch/_functorch/_aot_autograd/autograd_cache.py`);
//! - `<hash[1:3]>/c<hash>.<ext>`: generated code (`get_path` and `write`,
//!   `codecache.py`): Python modules (`.py`), C++ kernels (`.cpp` compiled
//!   to `.so`, and the small programs Inductor builds to probe the CPU's
//!   ISA);
//! - `triton/<device>/<key>/`: Triton cache directories
//!   (`triton_cache_dir`, `torch/_inductor/runtime/cache_dir_utils.py`),
//!   scanned as Triton's, group files checked;
//! - `locks/`, and what other parts of torch keep under the same root
//!   (`dynamo/`, `cache/`, `gcc/`, `aoti_eager/`, `torch_cutlass/`,
//!   `unhashed_kernel_inputs/`, `precompiled_headers/`,
//!   `memoizer_cache.json`).
//!
//! FX graph and AOTAutograd entries are pickles: they are counted by file
//! name and never read. Anything else at the root is not Inductor's and
//! refuses the tree, naming it.

use std::path::Path;

use super::Kind;
use crate::cache::files::{file_name, files, subdirs};

pub mod cpp;

use crate::cache::kinds::triton::scan as triton;
use crate::cache::{CacheError, CacheKind, CacheManifest, Facts, TorchFacts, TritonKernel};
use crate::image_layout::KindLayout;
pub use cpp::CppKernel;

/// The Inductor kind.
pub struct Inductor;

impl CacheKind {
    /// A PyTorch Inductor cache (`TORCHINDUCTOR_CACHE_DIR`).
    #[allow(non_upper_case_globals)]
    pub const Inductor: CacheKind = CacheKind(&Inductor);
}

/// The PyTorch Inductor image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::Inductor,
    cache_dir: "io.inductor.cache",
    manifest_dir: "io.inductor.manifest",
    label_prefix: "cache.inductor.image",
};

impl Kind for Inductor {
    fn name(&self) -> &'static str {
        "inductor"
    }

    fn title(&self) -> &'static str {
        "an Inductor"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        EXPECTED
    }

    fn recognise(&self, dir: &Path) -> Result<bool, CacheError> {
        is_inductor_tree(dir)
    }

    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        if !is_inductor_tree(dir)? {
            return Ok(None);
        }
        let tree = scan_tree(dir)?;
        Ok(Some(CacheManifest::of_kind(
            CacheKind::Inductor,
            tree.triton,
            Facts::of(tree.facts),
        )))
    }

    fn scratch(&self, path: &str, is_dir: bool) -> Option<&'static str> {
        scratch(path, is_dir)
    }

    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        entry_of(path)
    }

    crate::cache::torch_facts::torch_kind_rules!();
}

/// What an Inductor cache is expected to hold, for error messages.
pub(crate) const EXPECTED: &str = "an Inductor cache (TORCHINDUCTOR_CACHE_DIR): fxgraph/, \
    aotautograd/, triton/<device>/, locks/ and two-character directories of generated code";

/// The FX graph cache directory.
pub const FXGRAPH: &str = "fxgraph";
/// The AOTAutograd cache directory.
pub const AOTAUTOGRAD: &str = "aotautograd";
/// The directory of per-device Triton caches.
pub const TRITON: &str = "triton";
/// Inductor's lock files.
const LOCKS: &str = "locks";

/// Other directories torch keeps under its cache root: kept in the image,
/// neither counted nor read.
const OTHER_DIRS: [&str; 7] = [
    "dynamo",
    "cache",
    "gcc",
    "aoti_eager",
    "torch_cutlass",
    "unhashed_kernel_inputs",
    "precompiled_headers",
];

/// Files torch keeps at the root of its cache.
const ROOT_FILES: [&str; 2] = ["memoizer_cache.json", "memoizer_cache.lock"];

/// Prefix of the directories Inductor's Triton bundler writes a kernel
/// into before moving it in place (`tmp.<uuid>`): not part of the cache.
const TEMP_PREFIX: &str = "tmp.";

/// Why an upper entry is an Inductor tree's scratch: Triton's temporaries,
/// and Inductor's locks (its `locks/` directory and `*.lock` files,
/// `memoizer_cache.lock`, FX graph entry locks).
pub(crate) fn scratch(path: &str, is_dir: bool) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    if let Some(why) = super::triton::scratch(path, is_dir) {
        Some(why)
    } else if is_dir && name == LOCKS {
        Some("a directory of lock files")
    } else if !is_dir && name.ends_with(".lock") {
        Some("a lock file")
    } else {
        None
    }
}

/// The entry a file below an Inductor tree is of: a generated code
/// file's stem in its two-character directory (`ab/cabc.py`, `ab/cabc.so`
/// and `ab/cabc.cpp` are one entry, `ab/cabc`), else the directory holding
/// it (an FX graph or AOTAutograd entry, a Triton kernel directory).
pub(crate) fn entry_of(path: &str) -> Option<&str> {
    let (dir, name) = path.rsplit_once('/')?;
    if dir.len() == 2 && !dir.contains('/') {
        let stem = name.split_once('.').map_or(name, |(stem, _)| stem);
        return Some(&path[..dir.len() + 1 + stem.len()]);
    }
    Some(dir)
}

/// What an Inductor tree holds: its Triton kernels (filed under
/// `triton/<device>/<key>`), its C++ libraries (filed under
/// `<code dir>/<file>`) and its entry counts.
pub(crate) struct InductorTree {
    /// The Triton kernels of `triton/<device>/<key>/`.
    pub(crate) triton: Vec<TritonKernel>,
    /// The C++ libraries of its generated code directories.
    pub(crate) cpp: Vec<CppKernel>,
    /// Its entries per part.
    pub(crate) facts: TorchFacts,
}

/// Whether `dir` is laid out as an Inductor cache: it holds `fxgraph/`,
/// `aotautograd/`, `locks/` or `triton/<device>/`.
pub fn is_inductor_tree(dir: &Path) -> Result<bool, CacheError> {
    for sub in subdirs(dir)? {
        let name = file_name(&sub);
        if [FXGRAPH, AOTAUTOGRAD, LOCKS].contains(&name.as_str()) {
            return Ok(true);
        }
        if name == TRITON && subdirs(&sub)?.iter().any(|d| is_device(&file_name(d))) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What the Inductor tree at `dir` holds (a directory known to be one:
/// [`is_inductor_tree`], or a `TORCHINDUCTOR_CACHE_DIR` another tool set).
/// A foreign entry at its root, a file where Inductor keeps directories, a
/// torn Triton group or a torn C++ library refuses it, naming it.
pub(crate) fn scan_tree(dir: &Path) -> Result<InductorTree, CacheError> {
    let mut facts = TorchFacts::default();
    let mut entries = Vec::new();
    let mut cpp = Vec::new();
    for name in files(dir)? {
        if !ROOT_FILES.contains(&name.as_str()) {
            return Err(foreign(&dir.join(&name), "a file at the root"));
        }
    }
    for sub in subdirs(dir)? {
        let name = file_name(&sub);
        match name.as_str() {
            FXGRAPH => facts.add(FXGRAPH, count_entries(&sub, 2)?),
            AOTAUTOGRAD => facts.add(AOTAUTOGRAD, count_entries(&sub, 1)?),
            TRITON => entries.extend(scan_triton(&sub)?),
            LOCKS => {}
            other if OTHER_DIRS.contains(&other) => {}
            other if is_code_dir(other) => {
                for file in files(&sub)? {
                    if file.ends_with(".so") {
                        facts.add("cpp", 1);
                        cpp.push(cpp::read(&sub.join(&file), format!("{other}/{file}"))?);
                    } else if file.ends_with(".py") {
                        facts.add("python", 1);
                    }
                }
            }
            _ => return Err(foreign(&sub, "a directory Inductor does not write")),
        }
    }
    facts.add(TRITON, entries.len() as u64);
    for part in [FXGRAPH, AOTAUTOGRAD, "cpp", "python"] {
        facts.add(part, 0);
    }
    Ok(InductorTree {
        triton: entries,
        cpp,
        facts,
    })
}

/// Entries of a cache directory whose entry files sit `depth` directories
/// below it (`fxgraph/<k[1:3]>/<key>/<entry>`: 2). A file above that
/// depth is not Inductor's.
fn count_entries(dir: &Path, depth: usize) -> Result<u64, CacheError> {
    if depth == 0 {
        return Ok(files(dir)?.len() as u64);
    }
    if let Some(file) = files(dir)?.first() {
        return Err(foreign(
            &dir.join(file),
            "a file where Inductor keeps key directories",
        ));
    }
    let mut n = 0;
    for sub in subdirs(dir)? {
        n += count_entries(&sub, depth - 1)?;
    }
    Ok(n)
}

/// The kernels of `triton/<device>/<key>/`, filed under
/// `triton/<device>/<key>`.
fn scan_triton(triton_dir: &Path) -> Result<Vec<TritonKernel>, CacheError> {
    let mut entries = Vec::new();
    for device in subdirs(triton_dir)? {
        let device_name = file_name(&device);
        if !is_device(&device_name) {
            return Err(foreign(&device, "not a device index directory of triton/"));
        }
        for key in subdirs(&device)? {
            let key_name = file_name(&key);
            if key_name.starts_with(TEMP_PREFIX) {
                continue;
            }
            for mut entry in triton::scan_key_dir(&key)? {
                entry.dummy_key = format!("{TRITON}/{device_name}/{key_name}");
                entries.push(entry);
            }
        }
    }
    Ok(entries)
}

/// A device index (`0`, `1`…).
fn is_device(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit())
}

/// Two lowercase letters or digits: where `get_path` files generated code
/// (`hash[1:3]` of a base32 hash).
fn is_code_dir(name: &str) -> bool {
    name.len() == 2
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn foreign(path: &Path, what: &str) -> CacheError {
    crate::cache::files::foreign(path, Inductor.title(), what, EXPECTED)
}
