//! A cache's status, decided from what a reconcile fetched: pure, so every
//! state and condition is tested without a cluster. The reconcile fetches
//! (resolution, verdict, node reports, claims), calls [`desired`] (or
//! [`deleting`]), and writes the result once.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::cache::pvc::ClaimsOutcome;
use gkm_k8s_api::conditions::{Cond, merge};
use gkm_k8s_api::crd::{CacheCounts, CacheState, CacheStatus, VerificationStatus, WorkloadUsage};
use gkm_k8s_api::workloads::is_inert;

/// Everything a cache's status is decided from.
pub(super) struct Observed<'a> {
    /// The cache's `metadata.generation`.
    pub generation: Option<i64>,
    /// The status written before.
    pub old: &'a CacheStatus,
    /// Why `spec.resolveInterval` was not used as written, if it was not.
    pub interval_note: Option<String>,
    /// The resolved image, or why `spec.image` could not be resolved.
    pub resolution: Result<Resolved, String>,
}

/// What is known about a resolved image.
pub(super) struct Resolved {
    /// The digest the tag resolves to.
    pub digest: String,
    /// The signature verdict for it.
    pub verification: VerificationStatus,
    /// The node reports rolled up for it ([`super::rollup::rollup`]).
    pub nodes: (CacheCounts, CacheState),
    /// Of a multi-target image, the nodes holding each variant
    /// ([`super::rollup::variant_nodes`]).
    pub variant_nodes: std::collections::BTreeMap<u64, i32>,
    /// What the workloads on writable views of the digest compiled, across
    /// the nodes ([`super::rollup::workload_usage`]).
    pub workloads: Option<Vec<WorkloadUsage>>,
    /// The claims, when the cache is (or was) in PVC mode.
    pub claims: Option<Claims>,
    /// When the tag's digest is not followed ([`super::tag_follow`]): the
    /// `TagFollowed` condition's reason and message.
    pub hold: Option<(&'static str, String)>,
}

/// What the PVC-mode reconcile found.
pub(super) struct Claims {
    /// Whether the cache is in PVC mode now (rather than leaving it).
    pub pvc_mode: bool,
    /// Its claims, Jobs and pods.
    pub outcome: ClaimsOutcome,
}

/// The status `observed` calls for. `lastUpdated` is the old one: the write
/// sets it when anything else changed.
pub(super) fn desired(observed: &Observed<'_>) -> CacheStatus {
    let old = observed.old;
    let mut status = CacheStatus {
        observed_generation: observed.generation,
        ..old.clone()
    };
    let mut wanted = Vec::new();
    match &observed.resolution {
        Err(message) => {
            status.state = Some(CacheState::Error);
            wanted.push(Cond {
                type_: "Ready",
                status: false,
                reason: "ResolveFailed",
                message: message.clone(),
            });
        }
        Ok(resolved) => {
            let digest = &resolved.digest;
            let verification = &resolved.verification;
            let ok = verification.is_deliverable();
            let (mut counts, mut state) = resolved.nodes;
            if let Some(claims) = &resolved.claims {
                state = claims.outcome.state.unwrap_or(state);
                if claims.pvc_mode {
                    counts.pod_running_cnt = claims.outcome.pods_running;
                    counts.pod_outdated_cnt = claims.outcome.pods_outdated;
                }
                status.pvc_owner = claims.outcome.owner;
                status.pvc_status = claims.outcome.pvc_status.clone();
            }
            status.resolved_digest = Some(digest.clone());
            status.state = Some(if ok { state } else { CacheState::Error });
            status.counts = counts;
            status.verification = Some(verification.clone());
            wanted.push(Cond {
                type_: "Verified",
                status: verification.verified,
                reason: if verification.verified {
                    "SignatureVerified"
                } else if ok {
                    "NotEnforced"
                } else {
                    "VerificationFailed"
                },
                message: verification.message.clone().unwrap_or_default(),
            });
            let holding = counts.node_in_use_cnt + counts.node_not_in_use_cnt;
            let ready = ok && holding > 0;
            wanted.push(Cond {
                type_: "Ready",
                status: ready,
                reason: if !ok {
                    "NotVerified"
                } else if ready {
                    "Extracted"
                } else {
                    "NoNodeReady"
                },
                message: format!("{holding} of {} nodes hold {digest}", counts.node_cnt),
            });
            status.workloads = resolved.workloads.clone();
            wanted.push(inert(digest, resolved.workloads.as_deref()));
            if let Some((reason, message)) = &resolved.hold {
                wanted.push(Cond {
                    type_: "TagFollowed",
                    status: false,
                    reason,
                    message: message.clone(),
                });
            }
            wanted.push(Cond {
                type_: "Degraded",
                status: !ok || counts.node_error_cnt > 0,
                reason: if !ok {
                    "NotVerified"
                } else if counts.node_error_cnt > 0 {
                    "NodeErrors"
                } else {
                    "AsExpected"
                },
                message: format!(
                    "{} nodes report an error; {} have no GPU the cache fits",
                    counts.node_error_cnt, counts.node_incompatible_cnt
                ),
            });
        }
    }
    if let Some(message) = &observed.interval_note {
        wanted.push(Cond {
            type_: "ResolveIntervalValid",
            status: false,
            reason: "OutOfBounds",
            message: message.clone(),
        });
    }
    status.conditions = Some(merge(
        old.conditions.as_deref(),
        wanted,
        observed.generation,
    ));
    status
}

/// The `Inert` condition: whether a workload on a writable view of `digest`
/// compiles more than the cache holds ([`is_inert`]), naming the first such
/// workload, its new entries and what to do; false when every workload
/// counted hits at least as much, or while none was counted (read-only
/// volumes, PVCs and image volumes cannot see misses).
fn inert<'a>(digest: &str, workloads: Option<&[WorkloadUsage]>) -> Cond<'a> {
    let workloads = workloads.unwrap_or_default();
    if let Some(first) = workloads.iter().find(|w| is_inert(w)) {
        let others = workloads.iter().filter(|w| is_inert(w)).count() - 1;
        let names = if first.new_entry_names.is_empty() {
            String::new()
        } else {
            format!(" ({})", counted_names(&first.new_entry_names).join(", "))
        };
        return Cond {
            type_: "Inert",
            status: true,
            reason: "WorkloadsCompile",
            message: format!(
                "the last pod of {} in {} compiled {} new entries{names}, more than the {} entries {digest} holds{}: {}",
                first.workload,
                first.namespace,
                first.new_entries,
                first.entries_delivered.unwrap_or_default(),
                if others > 0 {
                    format!("; {others} more workloads compile more than it holds")
                } else {
                    String::new()
                },
                match first.reasons.first() {
                    Some(reason) => reason.clone(),
                    None => "`gkm explain` on its tree names what differs (another version, GPU target or compile option); capture this workload or rebuild the cache for it".to_string(),
                },
            ),
        };
    }
    if workloads.is_empty() {
        return Cond {
            type_: "Inert",
            status: false,
            reason: "NotCounted",
            message: format!(
                "no pod's writable view of {digest} has ended yet: only writable CSI views count misses (read-only volumes, PVCs and image volumes cannot see them)"
            ),
        };
    }
    let compiled: i64 = workloads.iter().map(|w| w.new_entries).sum();
    Cond {
        type_: "Inert",
        status: false,
        reason: "WorkloadsHit",
        message: format!(
            "{} workloads counted; their last pods compiled {compiled} new entries in all, none more than {digest} holds",
            workloads.len()
        ),
    }
}

/// `names` once each, in their order, with how many times each came
/// (`scaled_add_kernel ×3`).
fn counted_names(names: &[String]) -> Vec<String> {
    let mut counted: Vec<(&str, usize)> = Vec::new();
    for name in names {
        match counted.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => *count += 1,
            None => counted.push((name, 1)),
        }
    }
    counted
        .into_iter()
        .map(|(name, count)| match count {
            1 => name.to_string(),
            n => format!("{name} ×{n}"),
        })
        .collect()
}

