//! Whether a node serves or fits a digest, as its agent's report says: the
//! one rule the operator's rollup, its ReadWriteOnce placement, its
//! image-volume webhook and the scheduler extender all read.

use crate::crd::{CacheState, NodeCacheStatus};

/// What one node report entry (one digest of one cache on one node) says
/// about the node and that digest.
///
/// The rule, in order:
/// 1. `Incompatible` state: the digest does not fit, whatever GPUs the
///    entry lists.
/// 2. On the node (`Extracted`, `Running`, `Outdated`, see
///    [`CacheState::is_on_node`]): the node serves it. The agent extracts
///    only what a GPU of its node fits, so no GPU list is needed.
/// 3. Compatible GPUs listed: it fits, not extracted (yet).
/// 4. Only incompatible GPUs listed: it does not fit.
/// 5. Otherwise the agent has not said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeFit {
    /// The agent has not said whether a GPU of the node fits the digest.
    Unknown,
    /// No GPU of the node fits the digest.
    DoesNotFit,
    /// A GPU of the node fits the digest; its tree is not in the store.
    Fits,
    /// The digest's tree is in the node's store, ready to mount.
    Serves,
}

impl NodeFit {
    /// What `entry` says, by the rule of [`NodeFit`].
    pub fn of(entry: &NodeCacheStatus) -> NodeFit {
        let listed = |gpus: &Option<Vec<i32>>| gpus.as_ref().is_some_and(|g| !g.is_empty());
        match entry.state {
            Some(CacheState::Incompatible) => NodeFit::DoesNotFit,
            Some(state) if state.is_on_node() => NodeFit::Serves,
            _ if listed(&entry.compatible_gpus) => NodeFit::Fits,
            _ if listed(&entry.incompatible_gpus) => NodeFit::DoesNotFit,
            _ => NodeFit::Unknown,
        }
    }

    /// Whether a GPU of the node fits the digest (served or not).
    pub fn fits(self) -> bool {
        matches!(self, NodeFit::Fits | NodeFit::Serves)
    }

    /// Whether the node serves the digest from its store.
    pub fn serves(self) -> bool {
        self == NodeFit::Serves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        state: Option<CacheState>,
        compatible: &[i32],
        incompatible: &[i32],
    ) -> NodeCacheStatus {
        NodeCacheStatus {
            state,
            compatible_gpus: Some(compatible.to_vec()),
            incompatible_gpus: Some(incompatible.to_vec()),
            ..NodeCacheStatus::default()
        }
    }

    #[test]
    fn incompatible_never_fits_and_extracted_serves_without_a_gpu_list() {
        use CacheState::*;
        let cases = [
            // Incompatible wins over GPUs listed as compatible.
            (entry(Some(Incompatible), &[0], &[]), NodeFit::DoesNotFit),
            // On the node: served, with or without a GPU list.
            (entry(Some(Extracted), &[], &[]), NodeFit::Serves),
            (entry(Some(Running), &[0], &[1]), NodeFit::Serves),
            (entry(Some(Outdated), &[0], &[]), NodeFit::Serves),
            // GPUs listed but not extracted: fits, not served.
            (entry(Some(Pending), &[0], &[]), NodeFit::Fits),
            (entry(Some(Error), &[0], &[1]), NodeFit::Fits),
            (entry(None, &[], &[1]), NodeFit::DoesNotFit),
            (entry(Some(Pending), &[], &[]), NodeFit::Unknown),
            (NodeCacheStatus::default(), NodeFit::Unknown),
        ];
        for (entry, want) in cases {
            assert_eq!(NodeFit::of(&entry), want, "{entry:?}");
        }
        assert!(NodeFit::Serves.fits() && NodeFit::Fits.fits());
        assert!(!NodeFit::DoesNotFit.fits() && !NodeFit::Unknown.fits());
        assert!(NodeFit::Serves.serves() && !NodeFit::Fits.serves());
    }
}
