//! Rolling node reports up into a cache's counts and state. Pure: tests feed
//! it reports, the reconcile feeds it the watched node reports.

use std::collections::BTreeMap;

use gkm_k8s_api::crd::{CacheCounts, CacheState, ImageVariant, VariantNodes, WorkloadUsage};
use gkm_k8s_api::workloads::add_usage;

pub use crate::report_index::{Entry, NodeEntries, variant_key};

/// Per variant ([`variant_key`]), how many nodes hold it extracted (in use
/// or not) for `resolved`, the multi-target image's index digest.
pub fn variant_nodes<'a>(
    resolved: &str,
    nodes: impl IntoIterator<Item = &'a NodeEntries>,
) -> BTreeMap<u64, i32> {
    let mut held = BTreeMap::new();
    for entries in nodes {
        for (digest, entry) in entries {
            if digest == resolved
                && entry.state.is_some_and(CacheState::is_on_node)
                && let Some(variant) = entry.variant
            {
                *held.entry(variant).or_default() += 1;
            }
        }
    }
    held
}

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
    nodes: impl IntoIterator<Item = &'a NodeEntries>,
) -> (CacheCounts, CacheState) {
    let mut counts = CacheCounts::default();
    let mut downloading = false;
    for entries in nodes {
        counts.node_cnt += 1;
        for (digest, entry) in entries {
            let pods = i32::try_from(entry.pods).unwrap_or(i32::MAX);
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
                Some(state) if state.is_on_node() => {
                    // Extracted with no pod is the one state not in use.
                    if state == CacheState::Extracted && pods == 0 {
                        counts.node_not_in_use_cnt += 1;
                    } else {
                        counts.node_in_use_cnt += 1;
                    }
                }
                Some(CacheState::Error | CacheState::NoNamespace) => counts.node_error_cnt += 1,
                Some(CacheState::Incompatible) => counts.node_incompatible_cnt += 1,
                Some(CacheState::Downloading) => downloading = true,
                Some(
                    CacheState::Pending
                    | CacheState::Deleting
                    // On the node: counted above.
                    | CacheState::Extracted
                    | CacheState::Running
                    | CacheState::Outdated,
                )
                | None => {}
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

/// What the workloads on writable views of `resolved` compiled, across the
/// nodes: each node's counts of a workload added up ([`add_usage`]), the
/// nodes counted; `None` when no node counted any.
pub fn workload_usage<'a>(
    resolved: &str,
    nodes: impl IntoIterator<Item = &'a NodeEntries>,
) -> Option<Vec<WorkloadUsage>> {
    let mut usage = Vec::new();
    for entries in nodes {
        let on_node = entries
            .iter()
            .filter(|(digest, _)| digest == resolved)
            .filter_map(|(_, entry)| entry.workloads.as_deref());
        for workload in on_node.flatten() {
            add_usage(
                &mut usage,
                WorkloadUsage {
                    nodes: Some(1),
                    ..workload.clone()
                },
            );
        }
    }
    (!usage.is_empty()).then_some(usage)
}

/// The status's `variants` of a multi-target image resolved to `resolved`
/// with these `variants` (as published in its release) and `held` nodes per
/// variant ([`variant_nodes`]); `None` for a single-target image (its one
/// variant is `resolved` itself).
pub fn variant_status(
    resolved: &str,
    variants: &[ImageVariant],
    held: &BTreeMap<u64, i32>,
) -> Option<Vec<VariantNodes>> {
    if variants.is_empty() || variants.iter().any(|v| v.digest == resolved) {
        return None;
    }
    Some(
        variants
            .iter()
            .map(|v| VariantNodes {
                digest: v.digest.clone(),
                targets: v
                    .summary()
                    .map(|s| s.targets.iter().map(ToString::to_string).collect())
                    .unwrap_or_default(),
                nodes: variant_key(&v.digest)
                    .and_then(|k| held.get(&k).copied())
                    .unwrap_or(0),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gkm_k8s_api::crd::NodeCacheStatus;
    use gkm_k8s_api::crd::PodData;

    fn entry(state: CacheState, pods: u32) -> Entry {
        Entry {
            state: Some(state),
            pods,
            ..Entry::default()
        }
    }

    fn node(entries: &[(&str, Entry)]) -> NodeEntries {
        entries
            .iter()
            .map(|(d, e)| (d.to_string(), e.clone()))
            .collect()
    }

    #[test]
    fn an_entry_is_read_as_its_state_and_pod_count() {
        let reported = NodeCacheStatus {
            state: Some(CacheState::Running),
            message: Some("in use".into()),
            pods: Some(vec![PodData::default(), PodData::default()]),
            ..NodeCacheStatus::default()
        };
        let read = Entry {
            fit: gkm_k8s_api::NodeFit::Serves,
            ..entry(CacheState::Running, 2)
        };
        assert_eq!(Entry::from(&reported), read);
        assert_eq!(Entry::from(&NodeCacheStatus::default()), Entry::default());
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

    #[test]
    fn each_variant_counts_the_nodes_holding_it_for_the_resolved_index() {
        let v75 = "sha256:7575757575757575757575757575757575757575757575757575757575757575";
        let v90 = "sha256:9090909090909090909090909090909090909090909090909090909090909090";
        let holding = |state, variant: &str| Entry {
            variant: variant_key(variant),
            ..entry(state, 0)
        };
        let nodes = [
            node(&[("sha256:index", holding(CacheState::Running, v75))]),
            node(&[("sha256:index", holding(CacheState::Extracted, v90))]),
            node(&[("sha256:index", holding(CacheState::Extracted, v90))]),
            // Still pulling, or on an older index: not counted.
            node(&[("sha256:index", holding(CacheState::Downloading, v90))]),
            node(&[("sha256:old", holding(CacheState::Extracted, v75))]),
        ];
        let held = variant_nodes("sha256:index", &nodes);
        assert_eq!(
            held,
            BTreeMap::from([
                (variant_key(v75).unwrap(), 1),
                (variant_key(v90).unwrap(), 2)
            ])
        );
        assert_eq!(variant_key("not-a-digest"), None);

        let published = [v75, v90].map(|digest| ImageVariant {
            digest: digest.into(),
            targets: Vec::new(),
            cpu_isa: None,
        });
        let status = variant_status("sha256:index", &published, &held).unwrap();
        assert_eq!(status.iter().map(|v| v.nodes).collect::<Vec<_>>(), [1, 2]);
        // A single-target image is its own variant: no per-variant counts.
        assert_eq!(variant_status(v75, &published[..1], &held), None);
    }

    #[test]
    fn a_workloads_counts_add_up_across_the_nodes_for_the_resolved_digest_only() {
        let usage = |pods: i32, new: i64, second: i64| WorkloadUsage {
            pods_ended: pods,
            new_entries: new,
            ..WorkloadUsage::of(
                "ml",
                "Deployment/serve",
                "triton",
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::from_second(second).unwrap(),
                ),
            )
        };
        let with = |workloads: Vec<WorkloadUsage>| Entry {
            workloads: Some(workloads.into()),
            ..entry(CacheState::Extracted, 0)
        };
        let n1 = node(&[("sha256:new", with(vec![usage(2, 3, 10)]))]);
        let n2 = node(&[
            ("sha256:new", with(vec![usage(1, 1, 20)])),
            ("sha256:old", with(vec![usage(5, 9, 30)])),
        ]);
        let rolled = workload_usage("sha256:new", [&n1, &n2]).unwrap();
        assert_eq!(rolled.len(), 1);
        let serve = &rolled[0];
        assert_eq!((serve.pods_ended, serve.nodes), (3, Some(2)));
        // The pod that ended last (on n2) says the workload's misses.
        assert_eq!(serve.new_entries, 1);
        assert_eq!(workload_usage("sha256:other", [&n1, &n2]), None);
    }
}
