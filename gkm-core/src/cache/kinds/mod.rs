//! Cache kinds as plug-ins: the [`Kind`] trait a kind implements, and the
//! [`REGISTRY`] that lists every kind gkm knows, one line each.
//!
//! Everything that differs between kinds goes through a [`Kind`]: whether a
//! directory is its tree and what that tree holds ([`Kind::scan`]), its
//! image layout ([`Kind::layout`]), where its trees sit below the root its
//! images lay out ([`Kind::offset_from_root`]), what of a writable view's
//! upper is scratch ([`Kind::scratch`]) and which entry a new file is of
//! ([`Kind::entry_of`]), what a torn entry is and what binds
//! to an absolute path ([`Kind::build_path`], [`Kind::relocated`]), the fit
//! facts it contributes ([`Kind::fit`], [`Kind::torch_facts`]), what a
//! builder may declare ([`Kind::declare`]), its images' own labels
//! ([`Kind::labels`]) and the shape of its entries and facts in
//! `manifest.json` ([`Kind::read_entries`], [`Kind::read_facts`],
//! [`Kind::write_manifest`]). Its entries carry its own facts
//! ([`EntryFacts`](super::EntryFacts)), its manifests its own
//! [`Facts`](super::Facts).
//! [`scan`](super::scan), [`image_layout`](crate::image_layout),
//! [`delta::scratch`](crate::delta::scratch) and
//! [`tree_build_path`](super::tree_build_path) ask the registry instead of
//! matching on kinds.
//!
//! A trait rather than a table of function pointers: most of a kind's
//! rules are the Triton ones (every kind gkm knows files Triton kernels),
//! and default methods say so once, where a table would repeat them in
//! every entry; a kind writes only what is its own.
//!
//! # Adding a kind
//!
//! Copy [`triton`] (its directory: the smallest working kind), rename it,
//! add its line to [`REGISTRY`] and its `CacheKind` constant, and write its
//! tests in its directory. `docs/architecture.md` ("Adding a cache kind")
//! has the steps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{
    CacheEntry, CacheError, CacheKind, CacheManifest, Declared, Facts, Summary, TritonKernel,
    group, manifest_json,
};
use crate::image_layout::KindLayout;

pub use fit::{
    CPP_KERNEL_COUNT_LABEL, CPU_ISA_LABEL, CpuFit, Fit, cpu_labels, cpu_of_labels, entries_fit,
};

pub mod cutedsl;
pub mod deepgemm;
mod fit;
pub mod flashinfer;
pub mod inductor;
pub mod megacache;
mod ninja;
pub mod tilelang;
pub mod triton;
pub mod tvm_ffi;
pub mod vllm;

/// Every kind gkm knows, in the order messages and
/// [`image_layout::ALL`](crate::image_layout::ALL) list them and
/// [`scan`](super::scan) tries them ([`scan_order`]). A new kind goes at
/// the end, unless another kind's trees could be taken for its own: then
/// it goes before that kind.
pub const REGISTRY: &[CacheKind] = &[
    CacheKind::Triton,
    CacheKind::Vllm,
    CacheKind::Inductor,
    CacheKind::MegaCache,
    CacheKind::FlashInfer,
    CacheKind::DeepGemm,
    CacheKind::TileLang,
    CacheKind::TvmFfi,
    CacheKind::CuteDsl,
];

/// The registered kinds in the order a tree is tried against them: the
/// [`REGISTRY`]'s, a [fallback](Kind::fallback) kind (Triton, whose tree
/// is any directory of kernel directories, and so also part of a vLLM or
/// Inductor tree) after every other.
pub fn scan_order() -> impl Iterator<Item = CacheKind> {
    let (fallback, first): (Vec<CacheKind>, Vec<CacheKind>) =
        REGISTRY.iter().partition(|k| k.rules().fallback());
    first.into_iter().chain(fallback)
}

/// The registered kind named `name` (`triton`, `vllm`…).
pub fn by_name(name: &str) -> Option<CacheKind> {
    REGISTRY.iter().copied().find(|k| k.as_str() == name)
}

