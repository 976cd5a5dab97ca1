//! The vLLM kind: a vLLM `torch_compile_cache` (layouts: see the
//! [`cache`](crate::cache) module), its kernels filed by hash directory
//! and layout, with MCV's records of its artefacts.
//!
//! Its own beyond Triton's rules: its images lay out the cache root
//! whichever of its directories is built ([`Kind::offset_from_root`]), its
//! `manifest.json` lists kernels in MCV's groups ([`Kind::read_entries`],
//! [`Kind::write_manifest`]), and its summary label names CUDA
//! architectures `sm_XY` when it holds Inductor standalone artefacts.
//!
//! Each `inductor_cache/` below a hash directory (vLLM's
//! `TORCHINDUCTOR_CACHE_DIR`) is an Inductor tree, read by the Inductor
//! kind's rules ([`inductor`](super::inductor)): its Triton kernels are
//! entries as in any Triton cache directory, its C++ kernel libraries
//! entries for the CPU ([`VllmCppKernel`], no GPU target), a foreign file in
//! it or a torn entry refuses the tree, and its locks are scratch. A cache
//! of C++ kernels only (vLLM on the CPU) fits by the CPU ISA its kernels
//! record ([`Kind::fit`], labels `cpp-kernel-count` and `cpu-isa`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::inductor::CppKernel;
use super::{CpuFit, Fit, Kind};
use crate::cache::{
    CacheEntry, CacheError, CacheKind, CacheManifest, EntryFacts, Facts, Summary, Target,
    TritonKernel, VllmArtefacts, VllmFormat,
};
use crate::image_layout::KindLayout;

pub(crate) mod artefacts;
mod labels;
mod manifest_json;
pub(crate) mod scan;

pub use labels::{KSERVE_PREFIX, KSERVE_VLLM_CACHE_ROOT, format_label, formats, kserve_labels};

/// The vLLM kind.
pub struct Vllm;

impl CacheKind {
    /// A vLLM `torch_compile_cache`.
    #[allow(non_upper_case_globals)]
    pub const Vllm: CacheKind = CacheKind(&Vllm);
}

/// The vLLM image layout.
pub const LAYOUT: KindLayout = KindLayout {
    kind: CacheKind::Vllm,
    cache_dir: "io.vllm.cache",
    manifest_dir: "io.vllm.manifest",
    label_prefix: "cache.vllm.image",
};

/// An entry of a vLLM cache: a Triton kernel, filed by the
/// `torch_compile_cache/<hash>` directory it belongs to and the layout of
/// that directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VllmKernel {
    /// The kernel.
    #[serde(flatten)]
    pub kernel: TritonKernel,
    /// The `torch_compile_cache/<hash>` directory it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_hash: Option<String>,
    /// The layout of the hash directory it was found in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_format: Option<VllmFormat>,
}

impl PartialOrd for VllmKernel {
    fn partial_cmp(&self, other: &VllmKernel) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// By hash directory, then kernel, then layout.
impl Ord for VllmKernel {
    fn cmp(&self, other: &VllmKernel) -> Ordering {
        (&self.vllm_hash, &self.kernel, self.cache_format).cmp(&(
            &other.vllm_hash,
            &other.kernel,
            other.cache_format,
        ))
    }
}

impl EntryFacts for VllmKernel {
    fn key(&self) -> &str {
        &self.kernel.dummy_key
    }

    fn target(&self) -> Option<Target> {
        Some(self.kernel.target())
    }

    fn versions(&self) -> Vec<(&'static str, String)> {
        self.kernel.versions()
    }

    fn kernel(&self) -> Option<&TritonKernel> {
        Some(&self.kernel)
    }
}

/// A C++ kernel of a vLLM cache: a library Inductor built in one of its
/// `inductor_cache/` directories, filed by the `torch_compile_cache/<hash>`
/// directory it belongs to and that directory's layout.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VllmCppKernel {
    /// The `torch_compile_cache/<hash>` directory it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_hash: Option<String>,
    /// The library: its key is its path below the hash directory
    /// (`inductor_cache/xz/cxz….main.so`).
    #[serde(flatten)]
    pub kernel: CppKernel,
    /// The layout of the hash directory it was found in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_format: Option<VllmFormat>,
}

impl EntryFacts for VllmCppKernel {
    fn key(&self) -> &str {
        &self.kernel.key
    }

    /// None: a C++ kernel runs on the CPU.
    fn target(&self) -> Option<Target> {
        None
    }
}

/// What a vLLM cache records beside its kernels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VllmFacts {
    /// The cache layout; when a cache mixes layouts, the first of
    /// `aot_compile`, `binary`, `triton` it holds.
    pub format: Option<VllmFormat>,
    /// The artefact records of each hash directory that has any, written
    /// into the groups of `"vllm"`.
    pub artefacts: Vec<VllmArtefacts>,
}

/// The member of `manifest.json` a vLLM cache's layout is written under.
const FORMAT: &str = "format";

