//! Which variant of a multi-target image a node's GPUs get: the one
//! decision the CLI (`gkm check`), the agent, and through the agent the CSI
//! driver and the node reports all make the same way.
//!
//! A multi-target image is an OCI index of single-target variants, each with
//! the targets it was compiled for (see [`crate::compat`] for when a target
//! fits a GPU). A node holds one variant of a cache, so the choice is made
//! per node:
//!
//! - the variant that fits the **most GPUs** of the node wins;
//! - a tie goes to the variant listed **first** in the index (the image's
//!   author orders them);
//! - a node none of whose GPUs any variant fits gets none, with every
//!   variant's reasons.
//!
//! Each GPU is also told the first variant that fits it
//! ([`VariantChoice::gpu_variant`]), which is what `gkm check` prints beside
//! the node's choice.

use std::fmt;

use serde::Serialize;

use crate::cache::Summary;
use crate::compat::{CheckOptions, Report, check_summary};
use crate::gpu::Gpu;

/// The outcome of [`choose_variant`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantChoice {
    /// The position of the chosen variant in the index; `None` when no
    /// variant fits any GPU.
    pub chosen: Option<usize>,
    /// One compatibility report per variant, in the index's order.
    pub reports: Vec<Report>,
}

impl VariantChoice {
    /// The chosen variant's report.
    pub fn chosen_report(&self) -> Option<&Report> {
        self.reports.get(self.chosen?)
    }

    /// The first variant that fits the GPU at position `gpu` of the GPUs
    /// checked, if any.
    pub fn gpu_variant(&self, gpu: usize) -> Option<usize> {
        self.reports
            .iter()
            .position(|r| r.gpus.get(gpu).is_some_and(|g| g.compatible))
    }

    /// How many GPUs variant `variant` fits.
    pub fn fitted(&self, variant: usize) -> usize {
        self.reports
            .get(variant)
            .map_or(0, |r| r.compatible_gpus().count())
    }
}

/// Why the node got the variant it got (or none), in one line: the variant,
/// how many GPUs it fits, and, for no variant, each variant's first reason
/// per GPU.
impl fmt::Display for VariantChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gpus = self.reports.first().map_or(0, |r| r.gpus.len());
        match self.chosen {
            Some(v) => write!(
                f,
                "variant {v} fits {} of {gpus} GPU(s), the most of the {} variant(s)",
                self.fitted(v),
                self.reports.len()
            ),
            None if self.reports.is_empty() => write!(f, "the image lists no variants"),
            None => {
                write!(f, "no variant fits any GPU")?;
                for (v, report) in self.reports.iter().enumerate() {
                    let first = report
                        .reasons
                        .first()
                        .map(ToString::to_string)
                        .or_else(|| {
                            report
                                .gpus
                                .iter()
                                .find_map(|g| g.all_reasons().next().map(ToString::to_string))
                        })
                        .unwrap_or_else(|| "incompatible".into());
                    write!(f, "; variant {v}: {first}")?;
                }
                Ok(())
            }
        }
    }
}

/// Chooses the variant (given by each one's target summary, in the index's
/// order) that `gpus` get; see the module documentation for the rule.
pub fn choose_variant(variants: &[Summary], gpus: &[Gpu], options: &CheckOptions) -> VariantChoice {
    let reports: Vec<Report> = variants
        .iter()
        .map(|summary| check_summary(summary, gpus, options))
        .collect();
    let mut chosen: Option<(usize, usize)> = None;
    for (v, report) in reports.iter().enumerate() {
        let fitted = report.compatible_gpus().count();
        if fitted > 0 && chosen.is_none_or(|(_, best)| fitted > best) {
            chosen = Some((v, fitted));
        }
    }
    VariantChoice {
        chosen: chosen.map(|(v, _)| v),
        reports,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{Backend, Vendor};

    fn summary(label: &str) -> Summary {
        Summary::from_label(label).unwrap()
    }

    fn cuda(arch: &str) -> Summary {
        summary(&format!(
            r#"{{"targets":[{{"backend":"cuda","arch":"{arch}","warp_size":32}}]}}"#
        ))
    }

    fn gpu(index: u32, backend: Backend, arch: &str, warp: u32) -> Gpu {
        Gpu {
            index,
            vendor: if backend == Backend::Cuda {
                Vendor::Nvidia
            } else {
                Vendor::Amd
            },
            product: format!("gpu-{arch}"),
            backend: Some(backend),
            arch: Some(arch.parse().unwrap()),
            warp_size: Some(warp),
            ..Gpu::default()
        }
    }

    #[test]
    fn each_node_gets_the_variant_of_its_gpus() {
        let variants = [
            cuda("75"),
            cuda("80"),
            cuda("90"),
            summary(r#"{"targets":[{"backend":"hip","arch":"gfx942","warp_size":64}]}"#),
        ];
        let options = CheckOptions::default();
        let t4 = [gpu(0, Backend::Cuda, "75", 32)];
        let h100 = [gpu(0, Backend::Cuda, "90", 32)];
        let mi300 = [gpu(0, Backend::Hip, "gfx942", 64)];
        assert_eq!(choose_variant(&variants, &t4, &options).chosen, Some(0));
        assert_eq!(choose_variant(&variants, &h100, &options).chosen, Some(2));
        let choice = choose_variant(&variants, &mi300, &options);
        assert_eq!(choice.chosen, Some(3));
        assert_eq!(
            choice.to_string(),
            "variant 3 fits 1 of 1 GPU(s), the most of the 4 variant(s)"
        );
    }

    #[test]
    fn the_variant_fitting_most_gpus_wins_and_a_tie_goes_to_the_first() {
        let variants = [cuda("75"), cuda("80")];
        let options = CheckOptions::default();
        let mixed = [
            gpu(0, Backend::Cuda, "75", 32),
            gpu(1, Backend::Cuda, "80", 32),
            gpu(2, Backend::Cuda, "80", 32),
        ];
        let choice = choose_variant(&variants, &mixed, &options);
        assert_eq!(choice.chosen, Some(1));
        assert_eq!(choice.gpu_variant(0), Some(0));
        assert_eq!(choice.gpu_variant(2), Some(1));
        let tie = &mixed[..2];
        assert_eq!(choose_variant(&variants, tie, &options).chosen, Some(0));
    }

    #[test]
    fn no_fitting_variant_says_why_for_each() {
        let variants = [cuda("75"), cuda("80")];
        let mi210 = [gpu(0, Backend::Hip, "gfx90a", 64)];
        let choice = choose_variant(&variants, &mi210, &CheckOptions::default());
        assert_eq!(choice.chosen, None);
        assert_eq!(choice.gpu_variant(0), None);
        let text = choice.to_string();
        assert!(
            text.starts_with("no variant fits any GPU; variant 0: ") && text.contains("variant 1"),
            "{text}"
        );
        let none = choose_variant(&[], &mi210, &CheckOptions::default());
        assert_eq!(none.to_string(), "the image lists no variants");
    }
}
