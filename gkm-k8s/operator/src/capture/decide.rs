//! What to do next for a `GKMCacheCapture`, from its status and what the
//! cluster shows: its workload pods and its capture Job. Pure: the
//! Kubernetes glue reads the objects into [`Observed`] and carries out the
//! [`Decision`].
//!
//! - `Pending`: waiting for a workload pod that mounted the capture volume
//!   to end. One that succeeded is captured (a Job in the capture's
//!   namespace, pinned to its node: `Capturing`), the first by uid
//!   ([`captured_workload`]); one that failed, with none succeeded, fails
//!   the capture (`WorkloadFailed`: its cache may be partial).
//! - `Capturing`: the Job runs `gkm capture`; its termination message is the
//!   outcome. Captured: `Complete`, with the digest. A registry failure is
//!   retried with exponential backoff up to a number of attempts, then
//!   `Failed`; any other failure (an unsafe tree, not a cache, an image that
//!   did not verify, a Job that cannot start because a Secret is missing)
//!   is `Failed` at once. A Job that went missing (deleted by hand) is made
//!   again under the same name, so an operator restarted mid-capture
//!   carries on with the Job it made. Only the Job whose uid the status
//!   records (`jobUid`, from the answer to the operator's create) is read.
//!   A Job of that name the capture does not control is never read: the
//!   capture waits for it to go (`JobNotOwned`). One the capture controls
//!   but of no recorded uid or another (made before the operator's, or by
//!   an operator stopped before it recorded the uid) is deleted unread and
//!   made again (`JobNotVouched`), so a restart costs that Job's work and
//!   never wedges the capture.
//! - `Complete` / `Failed`: nothing more, and the node's captured tree may
//!   be removed.

use std::time::Duration;

use gkm_k8s_api::crd::{CapturePhase, CaptureStatus};
use gkm_oci::capture::FailureReason;
use serde::Deserialize;

/// A pod that mounted the capture's volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Its name.
    pub name: String,
    /// Its uid, which names its captured tree on the node.
    pub uid: String,
    /// The node it ran on, once scheduled.
    pub node: Option<String>,
    /// How far it got.
    pub state: WorkloadState,
    /// Whether its volume naming the capture is a writable cache view (it
    /// names a cache too): its tree is then an upper over that cache, and
    /// the capture is a delta on it.
    pub delta: bool,
}

/// A workload pod's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadState {
    /// Not ended yet.
    Running,
    /// Every container exited 0.
    Succeeded,
    /// It failed.
    Failed,
}

/// What the capture Job reports in its termination message
/// (`gkm capture --termination-log`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// Whether the image was pushed, signed, verified and tagged.
    pub captured: bool,
    /// The image, pinned to its digest.
    #[serde(default)]
    pub image: Option<String>,
    /// The digest.
    #[serde(default)]
    pub digest: Option<String>,
    /// Why it failed: a stable word ([`FailureReason`]'s, or
    /// [`DELTA_CHANGES_BASE`]); kept as written, so a reason this operator
    /// does not know still fails the capture with its own name.
    #[serde(default)]
    pub reason: Option<String>,
    /// For a delta capture, the base image it was taken on, pinned.
    #[serde(default)]
    pub base: Option<String>,
    /// What happened.
    #[serde(default)]
    pub message: Option<String>,
}

/// The reason a delta capture fails with when the workload's upper deletes
/// or changes a file of the base (a whiteout, an opaque directory, a
/// changed copy of a base file): the delta is refused, as a tree that breaks
/// a safety rule is.
pub const DELTA_CHANGES_BASE: &str = "DeltaChangesBase";

impl Outcome {
    /// Whether its failure may pass if tried again later (a registry
    /// outage).
    pub fn is_transient(&self) -> bool {
        self.reason.as_deref() == Some(FailureReason::RegistryError.as_str())
    }

    /// Reads a termination message; `None` for anything else (a Job killed
    /// before it wrote one).
    pub fn parse(message: &str) -> Option<Outcome> {
        serde_json::from_str(message.trim()).ok()
    }
}