impl Kind for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    /// Its `torch_compile_cache` holds Inductor's output code.
    fn compiles_graphs(&self) -> bool {
        true
    }

    fn title(&self) -> &'static str {
        "a vLLM"
    }

    fn layout(&self) -> KindLayout {
        LAYOUT
    }

    fn expected(&self) -> &'static str {
        scan::EXPECTED
    }

    fn recognise(&self, dir: &Path) -> Result<bool, CacheError> {
        Ok(scan::offset_from_root(dir)?.is_some())
    }

    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError> {
        scan::scan(dir)
    }

    fn offset_from_root(&self, dir: &Path) -> Result<Option<PathBuf>, CacheError> {
        scan::offset_from_root(dir)
    }

    /// An Inductor tree's scratch (Triton's temporaries, Inductor's locks):
    /// each `inductor_cache/` is one.
    fn scratch(&self, path: &str, is_dir: bool) -> Option<&'static str> {
        super::inductor::scratch(path, is_dir)
    }

    /// A file of an `inductor_cache/` is of the Inductor entry it is in,
    /// kept below that directory; any other (a compiled artefact of
    /// `rank_<rank>_<dp_rank>/`) of the directory holding it.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        const INDUCTOR: &str = "inductor_cache/";
        match path.find(INDUCTOR) {
            Some(at) if at == 0 || path[..at].ends_with('/') => {
                let below = &path[at + INDUCTOR.len()..];
                let entry = super::inductor::entry_of(below)?;
                Some(&path[..at + INDUCTOR.len() + entry.len()])
            }
            _ => super::triton::entry_of(path),
        }
    }

    /// Its kernels' targets and versions, and its C++ kernels with the ISA
    /// they record.
    fn fit(&self, manifest: &CacheManifest) -> Fit {
        super::entries_fit(manifest).with_cpu(cpu_fit(manifest))
    }

    fn fit_of_labels(&self, summary: Summary, labels: &BTreeMap<String, String>) -> Fit {
        Fit::of_targets(summary).with_cpu(super::cpu_of_labels(LAYOUT, labels))
    }

    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        manifest_json::read_groups(value)
    }

    fn read_facts(
        &self,
        members: &BTreeMap<String, serde_json::Value>,
        bytes: &[u8],
    ) -> Result<Facts, serde_json::Error> {
        let format: Option<VllmFormat> = match members.get(FORMAT) {
            Some(value) => Deserialize::deserialize(value.clone())?,
            None => None,
        };
        Ok(Facts::of(VllmFacts {
            format,
            artefacts: manifest_json::artefacts_of(bytes),
        }))
    }

    fn normalise(&self, facts: &mut Facts) {
        let Some(facts) = facts.get_mut::<VllmFacts>() else {
            return;
        };
        facts.artefacts.retain(|a| !a.is_empty());
        for records in &mut facts.artefacts {
            records.normalise();
        }
        facts
            .artefacts
            .sort_by(|a, b| a.vllm_hash.cmp(&b.vllm_hash));
    }

    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        let none = VllmFacts::default();
        let facts = manifest.facts::<VllmFacts>().unwrap_or(&none);
        let groups = manifest_json::groups(&manifest.entries, &facts.artefacts);
        let format = facts.format.as_ref().map(|f| (FORMAT, f));
        crate::cache::manifest_json::write(self.name(), &groups, format)
    }

    fn summary_label(&self, manifest: &CacheManifest) -> String {
        let summary = manifest.summary();
        let binary = vllm_kernels(manifest).any(|e| e.cache_format == Some(VllmFormat::Binary));
        if binary {
            manifest_json::sm_summary_label(&summary)
        } else {
            summary.to_label()
        }
    }

    /// The `format` label, KServe's `io.kserve.km/*` labels, and for a
    /// cache holding C++ kernels their count and the ISA they record
    /// (`cpp-kernel-count`, `cpu-isa`).
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        let mut labels = kserve_labels(manifest);
        if let Some(format) = format_label(manifest) {
            labels.insert(LAYOUT.key("format"), format);
        }
        if let Some(cpu) = cpu_fit(manifest) {
            labels.extend(super::cpu_labels(LAYOUT, &cpu));
        }
        labels
    }
}

/// The C++ kernels of `manifest` and the ISA they record, when it holds
/// any. Kernels of two ISAs are refused when the tree is scanned; a
/// manifest that lists them anyway states no ISA.
fn cpu_fit(manifest: &CacheManifest) -> Option<CpuFit> {
    let cpp: Vec<&CppKernel> = manifest
        .entries()
        .iter()
        .filter_map(CacheEntry::facts::<VllmCppKernel>)
        .map(|e| &e.kernel)
        .collect();
    if cpp.is_empty() {
        return None;
    }
    let isa = super::inductor::cpp::kernels_isa(cpp.iter().copied(), "the cache")
        .ok()
        .flatten();
    Some(CpuFit::read(Some(cpp.len() as u64), isa))
}

/// The vLLM entries of `manifest`.
fn vllm_kernels(manifest: &CacheManifest) -> impl Iterator<Item = &VllmKernel> {
    manifest.entries().iter().filter_map(CacheEntry::facts)
}

/// The hash directories `manifest` files kernels or artefacts under,
/// sorted, without the empty name.
fn hashes(manifest: &CacheManifest) -> BTreeSet<&str> {
    let artefacts = manifest
        .facts::<VllmFacts>()
        .map(|f| &f.artefacts[..])
        .unwrap_or_default();
    vllm_kernels(manifest)
        .filter_map(|e| e.vllm_hash.as_deref())
        .chain(artefacts.iter().map(|a| a.vllm_hash.as_str()))
        .filter(|h| !h.is_empty())
        .collect()
}
