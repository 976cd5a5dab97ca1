//! What a cache contributes to whether it fits a node ([`Fit`]): the GPU
//! targets of its entries, the CPU kernels it holds and the ISA they need
//! ([`CpuFit`]), the frameworks that compiled it. One rule reads them
//! whoever asks (`gkm check`, the operator's variants, a node's agent): a
//! cache that holds CPU kernels and no GPU target is judged by the CPU
//! ([`Fit::judged_by_cpu`]), any other by its GPU targets.

use std::collections::BTreeMap;

use super::super::{CacheEntry, CacheManifest, Summary};
use crate::image_layout::KindLayout;

/// The facts a cache contributes to whether it fits a node, by its kind
/// ([`Kind::fit`](super::Kind::fit), or from an image's labels:
/// [`Kind::fit_of_labels`](super::Kind::fit_of_labels)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Fit {
    /// The GPU targets of its entries: backend (CUDA or ROCm…),
    /// architecture, warp size, PTX version, Triton version.
    pub targets: Summary,
    /// The kernels it holds for the CPU, when its kind has any (PyTorch's
    /// C++ kernels): what it fits by when it holds no GPU target.
    pub cpu: Option<CpuFit>,
    /// The frameworks that compiled it and their versions, each sorted
    /// (`triton`: what its entries record; `torch`: as declared).
    pub frameworks: BTreeMap<&'static str, Vec<String>>,
}

/// The kernels a cache holds for the CPU, and the ISA they need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CpuFit {
    /// How many C++ kernel libraries it holds, when its kind counts them.
    pub kernels: Option<u64>,
    /// The vector ISA they were compiled for, Inductor's name (`amx_tile`,
    /// `avx512_vnni`, `avx512`, `avx2`, `asimd`…), when known.
    pub isa: Option<String>,
    /// Whether [`isa`](Self::isa) is what the builder declared
    /// (`gkm build --cpu-isa`) rather than what the kernels record.
    pub declared: bool,
}

impl CpuFit {
    /// CPU kernels whose ISA, if any, is the builder's declaration.
    pub fn declared(kernels: Option<u64>, isa: Option<String>) -> CpuFit {
        CpuFit {
            kernels,
            isa,
            declared: true,
        }
    }

    /// CPU kernels whose ISA, if any, is read from the kernels.
    pub fn read(kernels: Option<u64>, isa: Option<String>) -> CpuFit {
        CpuFit {
            kernels,
            isa,
            declared: false,
        }
    }

    /// How its ISA is known, for messages: `read from the kernels`,
    /// `declared`.
    pub fn provenance(&self) -> &'static str {
        if self.declared {
            "declared"
        } else {
            "read from the kernels"
        }
    }
}

impl Fit {
    /// Fit facts of these GPU targets and nothing else.
    pub fn of_targets(targets: Summary) -> Fit {
        Fit {
            targets,
            ..Fit::default()
        }
    }

    /// These facts with the CPU kernels `cpu`.
    pub fn with_cpu(mut self, cpu: Option<CpuFit>) -> Fit {
        self.cpu = cpu;
        self
    }

    /// The CPU kernels it is judged by, when it is judged by the CPU: it
    /// holds CPU kernels and no GPU target. `None` when its GPU targets
    /// decide.
    ///
    /// ```
    /// use gkm_core::cache::{CpuFit, Fit, Summary};
    /// let cpu = Fit::of_targets(Summary::default()).with_cpu(Some(CpuFit::read(Some(17), Some("avx2".into()))));
    /// assert_eq!(cpu.judged_by_cpu().and_then(|c| c.isa.as_deref()), Some("avx2"));
    /// assert_eq!(Fit::of_targets(Summary::default()).judged_by_cpu(), None);
    /// ```
    pub fn judged_by_cpu(&self) -> Option<&CpuFit> {
        if self.targets.targets.is_empty() {
            self.cpu.as_ref()
        } else {
            None
        }
    }
}

/// The fit facts of `manifest`'s entries: their targets, and the versions
/// they record by framework, each sorted.
pub fn entries_fit(manifest: &CacheManifest) -> Fit {
    let mut fit = Fit::of_targets(manifest.summary());
    for (framework, version) in manifest.entries().iter().flat_map(CacheEntry::versions) {
        let versions = fit.frameworks.entry(framework).or_default();
        if !versions.contains(&version) {
            versions.push(version);
        }
    }
    for versions in fit.frameworks.values_mut() {
        versions.sort();
    }
    fit
}

/// The label (after the kind's prefix) with the number of C++ kernel
/// libraries a cache holds, read from its tree.
pub const CPP_KERNEL_COUNT_LABEL: &str = "cpp-kernel-count";
/// The label with the CPU ISA a cache's C++ kernels were compiled for, as
/// the kernels record it.
pub const CPU_ISA_LABEL: &str = "cpu-isa";

/// The labels that carry `cpu` (a CPU fit read from the kernels) on an
/// image of `layout`: [`CPP_KERNEL_COUNT_LABEL`] and, when known,
/// [`CPU_ISA_LABEL`].
pub fn cpu_labels(layout: KindLayout, cpu: &CpuFit) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    if let Some(n) = cpu.kernels {
        labels.insert(layout.key(CPP_KERNEL_COUNT_LABEL), n.to_string());
    }
    if let Some(isa) = &cpu.isa {
        labels.insert(layout.key(CPU_ISA_LABEL), isa.clone());
    }
    labels
}

/// The CPU fit [`cpu_labels`] wrote on an image of `layout`: `None` when it
/// labels no C++ kernel (or a count that is not a number).
pub fn cpu_of_labels(layout: KindLayout, labels: &BTreeMap<String, String>) -> Option<CpuFit> {
    let kernels: u64 = labels
        .get(&layout.key(CPP_KERNEL_COUNT_LABEL))?
        .trim()
        .parse()
        .ok()?;
    (kernels > 0).then(|| {
        CpuFit::read(
            Some(kernels),
            labels.get(&layout.key(CPU_ISA_LABEL)).cloned(),
        )
    })
}