/// The capture Job, as the cluster shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Not finished.
    Running,
    /// Its pod cannot start, and will not without a change: a Secret or a
    /// key in it missing (`reason`, e.g. `SecretNotFound`).
    Blocked {
        /// One word.
        reason: String,
        /// What the kubelet said.
        message: String,
    },
    /// It finished; the outcome its container wrote, when it wrote one.
    Finished(Option<Outcome>),
    /// A Job of that name exists that the operator cannot vouch for (see
    /// [`Unvouched`]): nothing of it is read.
    NotVouched(Unvouched),
}

/// Why a Job under the capture Job's name is not the one the operator made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unvouched {
    /// The capture is not its controller: it is not the operator's to
    /// delete, so the capture waits for it to go.
    NotControlled,
    /// The capture controls it but no uid is recorded: made before the
    /// operator's create (which then found the name taken), or by an
    /// operator stopped before it recorded the uid. Deleted and made again.
    NotRecorded,
    /// The capture controls it but its uid is not the one recorded (the
    /// operator's was deleted and another made under the name). Deleted and
    /// made again.
    OtherUid,
}

impl Unvouched {
    /// Why, for people.
    fn why(self) -> &'static str {
        match self {
            Unvouched::NotControlled => "this capture is not its controller",
            Unvouched::NotRecorded => "no uid of a Job the operator made is recorded",
            Unvouched::OtherUid => "its uid is not that of the Job the operator made",
        }
    }
}

/// What the cluster shows of a capture.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Pods of the capture's namespace that mounted its volume.
    pub workloads: Vec<Workload>,
    /// The Job the status names, when it exists.
    pub job: Option<JobState>,
    /// Time since `status.lastTransition` (zero when unknown).
    pub since_transition: Duration,
}

/// How registry failures are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Jobs run at most.
    pub max_attempts: i32,
    /// The wait after the first failure, doubled after each.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            max_attempts: 5,
            base: Duration::from_secs(10),
            cap: Duration::from_secs(300),
        }
    }
}

impl Retry {
    /// The wait after `attempts` failed attempts.
    pub fn backoff(&self, attempts: i32) -> Duration {
        let doublings = attempts.saturating_sub(1).clamp(0, 16) as u32;
        self.base.saturating_mul(1 << doublings).min(self.cap)
    }
}

/// What to do in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Create the capture Job of this name, attempt number
    /// `status.attempts`, recording in `status.jobUid` the uid the create
    /// is answered with (a name already taken records nothing).
    CreateJob(String),
    /// Look again after this long (a retry's backoff).
    RequeueAfter(Duration),
    /// Delete the Job that cannot start.
    DeleteJob(String),
}

/// The next status and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The status to write (equal to the old one when nothing changed).
    pub status: CaptureStatus,
    /// What to do.
    pub action: Action,
    /// Whether the node's captured tree may be removed (the capture is
    /// over).
    pub release_tree: bool,
    /// The pinned image a `GKMCache` named by the spec should now point at.
    pub point_cache_at: Option<String>,
}

/// The name of attempt `attempt`'s Job for the capture `name`.
pub fn job_name(name: &str, attempt: i32) -> String {
    crate::names::joined(&format!("capture-{name}"), &attempt.to_string())
}

