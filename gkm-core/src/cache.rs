//! GPU kernel caches: their kinds, the manifest of compiled kernels a cache
//! holds, and its summary (the distinct targets).
//!
//! The JSON forms here are the image format shared with GKM/MCV:
//! `io.triton.manifest/manifest.json` is a [`CacheManifest`], and the
//! `cache.triton.image/summary` label is a [`Summary`]. Reading them
//! ([`CacheManifest::from_json`], [`Summary::from_label`],
//! [`CacheEntry::from_kernel_json`]) is pure and never panics.
//!
//! Each kind is a plug-in: a [`Kind`] in its own module of [`kinds`],
//! listed in [`kinds::REGISTRY`]; [`scan`], the image layouts and the
//! manifest's JSON ask the registered kinds.
//!
//! # Layouts [`scan`] reads
//!
//! **Triton** (`~/.triton/cache`, `TRITON_CACHE_DIR`): one directory per
//! cache key (base32 or hex). A compiled kernel's directory holds its
//! metadata `<kernel>.json` (`hash`, `target{backend,arch,warp_size}`,
//! `num_warps`, `num_stages`, `ptx_version`, `triton_version`…), the group
//! file `__grp__<kernel>.json` and the artefacts (`.ttir`, `.ttgir`,
//! `.llir`, `.ptx`, `.cubin`, `.amdgcn`, `.hsaco`…). Other directories hold
//! compiled launcher and driver libraries (`__triton_launcher.so`,
//! `cuda_utils.so`) or autotuning results (`<fn>.autotune.json`): they are
//! not kernels and are neither listed nor counted.
//!
//! **vLLM** (`<VLLM_CACHE_ROOT>/torch_compile_cache/`): one directory per
//! compilation hash, one `rank_<rank>_<dp_rank>/` per worker below it, in
//! one of three layouts ([`VllmFormat`]), possibly mixed in one cache:
//! - `triton`: `inductor_cache/` and `triton_cache/` (Triton cache
//!   directories) in the rank directory, next to `vllm_compile_cache.py`;
//! - `binary`: Inductor standalone artefacts,
//!   `rank_*/<prefix>/artifact_compile_range_*` (older: `artifact_shape_*`)
//!   next to `cache_key_factors.json`; a `binary` artefact is one file that
//!   bundles its Triton kernels, an `unpacked` one a directory whose
//!   `triton/` subdirectories are Triton cache directories;
//! - `aot_compile`: `torch_compile_cache/torch_aot_compile/<hash>/rank_*/model`,
//!   the whole compiled model in one file, possibly with a shared
//!   `inductor_cache/` next to the rank directories.
//!
//! Each `inductor_cache/` is read as an Inductor tree (below): its C++
//! kernel libraries are entries for the CPU ([`VllmCppKernel`]).
//! Kernels are found in Triton cache directories anywhere below a hash
//! directory and, in single-file artefacts (`artifact_*`, `model`), by the
//! kernel metadata JSON they embed verbatim (Triton writes it starting with
//! `{"hash": `); such a kernel is filed under the artefact's path.
//!
//! **Inductor** (`TORCHINDUCTOR_CACHE_DIR`, `/tmp/torchinductor_<user>`),
//! what `torch.compile` writes: `fxgraph/<k[1:3]>/<key>/<entry>` and
//! `aotautograd/<key>/<entry>` (pickles, counted, never read),
//! generated code in two-character directories (`<h[1:3]>/c<hash>.py`,
//! `.cpp`, `.so`…), Triton cache directories `triton/<device>/<key>/`
//! (scanned as Triton's) and `locks/`. See [`inductor`].
//!
//! **Mega-Cache**: the blob `torch.compiler.save_cache_artifacts()`
//! returns, read as PyTorch's container (checksum, version, artefact type
//! and key of each entry) and searched for the Triton kernel metadata its
//! entries embed; its pickled contents are never unpickled. A directory
//! holding only such blobs is a Mega-Cache cache. See
//! [`megacache`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::{Arch, Backend};

