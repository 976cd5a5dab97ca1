//! The workloads a cache serves and what they compiled that it should have
//! held: whose pods a pod's misses are counted under ([`Workload`], by
//! its controller), how one workload's counts add up across pods and nodes
//! ([`add_usage`]), and when a workload is one the cache does not serve
//! ([`is_inert`]). Pure: the agent and the operator both decide by it.
//!
//! ```
//! use gkm_k8s_api::crd::WorkloadUsage;
//! use gkm_k8s_api::workloads::{add_usage, is_inert};
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
//! let pod = |at: &str, new: i64| WorkloadUsage {
//!     pods_ended: 1,
//!     pods_compiling: i32::from(new > 0),
//!     entries_delivered: Some(7),
//!     new_entries: new,
//!     ..WorkloadUsage::of("ml", "Job/warmup", "triton", Time(at.parse().unwrap()))
//! };
//! let mut usage = Vec::new();
//! add_usage(&mut usage, pod("2026-12-01T10:00:00Z", 9));
//! add_usage(&mut usage, pod("2026-12-01T11:00:00Z", 2));
//! assert_eq!((usage[0].pods_ended, usage[0].pods_compiling), (2, 2));
//! // The last pod's misses are the workload's: 2 of at least 9 entries.
//! assert_eq!(usage[0].new_entries, 2);
//! assert!(!is_inert(&usage[0]));
//! assert!(is_inert(&pod("2026-12-01T10:00:00Z", 9)));
//! ```

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::crd::WorkloadUsage;

/// The most workloads a node report (or a cache's status) lists per digest:
/// the ones whose pods ended last.
pub const MAX_WORKLOADS: usize = 8;
/// The most new entries named per workload.
pub const MAX_NAMED: usize = 8;
/// The most reasons kept per workload.
pub const MAX_REASONS: usize = 3;
/// The longest entry name kept, in bytes (longer ones are cut, `…` added).
pub const MAX_NAME_BYTES: usize = 256;
/// The longest reason kept, in bytes.
pub const MAX_REASON_BYTES: usize = 512;

/// Whose pods a pod is: the workload its misses are counted under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Workload {
    /// Its kind (`Deployment`, `Job`, `Pod`…).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its uid, when known: Events about it name it.
    pub uid: Option<String>,
    /// Its API version (`apps/v1`, `v1`…).
    pub api_version: String,
}

impl Workload {
    /// A pod standing for itself (no controller, or none found).
    pub fn pod(name: &str, uid: Option<String>) -> Workload {
        Workload {
            kind: "Pod".into(),
            name: name.into(),
            uid,
            api_version: "v1".into(),
        }
    }

    /// The workload an owner reference names.
    pub fn of_owner(owner: &OwnerReference) -> Workload {
        Workload {
            kind: owner.kind.clone(),
            name: owner.name.clone(),
            uid: Some(owner.uid.clone()),
            api_version: owner.api_version.clone(),
        }
    }

    /// `Kind/name`, as reports and statuses name it.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// Whether this workload is usually run by a controller of its own,
    /// which is then the workload (a ReplicaSet by its Deployment, a Job by
    /// its CronJob): its controller is looked up.
    pub fn has_usual_controller(&self) -> bool {
        matches!(
            (self.api_version.as_str(), self.kind.as_str()),
            ("apps/v1", "ReplicaSet") | ("batch/v1", "Job")
        )
    }
}

/// The controller among `owners` (the reference with `controller: true`).
pub fn controller(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners.iter().find(|o| o.controller == Some(true))
}

/// Adds `next` (one pod's counts, or one node's of a workload) to `usage`:
/// the counts of pods add up, the last pod's misses (by `lastEnded`) are the
/// workload's, the nodes add up. Keeps the [`MAX_WORKLOADS`] workloads whose
/// pods ended last, most recent first, each naming at most [`MAX_NAMED`]
/// entries.
pub fn add_usage(usage: &mut Vec<WorkloadUsage>, mut next: WorkloadUsage) {
    next.new_entry_names.truncate(MAX_NAMED);
    next.reasons.truncate(MAX_REASONS);
    for name in &mut next.new_entry_names {
        clip(name, MAX_NAME_BYTES);
    }
    for reason in &mut next.reasons {
        clip(reason, MAX_REASON_BYTES);
    }
    match usage
        .iter_mut()
        .find(|u| u.namespace == next.namespace && u.workload == next.workload)
    {
        Some(known) => {
            let pods_ended = known.pods_ended.saturating_add(next.pods_ended);
            let pods_compiling = known.pods_compiling.saturating_add(next.pods_compiling);
            let nodes = match (known.nodes, next.nodes) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                (a, b) => a.or(b),
            };
            if next.last_ended.0 > known.last_ended.0 {
                *known = next;
            }
            known.pods_ended = pods_ended;
            known.pods_compiling = pods_compiling;
            known.nodes = nodes;
        }
        None => usage.push(next),
    }
    usage.sort_by(|a, b| {
        b.last_ended
            .0
            .cmp(&a.last_ended.0)
            .then_with(|| (&a.namespace, &a.workload).cmp(&(&b.namespace, &b.workload)))
    });
    usage.truncate(MAX_WORKLOADS);
}

