//! A PVC-mode cache's status from what its claims' Jobs and pods show:
//! pure, so the states and conditions are tested without a cluster.
//! [`super::apply`] reads the facts and writes the fills.

use std::collections::BTreeMap;

use gkm_k8s_api::cache_object::CacheKey;
use gkm_k8s_api::conditions::{Cond, merge};
use gkm_k8s_api::crd::{CacheState, PvcOwner, PvcStatus};

use super::ClaimsOutcome;
use super::plan::{ClaimPlan, Plan, PvcMode};

/// Where a claim's fill Job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// It completed: the claim holds the digest.
    Done,
    /// It failed past its retries.
    Failed,
    /// Not (yet) either, or no Job.
    Pending,
}

impl Fill {
    /// Where a fill Job with `status` stands (no status: pending).
    pub fn of(status: Option<&k8s_openapi::api::batch::v1::JobStatus>) -> Fill {
        if status.and_then(|s| s.succeeded).unwrap_or(0) > 0 {
            Fill::Done
        } else if status.and_then(|s| s.failed).unwrap_or(0) > FAILED_AFTER {
            Fill::Failed
        } else {
            Fill::Pending
        }
    }
}

/// What one namespace's claims show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceFacts {
    /// Per claim name, its fill.
    pub fills: BTreeMap<String, Fill>,
    /// Pods using the claims, started after their last refill.
    pub pods_running: i32,
    /// Pods using a claim refilled after they started.
    pub pods_outdated: i32,
}

/// The Jobs that failed past their retries count as failed after this many
/// failed pods.
pub const FAILED_AFTER: i32 = 4;