/// Decides; see the [module documentation](self).
pub fn decide(name: &str, status: &CaptureStatus, observed: &Observed, retry: &Retry) -> Decision {
    let keep = |action| to(status.clone(), action);
    match status.phase {
        CapturePhase::Complete | CapturePhase::Failed => Decision {
            release_tree: true,
            ..keep(Action::None)
        },
        CapturePhase::Pending => pending(name, status, observed),
        CapturePhase::Capturing | CapturePhase::Pushing => match (&observed.job, &status.job) {
            (Some(JobState::Running), _) => keep(Action::None),
            (Some(JobState::Blocked { reason, message }), Some(job)) => Decision {
                action: Action::DeleteJob(job.clone()),
                ..failed(status, reason, message)
            },
            (Some(JobState::Blocked { reason, message }), None) => failed(status, reason, message),
            (Some(JobState::Finished(outcome)), _) => finished(status, outcome.as_ref(), retry),
            // Wait for it to go (a deleted capture's Job, not yet collected,
            // or one made to pass for the capture's): then the capture's own
            // is made under that name.
            (Some(JobState::NotVouched(Unvouched::NotControlled)), _) => {
                let mut next = status.clone();
                next.reason = Some("JobNotOwned".into());
                next.message = Some(format!(
                    "a Job named {} exists that this capture did not make ({}); nothing of it \
                     is read, and the capture's own Job is made once it is gone",
                    status.job.as_deref().unwrap_or_default(),
                    Unvouched::NotControlled.why()
                ));
                to(next, Action::None)
            }
            // One the capture controls but the operator did not make (or
            // did not record): deleted unread, then the capture's own is
            // made under that name.
            (Some(JobState::NotVouched(why)), Some(job)) => {
                let mut next = status.clone();
                next.job_uid = None;
                next.reason = Some("JobNotVouched".into());
                next.message = Some(format!(
                    "the Job {job} was deleted unread ({}); the capture's own Job is made under \
                     that name",
                    why.why()
                ));
                to(next, Action::DeleteJob(job.clone()))
            }
            (Some(JobState::NotVouched(_)), None) => keep(Action::None),
            // Waiting out a retry's backoff, or the Job went missing.
            (None, None) => retry_due(name, status, observed, retry),
            (None, Some(job)) => {
                let mut next = status.clone();
                next.job_uid = None;
                to(next, Action::CreateJob(job.clone()))
            }
        },
    }
}

/// The workload a capture acts on, among those that ended on a node: the
/// first by uid that succeeded (its tree is captured), else the first by
/// uid that failed (it fails the capture). The apiserver gives the uid, so
/// no pod creator chooses where its pod sorts, as it would with a name; and
/// a failed pod does not fail a capture whose succeeded workload is seen.
pub fn captured_workload(workloads: &[Workload]) -> Option<&Workload> {
    workloads
        .iter()
        .filter(|w| w.state != WorkloadState::Running && w.node.is_some())
        .min_by(|a, b| {
            let key = |w: &&Workload| (w.state != WorkloadState::Succeeded, w.uid.clone());
            key(a).cmp(&key(b))
        })
}

fn pending(name: &str, status: &CaptureStatus, observed: &Observed) -> Decision {
    let Some(workload) = captured_workload(&observed.workloads) else {
        return to(status.clone(), Action::None);
    };
    let mut next = status.clone();
    next.pod = Some(workload.name.clone());
    next.node = workload.node.clone();
    if workload.state == WorkloadState::Failed {
        return failed(
            &next,
            "WorkloadFailed",
            &format!(
                "the workload pod {} failed, so its cache may be partial; nothing was captured",
                workload.name
            ),
        );
    }
    next.phase = CapturePhase::Capturing;
    next.attempts = 1;
    let job = job_name(name, 1);
    next.job = Some(job.clone());
    next.job_uid = None;
    next.reason = Some("WorkloadEnded".into());
    next.message = Some(format!(
        "capturing the tree of pod {} on node {}",
        workload.name,
        workload.node.as_deref().unwrap_or_default()
    ));
    to(next, Action::CreateJob(job))
}

fn finished(status: &CaptureStatus, outcome: Option<&Outcome>, retry: &Retry) -> Decision {
    let Some(outcome) = outcome else {
        return failed(
            status,
            "NoOutcome",
            "the capture Job ended without writing its outcome (killed, or out of time)",
        );
    };
    if outcome.captured {
        let mut next = status.clone();
        next.phase = CapturePhase::Complete;
        next.reason = Some("Captured".into());
        next.message = Some("pushed, signed and verified; the tag names the digest".into());
        next.image = outcome.image.clone();
        next.digest = outcome.digest.clone();
        next.base = outcome.base.clone();
        return Decision {
            point_cache_at: outcome.image.clone(),
            status: next,
            action: Action::None,
            release_tree: true,
        };
    }
    let reason = outcome.reason.as_deref().unwrap_or("Unknown");
    let message = outcome.message.clone().unwrap_or_default();
    let mut status = status.clone();
    if outcome.base.is_some() {
        status.base = outcome.base.clone();
    }
    let status = &status;
    if !outcome.is_transient() || status.attempts >= retry.max_attempts {
        return failed(status, reason, &message);
    }
    let wait = retry.backoff(status.attempts);
    let mut next = status.clone();
    next.job = None;
    next.job_uid = None;
    next.reason = Some(reason.into());
    next.message = Some(format!(
        "attempt {} of {} failed, next in {}s: {message}",
        status.attempts,
        retry.max_attempts,
        wait.as_secs()
    ));
    to(next, Action::RequeueAfter(wait))
}