/// Cuts `text` to at most `max` bytes, at a character boundary, ending it
/// with `…` when cut.
fn clip(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// Whether the cache does not serve `usage`'s workload: its last pod
/// compiled more new entries than the cache delivers, so whatever it hit,
/// most of what it used it compiled. A pod's hits cannot be seen (reads
/// leave no trace in a view); this bound holds whatever they were.
pub fn is_inert(usage: &WorkloadUsage) -> bool {
    usage
        .entries_delivered
        .is_some_and(|delivered| usage.new_entries > delivered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn usage(workload: &str, at: i64, new: i64) -> WorkloadUsage {
        WorkloadUsage {
            pods_ended: 1,
            pods_compiling: i32::from(new > 0),
            entries_delivered: Some(4),
            new_entries: new,
            new_entry_names: (0..new).map(|i| format!("kernel_{i}")).collect(),
            nodes: Some(1),
            ..WorkloadUsage::of(
                "ml",
                workload,
                "triton",
                Time(jiff::Timestamp::from_second(at).unwrap()),
            )
        }
    }

    #[test]
    fn a_workloads_counts_add_up_and_its_last_pod_says_its_misses() {
        let mut all = Vec::new();
        add_usage(&mut all, usage("Job/a", 20, 0));
        add_usage(&mut all, usage("Job/a", 10, 12));
        add_usage(&mut all, usage("Job/b", 15, 1));
        assert_eq!(all.len(), 2);
        let a = &all[0];
        assert_eq!(a.workload, "Job/a");
        assert_eq!((a.pods_ended, a.pods_compiling, a.nodes), (2, 1, Some(2)));
        // The pod that ended last hit everything: the workload is served.
        assert_eq!(a.new_entries, 0);
        assert!(!is_inert(a));
        assert_eq!(all[1].workload, "Job/b");
    }

    #[test]
    fn only_the_workloads_whose_pods_ended_last_are_kept_each_naming_a_few_entries() {
        let mut all = Vec::new();
        for i in 0..(MAX_WORKLOADS as i64 + 3) {
            add_usage(&mut all, usage(&format!("Job/w{i}"), i, 20));
        }
        assert_eq!(all.len(), MAX_WORKLOADS);
        assert_eq!(all[0].workload, format!("Job/w{}", MAX_WORKLOADS + 2));
        assert!(all.iter().all(|u| u.new_entry_names.len() == MAX_NAMED));
        assert!(!all.iter().any(|u| u.workload == "Job/w0"));
    }

    #[test]
    fn long_names_and_reasons_are_cut_at_a_character_boundary() {
        let mut all = Vec::new();
        add_usage(
            &mut all,
            WorkloadUsage {
                new_entry_names: vec!["é".repeat(MAX_NAME_BYTES)],
                reasons: vec!["x".repeat(MAX_REASON_BYTES + 1), "short".into()],
                ..usage("Job/a", 1, 1)
            },
        );
        let name = &all[0].new_entry_names[0];
        assert!(
            name.len() <= MAX_NAME_BYTES && name.ends_with('…'),
            "{name}"
        );
        assert_eq!(all[0].reasons[0].len(), MAX_REASON_BYTES);
        assert_eq!(all[0].reasons[1], "short");
    }

    #[test]
    fn a_workload_is_inert_only_when_its_last_pod_compiled_more_than_the_cache_holds() {
        assert!(!is_inert(&usage("Job/a", 1, 4)));
        assert!(is_inert(&usage("Job/a", 1, 5)));
        let unknown = WorkloadUsage {
            entries_delivered: None,
            ..usage("Job/a", 1, 50)
        };
        assert!(!is_inert(&unknown));
    }

    #[test]
    fn replica_sets_and_jobs_are_followed_to_their_controllers() {
        let owner = |api: &str, kind: &str| OwnerReference {
            api_version: api.into(),
            kind: kind.into(),
            name: "x".into(),
            uid: "u".into(),
            controller: Some(true),
            ..OwnerReference::default()
        };
        assert!(Workload::of_owner(&owner("apps/v1", "ReplicaSet")).has_usual_controller());
        assert!(Workload::of_owner(&owner("batch/v1", "Job")).has_usual_controller());
        assert!(!Workload::of_owner(&owner("apps/v1", "StatefulSet")).has_usual_controller());
        let other = OwnerReference {
            controller: None,
            ..owner("v1", "ConfigMap")
        };
        let refs = [other, owner("apps/v1", "StatefulSet")];
        assert_eq!(
            controller(&refs).map(|o| o.kind.as_str()),
            Some("StatefulSet")
        );
        assert_eq!(Workload::pod("p", None).label(), "Pod/p");
    }
}
