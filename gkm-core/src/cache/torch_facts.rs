//! What a PyTorch cache (Inductor, Mega-Cache) says about itself beyond its
//! Triton kernels: how many entries of each part it holds, counted from
//! file names or Mega-Cache's container, and what its builder declared
//! because the tree does not state it (the torch version, the CPU ISA of
//! its C++ kernels).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::CacheError;

/// The CPU ISAs Inductor names (`str(torch._inductor.cpu_vec_isa.pick_vec_isa())`,
/// its last word): what `--cpu-isa` accepts.
pub const CPU_ISAS: [&str; 8] = [
    "amx_tile",
    "avx512_vnni",
    "avx512",
    "avx2",
    "asimd",
    "neon",
    "zvector",
    "vsx",
];

/// Facts of an Inductor or Mega-Cache cache (`"torch"` in `manifest.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TorchFacts {
    /// Entries of each part: for Inductor `fxgraph`, `aotautograd`,
    /// `cpp` (compiled C++ libraries), `python` (generated modules),
    /// `triton` (kernels); for Mega-Cache, artefacts per PyTorch type
    /// (`inductor`, `aot_autograd`, `autotune`, `pgo`, `precompile`…).
    #[serde(default)]
    pub counts: BTreeMap<String, u64>,
    /// The torch version the builder declared (the tree does not state it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_torch_version: Option<String>,
    /// The CPU ISA Inductor picked for the C++ kernels, as the builder
    /// declared it (one of [`CPU_ISAS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared_cpu_isa: Option<String>,
}

impl TorchFacts {
    /// Adds `n` to the count of `part`.
    pub(crate) fn add(&mut self, part: &str, n: u64) {
        *self.counts.entry(part.to_string()).or_default() += n;
    }

    /// The counts as the `entry-counts` label writes them: compact JSON.
    pub fn counts_label(&self) -> String {
        serde_json::to_string(&self.counts).unwrap_or_default()
    }
}

/// The label (after the kind's prefix) with the Triton versions a PyTorch
/// cache's kernels state, comma-separated.
pub const TRITON_VERSION_LABEL: &str = "triton-version";
/// The label with the torch version the builder declared.
pub const DECLARED_TORCH_VERSION_LABEL: &str = "declared-torch-version";
/// The label with the CPU ISA the builder declared.
pub const DECLARED_CPU_ISA_LABEL: &str = "declared-cpu-isa";
/// The label with a PyTorch cache's entries per part, as compact JSON.
pub const ENTRY_COUNTS_LABEL: &str = "entry-counts";

/// The member of `manifest.json` PyTorch's facts are written under.
const MEMBER: &str = "torch";

/// The [`Kind`](super::Kind) methods PyTorch's kinds (Inductor,
/// Mega-Cache) share, written once: `torch_kind_rules!();` inside a kind's
/// `impl Kind`.
macro_rules! torch_kind_rules {
    () => {
        fn torch_facts(&self) -> bool {
            true
        }

        fn compiles_graphs(&self) -> bool {
            true
        }

        fn fit(&self, manifest: &CacheManifest) -> $crate::cache::Fit {
            $crate::cache::torch_facts::rules::fit(
                manifest,
                $crate::cache::kinds::entries_fit(manifest),
            )
        }

        fn fit_of_labels(
            &self,
            summary: $crate::cache::Summary,
            labels: &std::collections::BTreeMap<String, String>,
        ) -> $crate::cache::Fit {
            $crate::cache::torch_facts::rules::fit_of_labels(self.layout(), summary, labels)
        }

        fn declare(
            &self,
            _tree: &std::path::Path,
            manifest: &mut CacheManifest,
            declared: &$crate::cache::Declared,
        ) -> Result<(), CacheError> {
            $crate::cache::torch_facts::rules::declare(self.title(), manifest, declared)
        }

        fn read_facts(
            &self,
            members: &std::collections::BTreeMap<String, serde_json::Value>,
            _bytes: &[u8],
        ) -> Result<Facts, serde_json::Error> {
            $crate::cache::torch_facts::rules::read(members)
        }

        fn write_manifest(&self, manifest: &CacheManifest) -> Vec<u8> {
            $crate::cache::torch_facts::rules::write(manifest)
        }

        fn labels(&self, manifest: &CacheManifest) -> std::collections::BTreeMap<String, String> {
            $crate::cache::torch_facts::rules::labels(manifest)
        }
    };
}
pub(crate) use torch_kind_rules;