mod blob;
mod declared;
mod elf;
mod entry;
mod files;
mod group;
mod manifest_json;
mod torch_facts;

pub mod kinds;

pub use declared::{Declaration, Declared};
pub use entry::{AnyFacts, CacheEntry, EntryFacts, Facts, OrdFacts};
pub use group::{build_path, relocate_group, relocated_groups};
pub use kinds::inductor::CppKernel;
pub use kinds::triton::kernel::{TritonKernel, ptx_isa_version};
pub use kinds::vllm::artefacts::{AotModel, BinaryArtefacts, VllmArtefacts};
pub use kinds::vllm::{VllmCppKernel, VllmFacts, VllmKernel};
pub use kinds::{CpuFit, Fit, Kind, inductor, megacache};
pub use torch_facts::{
    CPU_ISAS, DECLARED_CPU_ISA_LABEL, DECLARED_TORCH_VERSION_LABEL, ENTRY_COUNTS_LABEL,
    TRITON_VERSION_LABEL, TorchFacts,
};

/// What produced a cache: one of the registered [`Kind`]s
/// ([`kinds::REGISTRY`]), named by a constant (`CacheKind::Triton`,
/// `CacheKind::Vllm`, `CacheKind::Inductor`, `CacheKind::MegaCache`,
/// `CacheKind::FlashInfer`, `CacheKind::DeepGemm`, `CacheKind::TileLang`,
/// `CacheKind::TvmFfi`, `CacheKind::CuteDsl`), each
/// defined in its kind's module.
///
/// Two kinds are equal when their names are. Its JSON form is the name.
#[derive(Clone, Copy)]
pub struct CacheKind(&'static dyn Kind);

impl CacheKind {
    /// The name manifests and `gkm inspect` use: `triton`, `vllm`,
    /// `inductor`, `megacache`, `flashinfer`, `deepgemm`, `tilelang`,
    /// `tvm-ffi`, `cutedsl`.
    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    /// The kind's rules.
    pub fn rules(self) -> &'static dyn Kind {
        self.0
    }

    /// Whether caches of this kind are PyTorch's (Inductor, Mega-Cache),
    /// which carry [`TorchFacts`] (see [`Kind::torch_facts`]).
    pub fn is_torch(self) -> bool {
        self.0.torch_facts()
    }

    /// The fit facts an image of this kind states in its `summary` and its
    /// kind's labels (see [`Kind::fit_of_labels`]).
    pub fn fit_of_labels(self, summary: Summary, labels: &BTreeMap<String, String>) -> Fit {
        self.0.fit_of_labels(summary, labels)
    }

    /// Where `dir` sits below the root this kind's images lay out (see
    /// [`Kind::offset_from_root`]).
    pub fn offset_from_root(self, dir: &Path) -> Result<Option<PathBuf>, CacheError> {
        self.0.offset_from_root(dir)
    }
}

impl PartialEq for CacheKind {
    fn eq(&self, other: &CacheKind) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for CacheKind {}

impl std::hash::Hash for CacheKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl std::fmt::Debug for CacheKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CacheKind({:?})", self.as_str())
    }
}

impl std::fmt::Display for CacheKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CacheKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CacheKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CacheKind, D::Error> {
        let name = String::deserialize(d)?;
        kinds::by_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown cache kind {name:?}: expected one of {}",
                kind_names()
            ))
        })
    }
}

/// The registered kinds' names, quoted and comma-separated.
fn kind_names() -> String {
    let names: Vec<String> = kinds::REGISTRY
        .iter()
        .map(|k| format!("{:?}", k.as_str()))
        .collect();
    names.join(", ")
}

/// The layout of a vLLM cache (see [the layouts](self#layouts-scan-reads)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VllmFormat {
    /// Inductor's and Triton's caches (`inductor_cache/`, `triton_cache/`)
    /// in each rank directory.
    Triton,
    /// Inductor standalone artefacts (`artifact_compile_range_*`), single
    /// files or unpacked directories.
    Binary,
    /// `torch_aot_compile/<hash>/rank_*/model`: the whole compiled model per
    /// rank.
    AotCompile,
}