/// A cache kind: what gkm needs to know to recognise, scan, pack, relocate
/// and harvest its trees. Implement it on a unit struct, give the kind a
/// `CacheKind` constant and add that to [`REGISTRY`].
///
/// Only [`name`](Kind::name), [`title`](Kind::title),
/// [`layout`](Kind::layout), [`expected`](Kind::expected),
/// [`recognise`](Kind::recognise) and [`scan`](Kind::scan) have no
/// default; the defaults are the rules of a
/// tree of Triton cache directories.
pub trait Kind: Sync + 'static {
    /// The kind's name: its key in `manifest.json`, what `gkm inspect`
    /// prints (`triton`).
    fn name(&self) -> &'static str;

    /// The kind's name in prose, with its article (`a Triton`).
    fn title(&self) -> &'static str;

    /// Where its tree and manifest sit in an image layer, and its label
    /// prefix.
    fn layout(&self) -> KindLayout;

    /// What its tree holds, for the message of a directory that is no
    /// kind's tree.
    fn expected(&self) -> &'static str;

    /// Whether `dir` is laid out as this kind's tree, by its shape alone
    /// (without reading its files): what decides which kind's rules
    /// relocate a tree ([`tree_build_path`](super::tree_build_path)).
    fn recognise(&self, dir: &Path) -> Result<bool, CacheError>;

    /// Whether this kind's tree is any directory no other kind claims
    /// (Triton's): [`scan_order`] tries it after every other kind.
    fn fallback(&self) -> bool {
        false
    }

    /// Recognises and scans `dir`: `Ok(None)` when `dir` is not laid out as
    /// this kind's tree, its manifest when it is. A tree of this kind that
    /// holds a file the kind refuses (one its tool does not write) or a
    /// torn entry is refused, naming the entry.
    fn scan(&self, dir: &Path) -> Result<Option<CacheManifest>, CacheError>;

    /// Scans a single file as a cache of this kind: `None` when the kind's
    /// caches are directories only, an error naming the file when it is not
    /// one of this kind's files ([`CacheError::Foreign`]).
    fn scan_file(&self, path: &Path) -> Option<Result<CacheManifest, CacheError>> {
        let _ = path;
        None
    }

    /// Where `dir` sits below the root this kind's images lay out (vLLM
    /// lays out its cache root whichever of its directories is built);
    /// `None` when the image lays out `dir` itself, or `dir` is not this
    /// kind's.
    fn offset_from_root(&self, dir: &Path) -> Result<Option<PathBuf>, CacheError> {
        let _ = dir;
        Ok(None)
    }

    /// Why an entry of a writable view's upper is this kind's scratch
    /// (locks, temporary files and directories), which a delta leaves out;
    /// `None` when it may be a new cache entry. `path` is below the upper,
    /// `/`-separated.
    fn scratch(&self, path: &str, is_dir: bool) -> Option<&'static str> {
        triton::scratch(path, is_dir)
    }

    /// The cache entry a new file of a writable view's upper belongs to
    /// (`path` below the upper, `/`-separated, not scratch): what a pod's
    /// misses are counted in ([`usage`](crate::usage)). `None` when the
    /// file is no entry's (a top-level file). By default Triton's rule: the
    /// kernel directory holding the file.
    fn entry_of<'p>(&self, path: &'p str) -> Option<&'p str> {
        triton::entry_of(path)
    }

    /// Whether its files may bind to an absolute path (Triton's group
    /// files do). A kind whose keys name no path says `false`: its trees
    /// are found wherever they are mounted, and by default
    /// [`build_path`](Kind::build_path) and [`relocated`](Kind::relocated)
    /// have nothing to say of them.
    fn binds_to_a_path(&self) -> bool {
        true
    }

    /// The path the tree at `root` was built at: what its files that bind
    /// to an absolute path (Triton's group files) record above the tree.
    /// `None` when nothing in it binds to one. A torn entry (a group naming
    /// a missing, empty or misplaced child) is refused, naming it.
    fn build_path(&self, root: &Path) -> Result<Option<PathBuf>, CacheError> {
        if !self.binds_to_a_path() {
            return Ok(None);
        }
        group::build_path(root)
    }

    /// The files of the tree at `root` that bind to an absolute path, as
    /// they read with the tree moved to `to`: each file's path below `root`
    /// and its new bytes. Empty when nothing binds, or the tree was built
    /// at `to`.
    fn relocated(&self, root: &Path, to: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, CacheError> {
        if !self.binds_to_a_path() {
            return Ok(Vec::new());
        }
        group::relocated_groups(root, to)
    }

    /// Whether its tool finds an entry again only with its files'
    /// modification times, as ninja does (it rebuilds an output older than
    /// its inputs, or newer than what its `.ninja_log` and `.ninja_deps`
    /// recorded). Such a kind's layers carry each file's mtime (whole
    /// seconds) and every delivery restores it; by default layers carry
    /// none (0), so the same tree gives the same bytes whatever its mtimes.
    fn keeps_mtimes(&self) -> bool {
        false
    }

    /// Whether its caches carry PyTorch's facts
    /// ([`TorchFacts`](super::TorchFacts): entry counts, the declared torch
    /// version and CPU ISA). Such a cache may hold no GPU kernel at all,
    /// and then fits by the CPU ISA its builder declared.
    fn torch_facts(&self) -> bool {
        false
    }

    /// Whether its trees hold PyTorch Inductor's compiled graphs (their
    /// output code), which `gkm explain` compares by input shape
    /// ([`graphs`](crate::explain::graphs)).
    fn compiles_graphs(&self) -> bool {
        false
    }

    /// The fit facts of `manifest`, a manifest of this kind: by default its
    /// entries' ([`entries_fit`]).
    fn fit(&self, manifest: &CacheManifest) -> Fit {
        entries_fit(manifest)
    }

    /// The fit facts an image of this kind states: the targets of its
    /// `summary` label, and what its kind's own `labels` say (the CPU
    /// kernels it holds, [`labels`](Kind::labels)). By default the targets
    /// alone.
    fn fit_of_labels(&self, summary: Summary, labels: &BTreeMap<String, String>) -> Fit {
        let _ = labels;
        Fit::of_targets(summary)
    }

    /// Records what a builder declares about `manifest`, a cache of this
    /// kind scanned from `tree` (facts its tree does not state), checking
    /// it against the tree where it can. Refuses options that describe
    /// another kind, naming them; the default takes none.
    fn declare(
        &self,
        tree: &Path,
        manifest: &mut CacheManifest,
        declared: &Declared,
    ) -> Result<(), CacheError> {
        let _ = (tree, manifest);
        declared.refuse_beyond(&[], self.title())
    }

    /// Reads the kind's member of `manifest.json` (the value under its
    /// [`name`](Kind::name)): `Ok(None)` when it lists nothing (`null`).
    /// The default reads a list of Triton kernels.
    fn read_entries(
        &self,
        value: serde_json::Value,
    ) -> Result<Option<Vec<CacheEntry>>, serde_json::Error> {
        let kernels: Option<Vec<TritonKernel>> = serde::Deserialize::deserialize(value)?;
        Ok(kernels.map(|k| k.into_iter().map(CacheEntry::new).collect()))
    }

    /// Reads what the kind records beside its entries in `manifest.json`:
    /// from its `members` (each top-level member by name) or the whole
    /// document's `bytes`. None by default.
    fn read_facts(
        &self,
        members: &BTreeMap<String, serde_json::Value>,
        bytes: &[u8],
    ) -> Result<Facts, serde_json::Error> {
        let _ = (members, bytes);
        Ok(Facts::none())
    }

    /// Puts the kind's `facts` in a fixed order, so equal caches give equal
    /// manifests.
    fn normalise(&self, facts: &mut Facts) {
        let _ = facts;
    }

    /// Writes `manifest`, a manifest of this kind, as `manifest.json` bytes
    /// (pretty-printed): its entries under its name, then the facts it
    /// records. The default writes its Triton kernels.
    fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
        manifest_json::write(self.name(), &kernels(manifest), None::<(&str, &())>)
    }

    /// The summary label as this kind's images carry it.
    fn summary_label(&self, manifest: &CacheManifest) -> String {
        manifest.summary().to_label()
    }

    /// The labels (and manifest annotations) only this kind's images carry,
    /// beside the ones every cache image carries (title, entry count, size,
    /// summary, build path): none by default.
    fn labels(&self, manifest: &CacheManifest) -> BTreeMap<String, String> {
        let _ = manifest;
        BTreeMap::new()
    }
}