/// The cache's PVC status: per namespace its claim, volume, Job and a
/// `Ready` condition (keeping its transition time from `previous`), the
/// pod counts, and the state the Status column shows.
pub fn claims_status(
    key: &CacheKey,
    mode: PvcMode,
    wanted: &Plan,
    digest: Option<&str>,
    previous: Option<&BTreeMap<String, PvcStatus>>,
    facts: &BTreeMap<String, NamespaceFacts>,
) -> ClaimsOutcome {
    let owner = match mode {
        PvcMode::ReadOnlyMany => PvcOwner::Operator,
        PvcMode::ReadWriteOnce => PvcOwner::Agent,
    };
    let mut by_namespace: BTreeMap<&str, Vec<&ClaimPlan>> = BTreeMap::new();
    for claim in &wanted.claims {
        by_namespace
            .entry(&claim.namespace)
            .or_default()
            .push(claim);
    }
    let mut out = ClaimsOutcome {
        owner: Some(owner),
        ..ClaimsOutcome::default()
    };
    let mut status = BTreeMap::new();
    let (mut filled, mut failed, mut total) = (0, 0, 0);
    let none = NamespaceFacts::default();
    for (namespace, claims) in &by_namespace {
        let seen = facts.get(*namespace).unwrap_or(&none);
        let mut done = 0;
        let mut message = Vec::new();
        for claim in claims {
            total += 1;
            let Some(job_name) = &claim.job else { continue };
            match seen.fills.get(&claim.name) {
                Some(Fill::Done) => done += 1,
                Some(Fill::Failed) => {
                    failed += 1;
                    message.push(format!("Job {job_name} failed"));
                }
                Some(Fill::Pending) | None => {}
            }
        }
        filled += done;
        out.pods_running += seen.pods_running;
        out.pods_outdated += seen.pods_outdated;
        let ready = done == claims.len() && !claims.is_empty();
        let condition = Cond {
            type_: "Ready",
            status: ready,
            reason: if ready {
                "Filled"
            } else if wanted.withheld.is_some() {
                "Withheld"
            } else {
                "Filling"
            },
            message: wanted.withheld.clone().unwrap_or_else(|| {
                let mut m = format!("{done} of {} claims filled", claims.len());
                for extra in &message {
                    m.push_str("; ");
                    m.push_str(extra);
                }
                m
            }),
        };
        let existing = previous
            .and_then(|p| p.get(*namespace))
            .and_then(|p| p.conditions.as_deref());
        let single = (claims.len() == 1).then(|| claims[0]);
        status.insert(
            namespace.to_string(),
            PvcStatus {
                pv_name: single.and_then(|c| c.volume.clone()),
                pvc_name: Some(single.map_or(key.name().to_string(), |c| c.name.clone())),
                job_name: single.and_then(|c| c.job.clone()),
                pvc_owner: Some(owner),
                conditions: Some(merge(existing, vec![condition], None)),
            },
        );
    }
    out.pvc_status = Some(status);
    out.state = if !wanted.missing_namespaces.is_empty() {
        Some(CacheState::NoNamespace)
    } else if wanted.withheld.is_some() {
        // Not filled on purpose: the verdict or the nodes' reports say why,
        // and the node rollup's state stands.
        None
    } else if failed > 0 {
        Some(CacheState::Error)
    } else if out.pods_outdated > 0 {
        Some(CacheState::Outdated)
    } else if total > 0 && filled == total && out.pods_running > 0 {
        Some(CacheState::Running)
    } else if total > 0 && filled == total {
        Some(CacheState::Extracted)
    } else if digest.is_some() && total > 0 {
        Some(CacheState::Downloading)
    } else {
        Some(CacheState::Pending)
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn a_jobs_fill_is_done_failed_past_its_retries_or_pending() {
        use k8s_openapi::api::batch::v1::JobStatus;
        let status = |succeeded, failed| JobStatus {
            succeeded: Some(succeeded),
            failed: Some(failed),
            ..JobStatus::default()
        };
        assert_eq!(Fill::of(None), Fill::Pending);
        assert_eq!(Fill::of(Some(&status(0, FAILED_AFTER))), Fill::Pending);
        assert_eq!(Fill::of(Some(&status(0, FAILED_AFTER + 1))), Fill::Failed);
        assert_eq!(Fill::of(Some(&status(1, FAILED_AFTER + 1))), Fill::Done);
    }

    fn claim(namespace: &str, name: &str) -> ClaimPlan {
        ClaimPlan {
            namespace: namespace.into(),
            name: name.into(),
            node: None,
            volume: None,
            job: Some(format!("{name}-fill")),
            fill_digest: None,
        }
    }

    fn plan(claims: Vec<ClaimPlan>) -> Plan {
        Plan {
            claims,
            ..Plan::default()
        }
    }

    fn facts(
        fills: &[(&str, &str, Fill)],
        running: i32,
        outdated: i32,
    ) -> BTreeMap<String, NamespaceFacts> {
        let mut out: BTreeMap<String, NamespaceFacts> = BTreeMap::new();
        for (namespace, claim, fill) in fills {
            let seen = out.entry(namespace.to_string()).or_default();
            seen.fills.insert(claim.to_string(), *fill);
            seen.pods_running = running;
            seen.pods_outdated = outdated;
        }
        out
    }

    fn state(wanted: &Plan, facts: &BTreeMap<String, NamespaceFacts>) -> Option<CacheState> {
        let key = CacheKey::namespaced("team", "vector-add");
        claims_status(
            &key,
            PvcMode::ReadOnlyMany,
            wanted,
            Some(DIGEST),
            None,
            facts,
        )
        .state
    }

    #[test]
    fn the_state_follows_the_fills_and_the_pods() {
        let wanted = plan(vec![claim("a", "kernels"), claim("b", "kernels")]);
        let cases = [
            (facts(&[], 0, 0), CacheState::Downloading),
            (
                facts(&[("a", "kernels", Fill::Done)], 0, 0),
                CacheState::Downloading,
            ),
            (
                facts(
                    &[("a", "kernels", Fill::Done), ("b", "kernels", Fill::Done)],
                    0,
                    0,
                ),
                CacheState::Extracted,
            ),
            (
                facts(
                    &[("a", "kernels", Fill::Done), ("b", "kernels", Fill::Done)],
                    1,
                    0,
                ),
                CacheState::Running,
            ),
            (
                facts(
                    &[("a", "kernels", Fill::Done), ("b", "kernels", Fill::Done)],
                    1,
                    1,
                ),
                CacheState::Outdated,
            ),
            (
                facts(
                    &[("a", "kernels", Fill::Failed), ("b", "kernels", Fill::Done)],
                    0,
                    0,
                ),
                CacheState::Error,
            ),
        ];
        for (seen, want) in cases {
            assert_eq!(state(&wanted, &seen), Some(want), "{seen:?}");
        }
    }

    #[test]
    fn missing_namespaces_and_withheld_fills_decide_first() {
        let mut missing = plan(vec![claim("a", "kernels")]);
        missing.missing_namespaces = vec!["gone".into()];
        let done = facts(&[("a", "kernels", Fill::Done)], 0, 0);
        assert_eq!(state(&missing, &done), Some(CacheState::NoNamespace));
        let mut withheld = plan(vec![claim("a", "kernels")]);
        withheld.withheld = Some("not verified".into());
        assert_eq!(
            state(&withheld, &done),
            None,
            "the node rollup's state stands"
        );
    }

    #[test]
    fn each_namespace_gets_a_ready_condition_that_keeps_its_transition_time() {
        let key = CacheKey::namespaced("team", "vector-add");
        let wanted = plan(vec![claim("a", "kernels")]);
        let failing = facts(&[("a", "kernels", Fill::Failed)], 0, 0);
        let first = claims_status(
            &key,
            PvcMode::ReadWriteOnce,
            &wanted,
            Some(DIGEST),
            None,
            &failing,
        );
        let status = first.pvc_status.clone().expect("pvc status");
        let a = &status["a"];
        assert_eq!(a.pvc_owner, Some(PvcOwner::Agent));
        assert_eq!(a.job_name.as_deref(), Some("kernels-fill"));
        let ready = &a.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Filling")
        );
        assert_eq!(
            ready.message,
            "0 of 1 claims filled; Job kernels-fill failed"
        );
        let again = claims_status(
            &key,
            PvcMode::ReadWriteOnce,
            &wanted,
            Some(DIGEST),
            Some(&status),
            &failing,
        );
        assert_eq!(
            again.pvc_status,
            Some(status),
            "unchanged: nothing new to write"
        );
    }
}