fn retry_due(name: &str, status: &CaptureStatus, observed: &Observed, retry: &Retry) -> Decision {
    let wait = retry.backoff(status.attempts);
    if observed.since_transition < wait {
        return to(
            status.clone(),
            Action::RequeueAfter(wait - observed.since_transition),
        );
    }
    let mut next = status.clone();
    next.attempts += 1;
    let job = job_name(name, next.attempts);
    next.job = Some(job.clone());
    next.job_uid = None;
    to(next, Action::CreateJob(job))
}

/// A capture still under way: `status`, and `action`.
fn to(status: CaptureStatus, action: Action) -> Decision {
    Decision {
        status,
        action,
        release_tree: false,
        point_cache_at: None,
    }
}

fn failed(status: &CaptureStatus, reason: &str, message: &str) -> Decision {
    let mut next = status.clone();
    next.phase = CapturePhase::Failed;
    next.reason = Some(reason.to_string());
    next.message = Some(message.to_string());
    Decision {
        release_tree: true,
        ..to(next, Action::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(name: &str, state: WorkloadState) -> Workload {
        Workload {
            name: name.into(),
            uid: format!("uid-{name}"),
            node: Some("node-1".into()),
            state,
            delta: false,
        }
    }

    fn observed(workloads: Vec<Workload>, job: Option<JobState>) -> Observed {
        Observed {
            workloads,
            job,
            since_transition: Duration::ZERO,
        }
    }

    fn outcome(json: &str) -> Option<JobState> {
        Some(JobState::Finished(Outcome::parse(json)))
    }

    const REGISTRY_DOWN: &str =
        r#"{"captured":false,"reason":"RegistryError","message":"registry r: connection refused"}"#;

    /// Runs `decide` and returns its status, as the glue would write it.
    fn step(status: &CaptureStatus, observed: &Observed) -> Decision {
        decide("warm", status, observed, &Retry::default())
    }

    #[test]
    fn a_capture_waits_for_its_workload_then_captures_it_on_its_node() {
        let pending = CaptureStatus::default();
        let running = observed(vec![workload("w", WorkloadState::Running)], None);
        assert_eq!(step(&pending, &running).action, Action::None);
        let done = observed(vec![workload("w", WorkloadState::Succeeded)], None);
        let d = step(&pending, &done);
        assert_eq!(d.status.phase, CapturePhase::Capturing);
        assert_eq!(d.status.node.as_deref(), Some("node-1"));
        assert_eq!(d.status.pod.as_deref(), Some("w"));
        assert_eq!(d.action, Action::CreateJob(job_name("warm", 1)));
        assert!(!d.release_tree);
    }

    #[test]
    fn the_first_succeeded_workload_by_uid_is_captured_whatever_the_names() {
        let named = |name: &str, uid: &str, state| Workload {
            uid: uid.into(),
            ..workload(name, state)
        };
        let workloads = vec![
            named("a-failed", "uid-1", WorkloadState::Failed),
            named("b-running", "uid-0", WorkloadState::Running),
            named("c-later", "uid-3", WorkloadState::Succeeded),
            named("z-first", "uid-2", WorkloadState::Succeeded),
            Workload {
                node: None,
                ..named("unscheduled", "uid-00", WorkloadState::Succeeded)
            },
        ];
        let chosen = captured_workload(&workloads).expect("a workload");
        assert_eq!(chosen.name, "z-first");
        let d = step(&CaptureStatus::default(), &observed(workloads, None));
        assert_eq!(d.status.phase, CapturePhase::Capturing);
        assert_eq!(d.status.pod.as_deref(), Some("z-first"));
        let failed_only = vec![
            named("b", "uid-5", WorkloadState::Failed),
            named("a", "uid-4", WorkloadState::Failed),
        ];
        assert_eq!(
            captured_workload(&failed_only).map(|w| w.name.as_str()),
            Some("a")
        );
        assert!(captured_workload(&[named("r", "u", WorkloadState::Running)]).is_none());
    }

    #[test]
    fn a_failed_workload_fails_the_capture_and_releases_its_tree() {
        let d = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Failed)], None),
        );
        assert_eq!(d.status.phase, CapturePhase::Failed);
        assert_eq!(d.status.reason.as_deref(), Some("WorkloadFailed"));
        assert!(d.release_tree);
    }

    #[test]
    fn a_captured_outcome_completes_with_the_digest_and_points_the_cache() {
        let capturing = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Succeeded)], None),
        )
        .status;
        assert_eq!(
            step(&capturing, &observed(vec![], Some(JobState::Running))).action,
            Action::None
        );
        let d = step(
            &capturing,
            &observed(
                vec![],
                outcome(r#"{"captured":true,"image":"r/c@sha256:ab","digest":"sha256:ab"}"#),
            ),
        );
        assert_eq!(d.status.phase, CapturePhase::Complete);
        assert_eq!(d.status.digest.as_deref(), Some("sha256:ab"));
        assert_eq!(d.point_cache_at.as_deref(), Some("r/c@sha256:ab"));
        assert!(d.release_tree);
    }

    #[test]
    fn an_unsafe_tree_fails_at_once_with_the_jobs_reason() {
        let capturing = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Succeeded)], None),
        )
        .status;
        let d = step(
            &capturing,
            &observed(
                vec![],
                outcome(
                    r#"{"captured":false,"reason":"UnsafeTree","message":"symbolic link to /etc"}"#,
                ),
            ),
        );
        assert_eq!(d.status.phase, CapturePhase::Failed);
        assert_eq!(d.status.reason.as_deref(), Some("UnsafeTree"));
        assert_eq!(d.status.message.as_deref(), Some("symbolic link to /etc"));
        assert!(d.release_tree);
    }

    #[test]
    fn a_delta_that_changes_its_base_fails_at_once_and_a_delta_captured_shows_its_base() {
        let capturing = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Succeeded)], None),
        )
        .status;
        let d = step(
            &capturing,
            &observed(
                vec![],
                outcome(
                    r#"{"captured":false,"reason":"DeltaChangesBase","base":"r/base@sha256:01",
                        "message":"KEY/k.cubin: a changed copy of a base file"}"#,
                ),
            ),
        );
        assert_eq!(d.status.phase, CapturePhase::Failed);
        assert_eq!(d.status.reason.as_deref(), Some(DELTA_CHANGES_BASE));
        assert_eq!(d.status.base.as_deref(), Some("r/base@sha256:01"));
        assert_eq!(d.action, Action::None, "not retried");
        assert!(d.release_tree);
        let d = step(
            &capturing,
            &observed(
                vec![],
                outcome(
                    r#"{"captured":true,"image":"r/c@sha256:ab","digest":"sha256:ab",
                        "base":"r/base@sha256:01"}"#,
                ),
            ),
        );
        assert_eq!(d.status.phase, CapturePhase::Complete);
        assert_eq!(d.status.base.as_deref(), Some("r/base@sha256:01"));
        assert_eq!(d.point_cache_at.as_deref(), Some("r/c@sha256:ab"));
    }

    #[test]
    fn a_registry_outage_is_retried_with_backoff_then_fails() {
        let retry = Retry::default();
        let mut status = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Succeeded)], None),
        )
        .status;
        for attempt in 1..retry.max_attempts {
            let d = step(&status, &observed(vec![], outcome(REGISTRY_DOWN)));
            assert_eq!(d.status.phase, CapturePhase::Capturing, "attempt {attempt}");
            assert_eq!(d.action, Action::RequeueAfter(retry.backoff(attempt)));
            status = d.status;
            // Too early: wait the rest.
            let early = Observed {
                since_transition: Duration::from_secs(1),
                ..Observed::default()
            };
            assert_eq!(
                step(&status, &early).action,
                Action::RequeueAfter(retry.backoff(attempt) - Duration::from_secs(1))
            );
            let due = Observed {
                since_transition: retry.backoff(attempt),
                ..Observed::default()
            };
            let d = step(&status, &due);
            assert_eq!(d.action, Action::CreateJob(job_name("warm", attempt + 1)));
            status = d.status;
        }
        let d = step(&status, &observed(vec![], outcome(REGISTRY_DOWN)));
        assert_eq!(d.status.phase, CapturePhase::Failed);
        assert_eq!(d.status.reason.as_deref(), Some("RegistryError"));
        assert_eq!(retry.backoff(1), Duration::from_secs(10));
        assert_eq!(retry.backoff(3), Duration::from_secs(40));
        assert_eq!(retry.backoff(30), retry.cap);
    }

    #[test]
    fn a_missing_job_is_made_again_and_a_blocked_one_fails_the_capture() {
        let capturing = step(
            &CaptureStatus::default(),
            &observed(vec![workload("w", WorkloadState::Succeeded)], None),
        )
        .status;
        // An operator restarted mid-capture, with the Job gone: same name.
        assert_eq!(
            step(&capturing, &Observed::default()).action,
            Action::CreateJob(job_name("warm", 1))
        );
        let blocked = JobState::Blocked {
            reason: "SecretNotFound".into(),
            message: "secret \"signing\" not found".into(),
        };
        let d = step(&capturing, &observed(vec![], Some(blocked)));
        assert_eq!(d.status.phase, CapturePhase::Failed);
        assert_eq!(d.status.reason.as_deref(), Some("SecretNotFound"));
        assert_eq!(d.action, Action::DeleteJob(job_name("warm", 1)));
        // A Job of that name the capture does not control: nothing of it
        // is read, and the capture waits.
        let d = step(
            &capturing,
            &observed(vec![], Some(JobState::NotVouched(Unvouched::NotControlled))),
        );
        assert_eq!(d.status.phase, CapturePhase::Capturing);
        assert_eq!(d.status.reason.as_deref(), Some("JobNotOwned"));
        assert_eq!((d.action, d.status.digest), (Action::None, None));
        // A Job killed before it wrote an outcome.
        let d = step(
            &capturing,
            &observed(vec![], Some(JobState::Finished(None))),
        );
        assert_eq!(d.status.reason.as_deref(), Some("NoOutcome"));
    }

    #[test]
    fn a_job_the_operator_cannot_vouch_for_is_deleted_unread_and_made_again() {
        // Capturing, as an operator stopped between creating the Job and
        // recording its uid leaves it, or as a create that found the name
        // taken by a Job the capture controls leaves it.
        let capturing = CaptureStatus {
            phase: CapturePhase::Capturing,
            job: Some(job_name("warm", 1)),
            attempts: 1,
            ..CaptureStatus::default()
        };
        for why in [Unvouched::NotRecorded, Unvouched::OtherUid] {
            let recorded = CaptureStatus {
                job_uid: (why == Unvouched::OtherUid).then(|| "made".into()),
                ..capturing.clone()
            };
            let d = step(
                &recorded,
                &observed(vec![], Some(JobState::NotVouched(why))),
            );
            assert_eq!(d.status.phase, CapturePhase::Capturing);
            assert_eq!(d.status.reason.as_deref(), Some("JobNotVouched"));
            assert!(
                d.status
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("capture-warm-1")),
                "{d:?}"
            );
            assert_eq!(d.status.job_uid, None);
            assert_eq!(d.status.digest, None);
            assert_eq!(d.action, Action::DeleteJob(job_name("warm", 1)));
            // Once it is gone, the capture's own is made under the name.
            let gone = step(&d.status, &observed(vec![], None));
            assert_eq!(gone.action, Action::CreateJob(job_name("warm", 1)));
            assert_eq!(gone.status.attempts, 1);
        }
    }

    #[test]
    fn job_names_are_short_and_distinct_per_attempt() {
        let long = "x".repeat(253);
        let (a, b) = (job_name(&long, 1), job_name(&long, 2));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(job_name("warm", 1), "capture-warm-1");
    }
}