/// Reads a kind's member of `manifest.json` listing entries of its own type
/// `E` ([`Kind::read_entries`] of a kind whose entries are not Triton
/// kernels).
pub(crate) fn read_own_entries<E>(
    value: serde_json::Value,
) -> Result<Option<Vec<CacheEntry>>, serde_json::Error>
where
    E: super::EntryFacts + serde::de::DeserializeOwned,
{
    let entries: Option<Vec<E>> = serde::Deserialize::deserialize(value)?;
    Ok(entries.map(|e| e.into_iter().map(CacheEntry::new).collect()))
}

/// The entries of type `E` `manifest` lists, in its order.
pub(crate) fn own_entries<E: super::EntryFacts>(manifest: &CacheManifest) -> Vec<&E> {
    manifest
        .entries()
        .iter()
        .filter_map(CacheEntry::facts)
        .collect()
}

/// Writes `manifest.json` of kind `name` whose entries are its own type
/// `E` ([`Kind::write_manifest`] of such a kind), with no facts beside.
pub(crate) fn write_own_entries<E>(name: &str, manifest: &CacheManifest) -> Vec<u8>
where
    E: super::EntryFacts + serde::Serialize,
{
    manifest_json::write(name, &own_entries::<E>(manifest), None::<(&str, &())>)
}