impl VllmFormat {
    /// The name MCV and the manifest use: `triton`, `binary`, `aot_compile`.
    pub fn as_str(self) -> &'static str {
        match self {
            VllmFormat::Triton => "triton",
            VllmFormat::Binary => "binary",
            VllmFormat::AotCompile => "aot_compile",
        }
    }
}

impl std::fmt::Display for VllmFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The compile target of one kernel: backend, architecture and warp size.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Target {
    /// Compiler backend.
    #[serde(deserialize_with = "backend_from_str")]
    pub backend: Backend,
    /// Architecture.
    pub arch: Arch,
    /// Threads per warp.
    pub warp_size: u32,
    /// PTX ISA version the kernel was built with (CUDA only), e.g. 84 for 8.4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_version: Option<u32>,
    /// CUDA toolkit version, when the cache records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// Triton version that compiled the kernels, when the cache records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triton_version: Option<String>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.backend, self.arch, self.warp_size)
    }
}

/// Every entry of a cache (`manifest.json`): its kind, its entries, and
/// what the kind records beside them ([`Facts`]).
///
/// Generic: what a manifest holds is read through its kind's rules
/// ([`Kind`]); an entry's kind-specific fields through
/// [`CacheEntry::facts`] and the manifest's through [`Facts::get`].
///
/// Serialised as GKM/MCV do, the entries under the kind's name (its
/// [`Kind::write_manifest`]): `{"triton": [entries]}` for a Triton cache
/// and, for a vLLM one, `{"vllm": [groups], "format": …}` where each group
/// is `{"vllmHash", "cacheFormat", "triton": [entries], "binary": [...],
/// "aot_compile": [...]}`: the kernels of one `torch_compile_cache/<hash>`
/// directory in one layout, with MCV's records of its artefacts
/// ([`BinaryArtefacts`] in `binary` groups, [`AotModel`] in `aot_compile`
/// ones) and, under `"cpp"`, the C++ kernels of its `inductor_cache/`
/// directories ([`CppKernel`]). Reading also accepts a flat list of entries under `"vllm"`.
/// PyTorch's kinds (gkm's own, not MCV's) list their Triton kernels under
/// `"inductor"` or `"megacache"`, next to `"torch"`: [`TorchFacts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheManifest {
    /// The kind of cache.
    pub kind: CacheKind,
    /// Its entries.
    pub entries: Vec<CacheEntry>,
    /// What its kind records beside the entries: [`VllmFacts`] for vLLM,
    /// [`TorchFacts`] for Inductor and Mega-Cache, none for Triton.
    pub facts: Facts,
}

impl CacheManifest {
    /// Which kind of cache this manifest describes.
    pub fn kind(&self) -> CacheKind {
        self.kind
    }

    /// All entries, whatever the kind.
    pub fn entries(&self) -> &[CacheEntry] {
        &self.entries
    }

    /// A manifest of `kind` listing `entries`, sorted, with the facts its
    /// kind records.
    pub fn of_kind(
        kind: CacheKind,
        entries: impl IntoIterator<Item = impl Into<CacheEntry>>,
        facts: Facts,
    ) -> Self {
        let mut manifest = CacheManifest {
            kind,
            entries: entries.into_iter().map(Into::into).collect(),
            facts,
        };
        manifest.normalise();
        manifest
    }

    /// The facts its kind records, as the kind's type `F`, when they are.
    pub fn facts<F: AnyFacts>(&self) -> Option<&F> {
        self.facts.get()
    }