/// The status of a cache being deleted: `Deleting`, with the counts of the
/// nodes that still report it (`reporting` of them) and `Ready` false; the
/// other conditions stay as they were.
pub(super) fn deleting(
    old: &CacheStatus,
    generation: Option<i64>,
    counts: CacheCounts,
    reporting: usize,
) -> CacheStatus {
    let ready = Cond {
        type_: "Ready",
        status: false,
        reason: "Deleting",
        message: format!(
            "deleting: {reporting} nodes still report the cache; {} pods use it",
            counts.pod_deleting_cnt
        ),
    };
    let existing = old.conditions.as_deref();
    let ready = merge(existing, vec![ready], generation);
    let mut conditions: Vec<Condition> = existing
        .unwrap_or(&[])
        .iter()
        .filter(|c| c.type_ != "Ready")
        .cloned()
        .collect();
    conditions.extend(ready);
    CacheStatus {
        state: Some(CacheState::Deleting),
        counts,
        conditions: Some(conditions),
        observed_generation: generation,
        ..old.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use gkm_k8s_api::crd::{PvcOwner, PvcStatus, SignatureMode};

    const DIGEST: &str = "sha256:abc";

    fn verified() -> VerificationStatus {
        VerificationStatus {
            verified: true,
            deliverable: Some(true),
            mode: Some(SignatureMode::Enforce),
            digest: Some(DIGEST.into()),
            message: Some("signed by k".into()),
            ..VerificationStatus::default()
        }
    }

    fn audited() -> VerificationStatus {
        VerificationStatus {
            verified: false,
            deliverable: Some(true),
            mode: Some(SignatureMode::Audit),
            message: Some("no signature".into()),
            ..verified()
        }
    }

    fn refused() -> VerificationStatus {
        VerificationStatus {
            verified: false,
            deliverable: Some(false),
            message: Some("no signature".into()),
            ..verified()
        }
    }

    fn counts(nodes: i32, in_use: i32, idle: i32, errors: i32) -> CacheCounts {
        CacheCounts {
            node_cnt: nodes,
            node_in_use_cnt: in_use,
            node_not_in_use_cnt: idle,
            node_error_cnt: errors,
            ..CacheCounts::default()
        }
    }

    fn resolved(verification: VerificationStatus, nodes: (CacheCounts, CacheState)) -> Resolved {
        Resolved {
            digest: DIGEST.into(),
            verification,
            nodes,
            variant_nodes: Default::default(),
            workloads: None,
            claims: None,
            hold: None,
        }
    }

    fn compiled(workload: &str, new: i64) -> WorkloadUsage {
        WorkloadUsage {
            pods_ended: 3,
            pods_compiling: 1,
            entries_delivered: Some(7),
            new_entries: new,
            new_entry_names: vec!["add_kernel".into(), "mul_kernel".into(), "add_kernel".into()],
            reasons: vec!["the workload compiles add_kernel for target.arch 80, the cache holds 75: rebuild the cache for the workload's GPU".into()],
            nodes: Some(1),
            ..WorkloadUsage::of(
                "ml",
                workload,
                "triton",
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
            )
        }
    }

    #[test]
    fn a_workload_compiling_more_than_the_cache_holds_makes_it_inert_naming_it() {
        let with = |workloads: Option<Vec<WorkloadUsage>>| {
            let resolved = Resolved {
                workloads,
                ..resolved(verified(), (counts(1, 1, 0, 0), CacheState::Running))
            };
            decide(Ok(resolved), None)
        };
        let uncounted = with(None);
        assert_eq!(condition(&uncounted, "Inert"), is("False", "NotCounted"));
        let message = uncounted.conditions.unwrap_or_default();
        let message = &message.iter().find(|c| c.type_ == "Inert").unwrap().message;
        assert!(message.contains("read-only volumes"), "{message}");

        let hits = with(Some(vec![compiled("Job/a", 2)]));
        assert_eq!(condition(&hits, "Inert"), is("False", "WorkloadsHit"));
        assert_eq!(hits.workloads.as_ref().map(Vec::len), Some(1));

        let inert = with(Some(vec![
            compiled("Job/a", 2),
            compiled("Deployment/b", 9),
        ]));
        assert_eq!(condition(&inert, "Inert"), is("True", "WorkloadsCompile"));
        let conditions = inert.conditions.clone().unwrap_or_default();
        let message = &conditions
            .iter()
            .find(|c| c.type_ == "Inert")
            .unwrap()
            .message;
        assert!(
            message.starts_with("the last pod of Deployment/b in ml compiled 9 new entries (add_kernel ×2, mul_kernel), more than the 7 entries sha256:abc holds"),
            "{message}"
        );
        // The first reason says what to change.
        assert!(
            message.ends_with("rebuild the cache for the workload's GPU"),
            "{message}"
        );
        // Still Ready: an inert cache is delivered, it just does not serve.
        assert_eq!(condition(&inert, "Ready"), is("True", "Extracted"));
    }

    #[test]
    fn a_tag_not_followed_is_a_condition_while_the_served_digest_stays_ready() {
        let held = Resolved {
            hold: Some(("NotVerified", "the tag now points at sha256:b".into())),
            ..resolved(verified(), (counts(1, 0, 1, 0), CacheState::Extracted))
        };
        let status = decide(Ok(held), None);
        assert_eq!(status.state, Some(CacheState::Extracted));
        assert_eq!(status.resolved_digest.as_deref(), Some(DIGEST));
        let conditions = status.conditions.unwrap_or_default();
        let tag = conditions.iter().find(|c| c.type_ == "TagFollowed");
        assert_eq!(
            tag.map(|c| (c.status.as_str(), c.reason.as_str())),
            Some(("False", "NotVerified"))
        );
        let followed = decide(
            Ok(resolved(
                verified(),
                (counts(1, 0, 1, 0), CacheState::Extracted),
            )),
            None,
        );
        assert!(
            !followed
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "TagFollowed")
        );
    }

    fn decide(resolution: Result<Resolved, String>, note: Option<&str>) -> CacheStatus {
        desired(&Observed {
            generation: Some(3),
            old: &CacheStatus::default(),
            interval_note: note.map(str::to_string),
            resolution,
        })
    }

    /// `(status, reason)` of the condition `type_`.
    fn condition(status: &CacheStatus, type_: &str) -> Option<(String, String)> {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.clone(), c.reason.clone()))
    }

    fn is(value: &str, reason: &str) -> Option<(String, String)> {
        Some((value.to_string(), reason.to_string()))
    }

    #[test]
    fn each_observation_gives_its_state_conditions_and_counts() {
        struct Row {
            what: &'static str,
            resolution: Result<Resolved, String>,
            state: CacheState,
            /// `(type, status, reason)` that must be present.
            conditions: &'static [(&'static str, &'static str, &'static str)],
            node_counts: (i32, i32, i32, i32),
        }
        let rows = vec![
            Row {
                what: "the tag does not resolve",
                resolution: Err("resolving r/c:v1: not found".into()),
                state: CacheState::Error,
                conditions: &[("Ready", "False", "ResolveFailed")],
                node_counts: (0, 0, 0, 0),
            },
            Row {
                what: "verified, extracted on one of two nodes",
                resolution: Ok(resolved(
                    verified(),
                    (counts(2, 0, 1, 0), CacheState::Extracted),
                )),
                state: CacheState::Extracted,
                conditions: &[
                    ("Verified", "True", "SignatureVerified"),
                    ("Ready", "True", "Extracted"),
                    ("Degraded", "False", "AsExpected"),
                ],
                node_counts: (2, 0, 1, 0),
            },
            Row {
                what: "verified and used by a pod",
                resolution: Ok(resolved(
                    verified(),
                    (counts(1, 1, 0, 0), CacheState::Running),
                )),
                state: CacheState::Running,
                conditions: &[("Ready", "True", "Extracted")],
                node_counts: (1, 1, 0, 0),
            },
            Row {
                what: "pods on an older digest",
                resolution: Ok(resolved(
                    verified(),
                    (counts(1, 1, 0, 0), CacheState::Outdated),
                )),
                state: CacheState::Outdated,
                conditions: &[("Ready", "True", "Extracted")],
                node_counts: (1, 1, 0, 0),
            },
            Row {
                what: "verified, no node has it yet",
                resolution: Ok(resolved(
                    verified(),
                    (counts(2, 0, 0, 0), CacheState::Downloading),
                )),
                state: CacheState::Downloading,
                conditions: &[
                    ("Ready", "False", "NoNodeReady"),
                    ("Degraded", "False", "AsExpected"),
                ],
                node_counts: (2, 0, 0, 0),
            },
            Row {
                what: "verified, nothing reported",
                resolution: Ok(resolved(
                    verified(),
                    (CacheCounts::default(), CacheState::Pending),
                )),
                state: CacheState::Pending,
                conditions: &[("Ready", "False", "NoNodeReady")],
                node_counts: (0, 0, 0, 0),
            },
            Row {
                what: "verified, it fits no node's GPU",
                resolution: Ok(resolved(
                    verified(),
                    (
                        CacheCounts {
                            node_cnt: 2,
                            node_incompatible_cnt: 2,
                            ..CacheCounts::default()
                        },
                        CacheState::Incompatible,
                    ),
                )),
                state: CacheState::Incompatible,
                conditions: &[
                    ("Ready", "False", "NoNodeReady"),
                    ("Degraded", "False", "AsExpected"),
                ],
                node_counts: (2, 0, 0, 0),
            },
            Row {
                what: "verified, a node failed",
                resolution: Ok(resolved(
                    verified(),
                    (counts(2, 0, 1, 1), CacheState::Extracted),
                )),
                state: CacheState::Extracted,
                conditions: &[
                    ("Ready", "True", "Extracted"),
                    ("Degraded", "True", "NodeErrors"),
                ],
                node_counts: (2, 0, 1, 1),
            },
            Row {
                what: "verified, every node failed",
                resolution: Ok(resolved(
                    verified(),
                    (counts(1, 0, 0, 1), CacheState::Error),
                )),
                state: CacheState::Error,
                conditions: &[
                    ("Ready", "False", "NoNodeReady"),
                    ("Degraded", "True", "NodeErrors"),
                ],
                node_counts: (1, 0, 0, 1),
            },
            Row {
                what: "unsigned under Audit: delivered, not verified",
                resolution: Ok(resolved(
                    audited(),
                    (counts(1, 0, 1, 0), CacheState::Extracted),
                )),
                state: CacheState::Extracted,
                conditions: &[
                    ("Verified", "False", "NotEnforced"),
                    ("Ready", "True", "Extracted"),
                ],
                node_counts: (1, 0, 1, 0),
            },
            Row {
                what: "unsigned under Enforce: an error whatever the nodes say",
                resolution: Ok(resolved(
                    refused(),
                    (counts(1, 0, 1, 0), CacheState::Extracted),
                )),
                state: CacheState::Error,
                conditions: &[
                    ("Verified", "False", "VerificationFailed"),
                    ("Ready", "False", "NotVerified"),
                    ("Degraded", "True", "NotVerified"),
                ],
                node_counts: (1, 0, 1, 0),
            },
        ];
        for row in rows {
            let status = decide(row.resolution, None);
            assert_eq!(status.state, Some(row.state), "{}", row.what);
            for (type_, value, reason) in row.conditions {
                assert_eq!(
                    condition(&status, type_),
                    is(value, reason),
                    "{}: {type_}",
                    row.what
                );
            }
            let c = status.counts;
            assert_eq!(
                (
                    c.node_cnt,
                    c.node_in_use_cnt,
                    c.node_not_in_use_cnt,
                    c.node_error_cnt
                ),
                row.node_counts,
                "{}",
                row.what
            );
            assert_eq!(status.observed_generation, Some(3), "{}", row.what);
            assert!(
                condition(&status, "ResolveIntervalValid").is_none(),
                "{}",
                row.what
            );
        }
    }

    #[test]
    fn a_resolve_failure_keeps_the_last_digest_and_verdict() {
        let old = decide(
            Ok(resolved(
                verified(),
                (counts(1, 0, 1, 0), CacheState::Extracted),
            )),
            None,
        );
        let status = desired(&Observed {
            generation: Some(4),
            old: &old,
            interval_note: None,
            resolution: Err("registry down".into()),
        });
        assert_eq!(status.state, Some(CacheState::Error));
        assert_eq!(status.resolved_digest.as_deref(), Some(DIGEST));
        assert_eq!(status.verification, old.verification);
        assert_eq!(status.counts, old.counts);
        let types: Vec<_> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| &c.type_)
            .collect();
        assert_eq!(types, ["Ready"], "only what is known now is claimed");
    }

    #[test]
    fn an_interval_out_of_bounds_is_a_condition_whatever_else_holds() {
        let note = Some("resolveInterval \"1s\" is below the minimum; using 10s");
        for resolution in [
            Err("down".to_string()),
            Ok(resolved(
                verified(),
                (counts(1, 0, 1, 0), CacheState::Extracted),
            )),
        ] {
            let status = decide(resolution, note);
            assert_eq!(
                condition(&status, "ResolveIntervalValid"),
                is("False", "OutOfBounds")
            );
        }
    }

    #[test]
    fn pvc_claims_decide_the_state_and_pod_counts_and_leaving_pvc_mode_clears_them() {
        let pvc = BTreeMap::from([("team".to_string(), PvcStatus::default())]);
        let with_claims = |pvc_mode: bool, outcome: ClaimsOutcome| Resolved {
            claims: Some(Claims { pvc_mode, outcome }),
            ..resolved(verified(), (counts(1, 0, 1, 0), CacheState::Extracted))
        };
        let filling = ClaimsOutcome {
            state: Some(CacheState::Downloading),
            owner: Some(PvcOwner::Operator),
            pvc_status: Some(pvc.clone()),
            pods_running: 2,
            pods_outdated: 1,
        };
        let status = decide(Ok(with_claims(true, filling)), None);
        assert_eq!(status.state, Some(CacheState::Downloading));
        assert_eq!(
            (
                status.counts.pod_running_cnt,
                status.counts.pod_outdated_cnt
            ),
            (2, 1)
        );
        assert_eq!(status.pvc_owner, Some(PvcOwner::Operator));
        assert_eq!(status.pvc_status, Some(pvc));

        // Back in CSI mode: the claims are gone, and so are their fields.
        let left = desired(&Observed {
            generation: Some(4),
            old: &status,
            interval_note: None,
            resolution: Ok(with_claims(false, ClaimsOutcome::default())),
        });
        assert_eq!(left.state, Some(CacheState::Extracted));
        assert_eq!((left.pvc_owner, left.pvc_status), (None, None));
        assert_eq!(left.counts.pod_running_cnt, 0);

        // A refused image is an error in PVC mode too.
        let refused_pvc = Resolved {
            verification: refused(),
            ..with_claims(
                true,
                ClaimsOutcome {
                    state: Some(CacheState::Pending),
                    ..ClaimsOutcome::default()
                },
            )
        };
        assert_eq!(decide(Ok(refused_pvc), None).state, Some(CacheState::Error));
    }

    #[test]
    fn an_unchanged_observation_decides_an_equal_status() {
        let observe = |old: &CacheStatus| {
            desired(&Observed {
                generation: Some(3),
                old,
                interval_note: None,
                resolution: Ok(resolved(
                    verified(),
                    (counts(1, 0, 1, 0), CacheState::Extracted),
                )),
            })
        };
        let first = observe(&CacheStatus::default());
        assert_eq!(observe(&first), first, "nothing to write the second time");
    }

    #[test]
    fn deleting_counts_the_nodes_left_and_keeps_the_other_conditions() {
        let old = decide(
            Ok(resolved(
                verified(),
                (counts(1, 1, 0, 0), CacheState::Running),
            )),
            None,
        );
        let left = CacheCounts {
            node_cnt: 1,
            pod_deleting_cnt: 2,
            ..CacheCounts::default()
        };
        let status = deleting(&old, Some(4), left, 1);
        assert_eq!(status.state, Some(CacheState::Deleting));
        assert_eq!(status.counts.pod_deleting_cnt, 2);
        assert_eq!(condition(&status, "Ready"), is("False", "Deleting"));
        assert_eq!(
            condition(&status, "Verified"),
            is("True", "SignatureVerified")
        );
        assert_eq!(status.resolved_digest.as_deref(), Some(DIGEST));
        assert_eq!(
            deleting(&status, Some(4), left, 1),
            status,
            "no write while nothing changes"
        );
    }
}