/// The labels of `layout` named in `labels`, each the distinct values its
/// entries hold, sorted and joined with commas; a label with no value is
/// left out ([`Kind::labels`] of a kind that labels its images with its
/// entries' versions, installs or compilers).
pub(crate) fn joined_labels<V>(
    layout: KindLayout,
    labels: impl IntoIterator<Item = (&'static str, V)>,
) -> BTreeMap<String, String>
where
    V: IntoIterator,
    V::Item: AsRef<str>,
{
    labels
        .into_iter()
        .filter_map(|(label, values)| {
            let values: std::collections::BTreeSet<String> =
                values.into_iter().map(|v| v.as_ref().to_string()).collect();
            (!values.is_empty()).then(|| {
                (
                    layout.key(label),
                    values.into_iter().collect::<Vec<_>>().join(","),
                )
            })
        })
        .collect()
}

/// The Triton kernels `manifest` lists, in its order.
pub(crate) fn kernels(manifest: &CacheManifest) -> Vec<&TritonKernel> {
    manifest
        .entries()
        .iter()
        .filter_map(CacheEntry::kernel)
        .collect()
}

impl std::fmt::Debug for dyn Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_kinds_have_distinct_names_and_layouts() {
        for (i, kind) in REGISTRY.iter().enumerate() {
            assert_eq!(by_name(kind.as_str()), Some(*kind));
            let layout = kind.rules().layout();
            assert_eq!(layout.kind, *kind);
            for other in &REGISTRY[i + 1..] {
                let theirs = other.rules().layout();
                assert_ne!(kind.as_str(), other.as_str());
                assert_ne!(layout.cache_dir, theirs.cache_dir);
                assert_ne!(layout.manifest_dir, theirs.manifest_dir);
                assert_ne!(layout.label_prefix, theirs.label_prefix);
            }
        }
        assert_eq!(scan_order().last(), Some(CacheKind::Triton));
        assert_eq!(scan_order().count(), REGISTRY.len());
        assert_eq!(by_name("deepgemm"), Some(CacheKind::DeepGemm));
        assert_eq!(by_name("tilelang"), Some(CacheKind::TileLang));
        assert_eq!(by_name("tvm-ffi"), Some(CacheKind::TvmFfi));
        assert_eq!(by_name("cutedsl"), Some(CacheKind::CuteDsl));
        assert_eq!(by_name("no-such-kind"), None);
    }

    #[test]
    fn fit_facts_are_the_targets_frameworks_and_a_torch_kinds_declared_isa() {
        let entry = TritonKernel::from_kernel_json(
            br#"{"hash":"h","triton_version":"3.6.0","target":{"backend":"cuda","arch":75,"warp_size":32}}"#,
        )
        .unwrap();
        let facts = crate::cache::TorchFacts {
            declared_cpu_isa: Some("avx2".into()),
            declared_torch_version: Some("2.11.0".into()),
            ..Default::default()
        };
        let torch = CacheManifest::of_kind(
            CacheKind::Inductor,
            [entry.clone()],
            Facts::of(facts.clone()),
        );
        let fit = torch.fit();
        assert_eq!(fit.targets.to_string(), "cuda/75/32");
        assert_eq!(fit.cpu.and_then(|c| c.isa).as_deref(), Some("avx2"));
        assert_eq!(fit.frameworks["triton"], ["3.6.0"]);
        assert_eq!(fit.frameworks["torch"], ["2.11.0"]);

        let triton = CacheManifest::of_kind(CacheKind::Triton, [entry], Facts::of(facts));
        let fit = triton.fit();
        assert_eq!(fit.cpu, None);
        assert!(!fit.frameworks.contains_key("torch"));
        assert!(!CacheKind::Triton.is_torch() && CacheKind::MegaCache.is_torch());
    }

    #[test]
    fn a_kind_reads_and_writes_as_its_name() {
        let json = serde_json::to_string(&CacheKind::MegaCache).unwrap();
        assert_eq!(json, "\"megacache\"");
        let back: CacheKind = serde_json::from_str(&json).unwrap();
        assert_eq!(back, CacheKind::MegaCache);
        let err = serde_json::from_str::<CacheKind>("\"no-such-kind\"").unwrap_err();
        assert!(err.to_string().contains("no-such-kind"), "{err}");
    }
}