    /// Records what the builder declares about the cache scanned from
    /// `tree` (the directory given to [`scan`]): facts the tree does not
    /// state (for PyTorch's kinds, the torch version and CPU ISA; for
    /// DeepGEMM, the install its keys name, checked against every key; see
    /// [`Kind::declare`]). Refused for options that describe another kind,
    /// for values that are not well formed, and for a kind that cannot be
    /// built without a declaration it lacks, naming them.
    pub fn declare(&mut self, tree: &Path, declared: &Declared) -> Result<(), CacheError> {
        let rules = self.kind.rules();
        let inner = tree.join(rules.layout().cache_dir);
        let tree = if inner.is_dir() {
            inner
        } else {
            tree.to_path_buf()
        };
        rules.declare(&tree, self, declared)
    }

    /// The distinct versions of `framework` (`triton`) its entries record,
    /// sorted.
    pub fn versions_of(&self, framework: &str) -> Vec<String> {
        let versions: BTreeSet<String> = self
            .entries()
            .iter()
            .flat_map(CacheEntry::versions)
            .filter(|(name, _)| *name == framework)
            .map(|(_, version)| version)
            .collect();
        versions.into_iter().collect()
    }

    /// The distinct Triton versions its kernels record, sorted.
    pub fn triton_versions(&self) -> Vec<String> {
        self.versions_of("triton")
    }

    /// What it contributes to whether it fits a node, by its kind
    /// ([`Kind::fit`]): GPU targets, CPU ISA, framework versions.
    pub fn fit(&self) -> Fit {
        self.kind.rules().fit(self)
    }

    /// The distinct targets of its entries.
    pub fn summary(&self) -> Summary {
        Summary::new(self.entries().iter().filter_map(CacheEntry::target))
    }

    /// The summary label as its kind's images carry it
    /// ([`Kind::summary_label`]): the [`summary`](Self::summary) as compact
    /// JSON (where, in a vLLM cache holding Inductor standalone artefacts,
    /// CUDA architectures are named `sm_XY`, as MCV writes them). Either
    /// form reads back with [`Summary::from_label`].
    pub fn summary_label(&self) -> String {
        self.kind.rules().summary_label(self)
    }

    /// Read a `manifest.json`. Never panics, whatever the bytes.
    ///
    /// ```
    /// use gkm_core::cache::{CacheKind, CacheManifest};
    /// let m = CacheManifest::from_json(br#"{"triton":[{"hash":"ab","dummy_key":"K",
    ///     "ptx_version":84,"num_stages":3,"num_warps":4,"debug":false,
    ///     "backend":"cuda","arch":"75","warp_size":32}]}"#).unwrap();
    /// assert_eq!(m.kind(), CacheKind::Triton);
    /// assert_eq!(m.summary().to_string(), "cuda/75/32");
    /// assert_eq!(m.entries()[0].key(), "K");
    /// assert!(CacheManifest::from_json(b"{\"triton\": 1}").is_err());
    /// let twice = CacheManifest::from_json(br#"{"triton": [], "triton": []}"#).unwrap_err();
    /// assert!(twice.to_string().contains("\"triton\" is listed twice"), "{twice}");
    /// ```
    pub fn from_json(bytes: &[u8]) -> Result<CacheManifest, CacheError> {
        let invalid = |reason: String| CacheError::Invalid {
            what: "manifest.json",
            reason,
        };
        let doc: Members = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        let mut listed = Vec::new();
        for (name, value) in &doc.0 {
            let Some(kind) = kinds::by_name(name) else {
                continue;
            };
            let entries = kind
                .rules()
                .read_entries(value.clone())
                .map_err(|e| invalid(format!("{name}: {e}")))?;
            listed.extend(entries.map(|entries| (kind, entries)));
        }
        if listed.len() > 1 {
            return Err(invalid(format!(
                "lists kernels of more than one of {}; expected one kind",
                kind_names()
            )));
        }
        let (kind, entries) = listed.pop().unwrap_or((CacheKind::Triton, Vec::new()));
        let facts = kind
            .rules()
            .read_facts(&doc.0, bytes)
            .map_err(|e| invalid(e.to_string()))?;
        let mut manifest = CacheManifest {
            kind,
            entries,
            facts,
        };
        manifest.normalise();
        Ok(manifest)
    }