/// The rules PyTorch's kinds (Inductor, Mega-Cache) share for the facts
/// they record beside their Triton kernels: what their
/// [`Kind`](super::Kind) methods of the same names call.
pub(crate) mod rules {
    use super::*;
    use crate::cache::declared::{Declaration, Declared};
    use crate::cache::kinds::{CpuFit, Fit, kernels};
    use crate::cache::{CacheManifest, Facts, Summary, manifest_json};
    use crate::image_layout::KindLayout;

    /// Records the declared torch version and CPU ISA; refuses what
    /// describes another kind.
    pub(crate) fn declare(
        title: &str,
        manifest: &mut CacheManifest,
        declared: &Declared,
    ) -> Result<(), CacheError> {
        declared.refuse_beyond(&[Declaration::TorchVersion, Declaration::CpuIsa], title)?;
        if declared.is_empty() {
            return Ok(());
        }
        let facts = &mut manifest.facts;
        if facts.get::<TorchFacts>().is_none() {
            *facts = Facts::of(TorchFacts::default());
        }
        let Some(torch) = facts.get_mut::<TorchFacts>() else {
            return Ok(());
        };
        if declared.torch_version.is_some() {
            torch
                .declared_torch_version
                .clone_from(&declared.torch_version);
        }
        if declared.cpu_isa.is_some() {
            torch.declared_cpu_isa.clone_from(&declared.cpu_isa);
        }
        Ok(())
    }

    /// The kernels' fit facts, with the declared CPU ISA and torch version.
    /// A PyTorch cache may hold C++ kernels (Inductor's, counted; those a
    /// Mega-Cache's entries pickle, not): it holds CPU kernels whose ISA is
    /// the declared one.
    pub(crate) fn fit(manifest: &CacheManifest, mut fit: Fit) -> Fit {
        let torch = manifest.facts::<TorchFacts>();
        let kernels = torch.and_then(|t| t.counts.get("cpp").copied());
        let isa = torch.and_then(|t| t.declared_cpu_isa.clone());
        fit.cpu = Some(CpuFit::declared(kernels, isa));
        if let Some(version) = torch.and_then(|t| t.declared_torch_version.as_ref()) {
            fit.frameworks.insert("torch", vec![version.clone()]);
        }
        fit
    }

    /// The fit facts an image of a PyTorch kind states: its summary's
    /// targets, and C++ kernels whose ISA is its `declared-cpu-isa`.
    pub(crate) fn fit_of_labels(
        layout: KindLayout,
        summary: Summary,
        labels: &BTreeMap<String, String>,
    ) -> Fit {
        let isa = labels.get(&layout.key(DECLARED_CPU_ISA_LABEL)).cloned();
        let kernels = labels
            .get(&layout.key(ENTRY_COUNTS_LABEL))
            .and_then(|v| serde_json::from_str::<BTreeMap<String, u64>>(v).ok())
            .and_then(|counts| counts.get("cpp").copied());
        Fit::of_targets(summary).with_cpu(Some(CpuFit::declared(kernels, isa)))
    }

    /// Reads `"torch"`.
    pub(crate) fn read(
        members: &BTreeMap<String, serde_json::Value>,
    ) -> Result<Facts, serde_json::Error> {
        let torch: Option<TorchFacts> = match members.get(MEMBER) {
            Some(value) => Deserialize::deserialize(value.clone())?,
            None => None,
        };
        Ok(torch.map(Facts::of).unwrap_or_default())
    }

    /// Writes the kernels under the kind's name, then `"torch"`.
    pub(crate) fn write(manifest: &CacheManifest) -> Vec<u8> {
        let torch = manifest.facts::<TorchFacts>().map(|t| (MEMBER, t));
        manifest_json::write(manifest.kind().as_str(), &kernels(manifest), torch)
    }

    /// The labels only PyTorch's caches carry: the Triton versions read
    /// from the kernels' metadata, the entries per part, and what the
    /// builder declared (`declared-*`: gkm did not read it).
    pub(crate) fn labels(manifest: &CacheManifest) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        let Some(torch) = manifest.facts::<TorchFacts>() else {
            return labels;
        };
        let layout = KindLayout::of(manifest.kind());
        let versions = manifest.triton_versions();
        if !versions.is_empty() {
            labels.insert(layout.key(TRITON_VERSION_LABEL), versions.join(","));
        }
        labels.insert(layout.key(ENTRY_COUNTS_LABEL), torch.counts_label());
        if let Some(version) = &torch.declared_torch_version {
            labels.insert(layout.key(DECLARED_TORCH_VERSION_LABEL), version.clone());
        }
        if let Some(isa) = &torch.declared_cpu_isa {
            labels.insert(layout.key(DECLARED_CPU_ISA_LABEL), isa.clone());
        }
        labels
    }
}
