//! Rolling node reports up into a cache's counts and state. Pure: tests feed
//! it reports, the reconcile feeds it the watched node reports.

use std::collections::BTreeMap;

use crate::crd::{CacheCounts, CacheState, NodeCacheStatus};

/// One node's entries for one cache, per image digest.
pub type NodeEntries<'a> = &'a BTreeMap<String, NodeCacheStatus>;

/// A cache's cluster-wide counts and state, from the entries of every node
/// that reported it.
///
/// Per node, the entry for `resolved` (the digest the tag resolves to now)
/// decides the node counts: Running → in use, Extracted → not in use, Error →
/// error, Incompatible → incompatible (no GPU there fits it: not an error). Pods on `resolved` are running; pods on any other digest are
/// outdated, or deleting when the cache is being deleted. The state is the
/// furthest any node got: Deleting, Outdated, Running, Extracted, Downloading,
/// Error, Incompatible (it fits no node that reported), then Pending.
pub fn rollup<'a>(
    resolved: Option<&str>,
    deleting: bool,
    nodes: impl IntoIterator<Item = NodeEntries<'a>>,
) -> (CacheCounts, CacheState) {
    let mut counts = CacheCounts::default();
    let mut downloading = false;
    for entries in nodes {
        counts.node_cnt += 1;
        for (digest, entry) in entries {
            let pods = entry.pods.as_ref().map_or(0, Vec::len) as i32;
            let current = Some(digest.as_str()) == resolved;
            if deleting {
                counts.pod_deleting_cnt += pods;
            } else if current {
                counts.pod_running_cnt += pods;
            } else {
                counts.pod_outdated_cnt += pods;
            }
            if !current {
                continue;
            }
            match entry.state {
                Some(CacheState::Running | CacheState::Outdated) => counts.node_in_use_cnt += 1,
                Some(CacheState::Extracted) => {
                    if pods > 0 {
                        counts.node_in_use_cnt += 1;
                    } else {
                        counts.node_not_in_use_cnt += 1;
                    }
                }
                Some(CacheState::Error | CacheState::NoNamespace) => counts.node_error_cnt += 1,
                Some(CacheState::Incompatible) => counts.node_incompatible_cnt += 1,
                Some(CacheState::Downloading) => downloading = true,
                Some(CacheState::Pending | CacheState::Deleting) | None => {}
            }
        }
    }
    let state = if deleting {
        CacheState::Deleting
    } else if resolved.is_none() {
        CacheState::Pending
    } else if counts.pod_outdated_cnt > 0 {
        CacheState::Outdated
    } else if counts.pod_running_cnt > 0 || counts.node_in_use_cnt > 0 {
        CacheState::Running
    } else if counts.node_not_in_use_cnt > 0 {
        CacheState::Extracted
    } else if downloading {
        CacheState::Downloading
    } else if counts.node_error_cnt > 0 {
        CacheState::Error
    } else if counts.node_incompatible_cnt > 0 {
        CacheState::Incompatible
    } else {
        CacheState::Pending
    };
    (counts, state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PodData;

    fn entry(state: CacheState, pods: usize) -> NodeCacheStatus {
        NodeCacheStatus {
            state: Some(state),
            pods: (pods > 0).then(|| {
                (0..pods)
                    .map(|i| PodData {
                        pod_name: format!("p{i}"),
                        ..PodData::default()
                    })
                    .collect()
            }),
            ..NodeCacheStatus::default()
        }
    }

    fn node(entries: &[(&str, NodeCacheStatus)]) -> BTreeMap<String, NodeCacheStatus> {
        entries
            .iter()
            .map(|(d, e)| (d.to_string(), e.clone()))
            .collect()
    }

    #[test]
    fn three_nodes_one_extracted_one_incompatible_one_without_gpus() {
        let sm75 = node(&[("sha256:new", entry(CacheState::Extracted, 0))]);
        let gfx = node(&[("sha256:new", entry(CacheState::Incompatible, 0))]);
        let none = node(&[("sha256:new", entry(CacheState::Incompatible, 0))]);
        let (counts, state) = rollup(Some("sha256:new"), false, [&sm75, &gfx, &none]);
        assert_eq!(counts.node_cnt, 3);
        assert_eq!(counts.node_not_in_use_cnt, 1);
        assert_eq!(
            counts.node_error_cnt, 0,
            "incompatible nodes are not errors"
        );
        assert_eq!(counts.node_incompatible_cnt, 2);
        assert_eq!(state, CacheState::Extracted);
        // Fitting no node at all is its own state, not an error.
        let (counts, state) = rollup(Some("sha256:new"), false, [&gfx, &none]);
        assert_eq!(
            (counts.node_error_cnt, counts.node_incompatible_cnt),
            (0, 2)
        );
        assert_eq!(state, CacheState::Incompatible);
        // A real failure elsewhere still shows as one.
        let broken = node(&[("sha256:new", entry(CacheState::Error, 0))]);
        let (counts, state) = rollup(Some("sha256:new"), false, [&gfx, &broken]);
        assert_eq!(
            (counts.node_error_cnt, counts.node_incompatible_cnt),
            (1, 1)
        );
        assert_eq!(state, CacheState::Error);
    }

    #[test]
    fn pods_on_an_old_digest_are_outdated() {
        let n = node(&[
            ("sha256:old", entry(CacheState::Outdated, 1)),
            ("sha256:new", entry(CacheState::Running, 2)),
        ]);
        let (counts, state) = rollup(Some("sha256:new"), false, [&n]);
        assert_eq!((counts.pod_running_cnt, counts.pod_outdated_cnt), (2, 1));
        assert_eq!(counts.node_in_use_cnt, 1);
        assert_eq!(state, CacheState::Outdated);
    }

    #[test]
    fn deleting_counts_every_pod_as_deleting() {
        let n = node(&[("sha256:new", entry(CacheState::Running, 2))]);
        let (counts, state) = rollup(Some("sha256:new"), true, [&n]);
        assert_eq!((counts.pod_running_cnt, counts.pod_deleting_cnt), (0, 2));
        assert_eq!(state, CacheState::Deleting);
    }

    #[test]
    fn nothing_reported_is_pending_and_errors_alone_are_errors() {
        assert_eq!(rollup(Some("sha256:a"), false, []).1, CacheState::Pending);
        assert_eq!(rollup(None, false, []).1, CacheState::Pending);
        let n = node(&[("sha256:a", entry(CacheState::Error, 0))]);
        assert_eq!(rollup(Some("sha256:a"), false, [&n]).1, CacheState::Error);
        let d = node(&[("sha256:a", entry(CacheState::Downloading, 0))]);
        assert_eq!(
            rollup(Some("sha256:a"), false, [&n, &d]).1,
            CacheState::Downloading
        );
    }
}