    /// The `manifest.json` bytes: pretty-printed, entries in a fixed order.
    pub fn to_json(&self) -> Vec<u8> {
        let mut normalised = self.clone();
        normalised.normalise();
        self.kind.rules().write_manifest(&normalised)
    }

    /// Sort the entries (and the kind's facts) so equal caches give equal
    /// manifests.
    fn normalise(&mut self) {
        self.entries.sort();
        self.kind.rules().normalise(&mut self.facts);
    }
}

/// The members of `manifest.json` (a kind's entries under its name, the
/// facts it records beside them), each named once: a document naming a
/// member twice is refused, naming it, rather than read as whichever came
/// last.
pub(crate) struct Members(pub(crate) std::collections::BTreeMap<String, serde_json::Value>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Members, A::Error> {
                let mut members = std::collections::BTreeMap::new();
                while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                    if members.contains_key(&name) {
                        return Err(serde::de::Error::custom(format!(
                            "member {name:?} is listed twice"
                        )));
                    }
                    members.insert(name, value);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The distinct targets of a cache (`cache.triton.image/summary`).
///
/// Its JSON form is the image label: `{"targets":[{"backend","arch",
/// "warp_size","ptx_version"?,"cuda_version"?,"triton_version"?}]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Sorted, without duplicates.
    #[serde(default, deserialize_with = "manifest_json::null_as_empty")]
    pub targets: Vec<Target>,
}

impl Summary {
    /// A summary of these targets, sorted and without duplicates.
    pub fn new(targets: impl IntoIterator<Item = Target>) -> Summary {
        let targets: BTreeSet<Target> = targets.into_iter().collect();
        Summary {
            targets: targets.into_iter().collect(),
        }
    }

    /// Read a summary label. Never panics, whatever the string.
    ///
    /// ```
    /// use gkm_core::cache::Summary;
    /// let s = Summary::from_label(r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64},
    ///     {"backend":"cuda","arch":"sm_75","warp_size":32}]}"#).unwrap();
    /// assert_eq!(s.to_string(), "cuda/75/32, hip/gfx90a/64");
    /// assert_eq!(Summary::from_label(&s.to_label()).unwrap(), s);
    /// assert!(Summary::from_label("cuda/75/32").is_err());
    /// ```
    pub fn from_label(label: &str) -> Result<Summary, CacheError> {
        let summary: Summary = serde_json::from_str(label).map_err(|e| CacheError::Invalid {
            what: "summary label",
            reason: e.to_string(),
        })?;
        Ok(Summary::new(summary.targets))
    }

    /// The label value: compact JSON.
    pub fn to_label(&self) -> String {
        // Serialising these types cannot fail: every map key is a string.
        serde_json::to_string(self).unwrap_or_default()
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, t) in self.targets.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// Reads a backend the way [`Backend::from_str`](std::str::FromStr) does, so
/// MCV's `rocm` reads as `hip`.
pub(crate) fn backend_from_str<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Backend, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// Why a directory could not be read as a cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// What was being read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The directory is not a cache gkm knows.
    #[error("{path} is not a kernel cache: expected {expected}")]
    NotACache {
        /// The directory.
        path: PathBuf,
        /// What gkm looked for.
        expected: String,
    },
    /// A document (kernel metadata, `manifest.json`, a summary label) could
    /// not be parsed.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was being parsed.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A Triton group file names a child that is missing, empty, or
    /// recorded outside the group's directory: the tree is torn.
    #[error("{group}: entry {entry}: {reason}")]
    TornGroup {
        /// The group file (`__grp__<kernel>.json`).
        group: PathBuf,
        /// The child entry, as the group names it.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file or directory inside a cache tree that the tool that writes
    /// such caches does not write (or a blob that is not one of its).
    #[error("{path} is not part of {kind} cache: {reason}")]
    Foreign {
        /// The entry.
        path: PathBuf,
        /// The kind of cache, with its article (`an Inductor`).
        kind: &'static str,
        /// Why it is not.
        reason: String,
    },
    /// An entry a tool left half-written (an empty or truncated compiled
    /// library): the tool would load it and fail rather than build it again.
    #[error("{path} is a torn entry: {reason}")]
    TornEntry {
        /// The entry's file or directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A kernel's metadata could not be parsed.
    #[error("{path}: invalid kernel metadata: {reason}")]
    BadMetadata {
        /// The metadata file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Where the vLLM cache directory `dir` sits below its cache root
/// (`VLLM_CACHE_ROOT`, which holds `torch_compile_cache/`): empty for the
/// root, `torch_compile_cache` for the compile cache directory,
/// `torch_compile_cache/<hash>` (or `…/torch_aot_compile/<hash>`) for one
/// hash directory; `None` when `dir` is not a vLLM cache. Images lay a vLLM
/// cache out from its root, as MCV does, so whichever of these directories
/// an image is built from, it extracts to a cache root.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let hash = dir.path().join("torch_compile_cache/d4ec7c2a7d");
/// std::fs::create_dir_all(hash.join("rank_0_0"))?;
/// use gkm_core::cache::vllm_offset_from_root as offset;
/// assert_eq!(offset(dir.path())?.unwrap(), std::path::Path::new(""));
/// assert_eq!(offset(&hash)?.unwrap(), std::path::Path::new("torch_compile_cache/d4ec7c2a7d"));
/// assert_eq!(offset(&hash.join("rank_0_0"))?, None);
/// # Ok(()) }
/// ```
pub fn vllm_offset_from_root(dir: &Path) -> Result<Option<PathBuf>, CacheError> {
    CacheKind::Vllm.offset_from_root(dir)
}

/// The kind whose tree `dir` is, by its shape ([`Kind::recognise`]): the
/// first registered kind that recognises it, Triton when none does.
pub fn kind_of_tree(dir: &Path) -> Result<CacheKind, CacheError> {
    for kind in kinds::scan_order() {
        if kind.rules().recognise(dir)? {
            return Ok(kind);
        }
    }
    Ok(CacheKind::Triton)
}

/// The files of the tree at `dir` that bind to an absolute path, as they
/// read with the tree moved to `to`, by the rules of the tree's kind
/// ([`kind_of_tree`], [`Kind::relocated`]): each file's path below `dir`
/// and its new bytes. Empty when nothing binds, or the tree was built at
/// `to`.
pub fn relocated_tree(dir: &Path, to: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
    kind_of_tree(dir)?.rules().relocated(dir, to)
}

/// The path the cache in `dir` was built at, as an image lays it out: the
/// Triton cache directory (`TRITON_CACHE_DIR`), or a vLLM cache's root
/// (`VLLM_CACHE_ROOT`) whichever of its directories `dir` is (see
/// [`vllm_offset_from_root`]). Read by the rules of the tree's kind
/// ([`kind_of_tree`], [`Kind::build_path`]: for every kind gkm knows, its
/// Triton group files, [`build_path`]); `None` when nothing in the tree
/// binds to a path. A torn group, or groups built at different paths, are
/// refused naming the group.
pub fn tree_build_path(dir: &Path) -> Result<Option<PathBuf>, CacheError> {
    let kind = kind_of_tree(dir)?;
    let Some(built) = kind.rules().build_path(dir)? else {
        return Ok(None);
    };
    let Some(offset) = kind.offset_from_root(dir)? else {
        return Ok(Some(built));
    };
    let depth = offset.components().count();
    let root = built
        .ancestors()
        .nth(depth)
        .filter(|root| root.join(&offset) == built);
    root.map(|r| Some(r.to_path_buf()))
        .ok_or_else(|| CacheError::Invalid {
            what: "vLLM cache build path",
            reason: format!(
                "{} was built at {}, which does not end in {}",
                dir.display(),
                built.display(),
                offset.display()
            ),
        })
}

/// Scan a cache directory (Triton, vLLM, Inductor or Mega-Cache) into its
/// manifest; `dir` may also be one Mega-Cache blob.
///
/// See [the layouts](self#layouts-scan-reads). `dir` may be:
/// - a Triton cache (`~/.triton/cache`): hash directories holding compiled
///   kernels;
/// - a vLLM cache: the `torch_compile_cache` directory, its parent (vLLM's
///   cache root), or one `torch_compile_cache/<hash>` directory;
/// - an extracted GKM/MCV image: a directory holding `io.triton.cache/` or
///   `io.vllm.cache/`.
///
/// Entries are sorted, so the same tree always gives the same manifest.
/// Files that are not kernels (launcher and driver libraries, autotuning
/// results, Inductor's generated Python) are not listed. Symbolic links
/// inside the cache are not followed.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let key = dir.path().join("5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ");
/// std::fs::create_dir(&key)?;
/// std::fs::write(key.join("add_kernel.json"), br#"{"hash":"edbe","name":"add_kernel",
///     "target":{"backend":"cuda","arch":75,"warp_size":32},"num_warps":4,"num_stages":3}"#)?;
/// std::fs::write(key.join("__grp__add_kernel.json"), br#"{"child_paths": {}}"#)?;
/// std::fs::write(key.join("add_kernel.ptx"), b".version 8.4\n.target sm_75\n")?;
///
/// let manifest = gkm_core::cache::scan(dir.path())?;
/// assert_eq!(manifest.entries().len(), 1);
/// let kernel = manifest.entries()[0].kernel().expect("a Triton kernel");
/// assert_eq!(kernel.ptx_version, Some(84));
/// assert_eq!(manifest.summary().to_string(), "cuda/75/32");
///
/// let err = gkm_core::cache::scan(&key).unwrap_err();
/// assert!(err.to_string().contains("is not a kernel cache"));
/// # Ok(()) }
/// ```
pub fn scan(dir: &Path) -> Result<CacheManifest, CacheError> {
    let meta = std::fs::metadata(dir).map_err(|source| CacheError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.is_file() {
        return scan_file(dir);
    }
    if !meta.is_dir() {
        return Err(CacheError::NotACache {
            path: dir.to_path_buf(),
            expected: "a directory".into(),
        });
    }
    for layout in crate::image_layout::ALL {
        let inner = dir.join(layout.cache_dir);
        if inner.is_dir() {
            return scan(&inner);
        }
    }
    for kind in kinds::scan_order() {
        if let Some(manifest) = kind.rules().scan(dir)? {
            return Ok(manifest);
        }
    }
    Err(CacheError::NotACache {
        path: dir.to_path_buf(),
        expected: or_list(kinds::REGISTRY.iter().map(|k| k.rules().expected())),
    })
}

/// A single file as a cache: the first registered kind whose caches may be
/// one file and that takes it.
fn scan_file(path: &Path) -> Result<CacheManifest, CacheError> {
    let mut reasons = Vec::new();
    let mut expected = Vec::new();
    for kind in kinds::scan_order() {
        match kind.rules().scan_file(path) {
            None => continue,
            Some(Ok(manifest)) => return Ok(manifest),
            Some(Err(CacheError::Foreign { reason, .. })) => {
                reasons.push(reason);
                expected.push(kind.rules().expected());
            }
            Some(Err(other)) => return Err(other),
        }
    }
    Err(CacheError::NotACache {
        path: path.to_path_buf(),
        expected: format!(
            "a directory or {} ({})",
            or_list(expected),
            reasons.join("; ")
        ),
    })
}

/// `a or b`, or `a; b; c; or d` where each item has commas of its own.
fn or_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<&str> = items.into_iter().collect();
    match items.split_last() {
        None => String::new(),
        Some((last, [])) => (*last).to_string(),
        Some((last, [only])) => format!("{only} or {last}"),
        // Each kind's description has commas and "or"s of its own.
        Some((last, rest)) => format!("{}; or {last}", rest.join("; ")),
    }
}
