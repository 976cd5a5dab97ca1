//! What the agents' node reports say about a cache on a node: whether its
//! GPUs fit the cache, and which digests are extracted there.

use std::collections::BTreeMap;

use gkm_k8s_api::NodeFit;
use gkm_k8s_api::crd::{CacheNodeStatus, NodeCacheStatus};

/// One cache on one node, from the node's report.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CacheOnNode {
    /// `Some(true)`: a GPU of the node fits some digest of the cache;
    /// `Some(false)`: the agent found none that fits; `None`: it has not
    /// said.
    pub fits: Option<bool>,
    /// Why no GPU fits, as the agent reported it.
    pub reasons: String,
    /// Digests extracted on the node.
    pub extracted: Vec<String>,
}

/// How well a node suits the caches a pod mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CacheFit {
    /// The pod mounts no gkm cache, or the node's agent has not reported on
    /// them.
    Unknown,
    /// The agent reported that a GPU of the node fits every cache.
    Compatible,
    /// Every cache is also extracted there, at the digest the cache resolves
    /// to now.
    Ready,
}

/// The per-cache summaries of one node report, by cache name.
pub fn summarize(status: &CacheNodeStatus) -> BTreeMap<String, CacheOnNode> {
    let mut out = BTreeMap::new();
    for (name, digests) in status.caches.iter().flatten() {
        out.insert(name.clone(), summarize_cache(digests));
    }
    out
}

/// The PVCs of a report: `(namespace, claim)` and the cache name filling it.
pub fn claims(status: &CacheNodeStatus) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (name, digests) in status.caches.iter().flatten() {
        for entry in digests.values() {
            for (namespace, pvc) in entry.pvc_status.iter().flatten() {
                if let Some(claim) = &pvc.pvc_name {
                    out.push((namespace.clone(), claim.clone(), name.clone()));
                }
            }
        }
    }
    out
}

/// One cache's digests on one node, each judged by [`NodeFit`]: the node
/// fits the cache when it fits any digest, does not when it fits none and
/// some digest does not fit; a served digest is extracted.
fn summarize_cache(digests: &BTreeMap<String, NodeCacheStatus>) -> CacheOnNode {
    let mut summary = CacheOnNode::default();
    let mut reasons = Vec::new();
    for (digest, entry) in digests {
        let fit = NodeFit::of(entry);
        if fit.fits() {
            summary.fits = Some(true);
        } else if fit == NodeFit::DoesNotFit && summary.fits.is_none() {
            summary.fits = Some(false);
        }
        for gpu in entry.incompatible_reasons.iter().flatten() {
            reasons.push(format!("GPU {}: {}", gpu.id, gpu.reasons.join(", ")));
        }
        if fit.serves() {
            summary.extracted.push(digest.clone());
        }
    }
    if summary.fits == Some(false) {
        reasons.dedup();
        summary.reasons = reasons.join("; ");
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::{CacheState, IncompatibleGpu};

    fn entry(state: CacheState, compatible: &[i32], incompatible: &[i32]) -> NodeCacheStatus {
        NodeCacheStatus {
            state: Some(state),
            compatible_gpus: Some(compatible.to_vec()),
            incompatible_gpus: Some(incompatible.to_vec()),
            incompatible_reasons: Some(
                incompatible
                    .iter()
                    .map(|&id| IncompatibleGpu {
                        id,
                        reasons: vec!["arch gfx90a is not sm_75".into()],
                    })
                    .collect(),
            ),
            ..NodeCacheStatus::default()
        }
    }

    fn report(digests: &[(&str, NodeCacheStatus)]) -> CacheNodeStatus {
        let digests = digests
            .iter()
            .map(|(d, e)| (d.to_string(), e.clone()))
            .collect();
        CacheNodeStatus {
            caches: Some(BTreeMap::from([("vector-add".to_string(), digests)])),
            ..CacheNodeStatus::default()
        }
    }

    #[test]
    fn a_fitting_extracted_digest_is_ready() {
        let s = summarize(&report(&[
            ("sha256:a", entry(CacheState::Extracted, &[0], &[])),
            ("sha256:b", entry(CacheState::Downloading, &[0], &[])),
        ]));
        let c = &s["vector-add"];
        assert_eq!(c.fits, Some(true));
        assert_eq!(c.extracted, vec!["sha256:a".to_string()]);
    }

    #[test]
    fn a_multi_target_image_is_ready_where_the_nodes_variant_is_extracted() {
        // The agent reports a multi-target image under the index digest
        // (the one the cache resolves to), with the variant it holds and
        // the GPUs that variant fits.
        let held = NodeCacheStatus {
            variant: Some("sha256:variant".into()),
            ..entry(CacheState::Extracted, &[0], &[])
        };
        let s = summarize(&report(&[("sha256:index", held)]));
        let c = &s["vector-add"];
        assert_eq!(c.fits, Some(true));
        assert_eq!(c.extracted, vec!["sha256:index".to_string()]);
    }

    #[test]
    fn no_fitting_gpu_carries_the_reasons() {
        let s = summarize(&report(&[(
            "sha256:a",
            entry(CacheState::Error, &[], &[0]),
        )]));
        let c = &s["vector-add"];
        assert_eq!(c.fits, Some(false));
        assert_eq!(c.reasons, "GPU 0: arch gfx90a is not sm_75");
        assert!(c.extracted.is_empty());
    }

    #[test]
    fn an_extracted_digest_without_compatible_gpus_listed_is_ready() {
        // The agent extracts only what a GPU of its node fits: on the node
        // is enough, whatever the GPU lists say.
        for incompatible in [&[][..], &[1]] {
            let s = summarize(&report(&[(
                "sha256:a",
                entry(CacheState::Extracted, &[], incompatible),
            )]));
            let c = &s["vector-add"];
            assert_eq!(c.fits, Some(true), "incompatible {incompatible:?}");
            assert_eq!(c.extracted, vec!["sha256:a".to_string()]);
        }
    }

    #[test]
    fn an_incompatible_digest_does_not_fit_without_gpu_lists() {
        let bare = NodeCacheStatus {
            state: Some(CacheState::Incompatible),
            ..NodeCacheStatus::default()
        };
        let s = summarize(&report(&[("sha256:a", bare)]));
        let c = &s["vector-add"];
        assert_eq!(c.fits, Some(false));
        assert!(c.extracted.is_empty());
        // Incompatible wins over GPUs listed as compatible.
        let s = summarize(&report(&[(
            "sha256:a",
            entry(CacheState::Incompatible, &[0], &[]),
        )]));
        assert_eq!(s["vector-add"].fits, Some(false));
    }
}
