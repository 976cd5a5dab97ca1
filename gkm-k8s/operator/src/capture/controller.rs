//! Thin glue: the capture controller carries out [`decide`]'s decisions.
//!
//! It watches `GKMCacheCapture`s, the ended pods whose `csi.gkm.io`
//! volumes name a capture in the namespaces with a capture under way (see
//! [`workloads`](super::workloads) for why and how that stays small), and
//! the capture Jobs it made (by [`CAPTURE_LABEL`]). While a capture Job
//! runs, it reads the Job's pod and its events every
//! [`CaptureControllerOptions::poll`] (a pod blocked on a missing Secret
//! changes nothing the watches see); the Job is only the one whose uid the
//! status records, from the answer to the create ([`unvouched`]), and the
//! Job's pod only one the Job controls ([`job_pod`]), never one that
//! merely carries its labels. It writes a capture's status only
//! when it changed, stamping `lastTransition` when the phase, the Job or
//! the attempt changed, and points the `GKMCache` a complete capture names
//! at the pushed digest.
//!
//! The node's captured tree is not removed here (the operator has no
//! access to nodes): the node's CSI driver removes it once the capture is
//! over (`gkm_k8s_csi::release_captures`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::info;

use super::decide::{Action, Decision, JobState, Observed, Retry, decide};
use super::job::{CAPTURE_LABEL, CapturedPod, Harvest, JobOptions, job_harvesting};
use super::observe::{is_transition, job_pod, job_state, namespaces_under_way, unvouched};
use super::workloads::{PAGE_SIZE, Workloads};
use crate::error::{Error, Result};
use crate::metrics::{ControllerKind, Metrics};
use crate::names::CAPTURE_FIELD_MANAGER;
use gkm_k8s_api::crd::{CaptureStatus, GKMCacheCapture};

/// How often the watched namespaces are brought in line with the captures
/// under way besides each reconcile (a deleted capture wakes none).
const NAMESPACES_RESYNC: Duration = Duration::from_secs(30);

/// How the capture controller runs.
#[derive(Debug, Clone)]
pub struct CaptureControllerOptions {
    /// How capture Jobs are made.
    pub job: JobOptions,
    /// How registry failures are retried.
    pub retry: Retry,
    /// How often a running capture Job's pod is looked at.
    pub poll: Duration,
}

impl CaptureControllerOptions {
    /// How often a running capture Job's pod is looked at, unless said
    /// otherwise.
    pub const DEFAULT_POLL: Duration = Duration::from_secs(5);
}

struct Context {
    client: Client,
    options: CaptureControllerOptions,
    captures: Store<GKMCacheCapture>,
    workloads: Workloads,
}

impl Context {
    /// Watches the ended pods of exactly the namespaces with a capture
    /// under way.
    fn sync_namespaces(&self) {
        let captures = self.captures.state();
        self.workloads
            .watch_only(&namespaces_under_way(captures.iter().map(|c| &**c)));
    }
}

/// Runs the capture controller until the process is asked to stop,
/// recording its reconciles in `metrics`.
pub async fn run(client: Client, options: CaptureControllerOptions, metrics: Arc<Metrics>) {
    let (workloads, workloads_changed) = Workloads::new(client.clone());
    let controller = Controller::new(
        Api::<GKMCacheCapture>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Job>::all(client.clone()),
        watcher::Config::default().labels(CAPTURE_LABEL),
    )
    .reconcile_on(workloads_changed)
    .shutdown_on_signal();
    let ctx = Arc::new(Context {
        client,
        options,
        captures: controller.store(),
        workloads,
    });
    let resync = {
        let ctx = ctx.clone();
        async move {
            let mut every = tokio::time::interval(NAMESPACES_RESYNC);
            loop {
                every.tick().await;
                ctx.sync_namespaces();
            }
        }
    };
    tokio::select! {
        () = crate::runner::run(controller, ControllerKind::Capture, metrics, ctx, reconcile) => {}
        () = resync => {}
    }
}

async fn reconcile(cached: Arc<GKMCacheCapture>, ctx: Arc<Context>) -> Result<Requeue> {
    let namespace = cached
        .namespace()
        .ok_or_else(|| Error::InvalidSpec("a GKMCacheCapture without a namespace".into()))?;
    let name = cached.name_any();
    // Decide on the capture as the API server has it now, not as the watch
    // cache last saw it: a Job's deletion can wake this reconcile before
    // the status written with that deletion arrives, and a stale status
    // would recreate the Job it just deleted.
    let Some(capture) = Api::<GKMCacheCapture>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&name)
        .await?
    else {
        return Ok(Requeue::await_change());
    };
    ctx.sync_namespaces();
    let status = capture.status.clone().unwrap_or_default();
    let observed = observe(&ctx, &capture, &namespace, &status).await?;
    let decision = decide(&name, &status, &observed, &ctx.options.retry);
    let created = carry_out(&ctx, &capture, &namespace, &decision).await?;
    let mut next = decision.status.clone();
    if created.is_some() {
        next.job_uid = created;
    }
    if let Some(image) = &decision.point_cache_at {
        point_cache(&ctx.client, &capture, &namespace, image).await?;
    }
    write_status(&ctx.client, &namespace, &name, &status, next).await?;
    Ok(match decision.action {
        Action::RequeueAfter(wait) => Requeue::requeue(wait),
        _ if decision.status.job.is_some() && !decision.status.phase.is_final() => {
            Requeue::requeue(ctx.options.poll)
        }
        _ => Requeue::await_change(),
    })
}

/// What the cluster shows of the capture `name`.
async fn observe(
    ctx: &Context,
    capture: &GKMCacheCapture,
    namespace: &str,
    status: &CaptureStatus,
) -> Result<Observed> {
    let workloads = ctx.workloads.named(namespace, &capture.name_any());
    let capture_uid = capture.metadata.uid.as_deref().unwrap_or_default();
    let job = match (&status.job, status.phase.is_final()) {
        (Some(job), false) => {
            let recorded = status.job_uid.as_deref();
            job_observed(&ctx.client, namespace, job, capture_uid, recorded).await?
        }
        _ => None,
    };
    let since_transition = status
        .last_transition
        .as_ref()
        .and_then(|t| {
            let elapsed = jiff::Timestamp::now().duration_since(t.0);
            Duration::try_from(elapsed).ok()
        })
        .unwrap_or(Duration::ZERO);
    Ok(Observed {
        workloads,
        job,
        since_transition,
    })
}

/// The capture Job `name`'s state, or `None` when it does not exist; a
/// Job of that name the operator cannot vouch for ([`unvouched`]: the
/// capture of uid `capture_uid` its controller, `recorded` its uid) is not
/// read.
async fn job_observed(
    client: &Client,
    namespace: &str,
    name: &str,
    capture_uid: &str,
    recorded: Option<&str>,
) -> Result<Option<JobState>> {
    let Some(job) = Api::<Job>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(None);
    };
    if let Some(why) = unvouched(&job, capture_uid, recorded) {
        return Ok(Some(JobState::NotVouched(why)));
    }
    let job_uid = job.metadata.uid.clone().unwrap_or_default();
    let Some(pod) = owned_job_pod(client, namespace, name, &job_uid).await? else {
        let failed = job
            .status
            .and_then(|s| s.failed)
            .is_some_and(|failed| failed > 0);
        return Ok(Some(if failed {
            JobState::Finished(None)
        } else {
            JobState::Running
        }));
    };
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let fields = format!(
        "involvedObject.kind=Pod,involvedObject.name={}",
        pod.name_any()
    );
    let events: Vec<(String, String)> = events
        .list(&ListParams::default().fields(&fields))
        .await?
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect();
    Ok(Some(job_state(&pod, &events)))
}

/// The Job `name`'s own pod ([`job_pod`]), listed by the Job's label in
/// pages of [`PAGE_SIZE`] keeping only the best so far: pods carrying the
/// label, which anyone creating pods in the namespace can make, never
/// weigh more than a page in the operator.
async fn owned_job_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    job_uid: &str,
) -> Result<Option<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut params = ListParams::default()
        .labels(&format!("job-name={name}"))
        .limit(PAGE_SIZE);
    let mut found: Option<Pod> = None;
    loop {
        let page = pods.list(&params).await?;
        let mut candidates: Vec<Pod> = found.take().into_iter().collect();
        candidates.extend(job_pod(&page.items, job_uid).cloned());
        found = job_pod(&candidates, job_uid).cloned();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(found),
        }
    }
}

/// Creates or deletes the capture Job the decision names; the uid of the
/// Job it created, as the API server answered (none when the name was
/// taken: that Job is not vouched for).
async fn carry_out(
    ctx: &Context,
    capture: &GKMCacheCapture,
    namespace: &str,
    decision: &Decision,
) -> Result<Option<String>> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), namespace);
    match &decision.action {
        Action::CreateJob(name) => {
            let pod_name = decision.status.pod.as_deref().unwrap_or_default();
            let pod = ctx.workloads.get(namespace, pod_name).ok_or_else(|| {
                Error::NotWatched(format!("the workload pod {namespace}/{pod_name}"))
            })?;
            let captured = CapturedPod {
                uid: &pod.workload.uid,
                node: decision.status.node.as_deref().unwrap_or_default(),
                tolerations: serde_json::to_value(&pod.tolerations)?,
            };
            let harvest = if pod.delta_captures.iter().any(|c| *c == capture.name_any()) {
                Harvest::Delta
            } else {
                Harvest::Tree
            };
            let made = job_harvesting(capture, name, &captured, harvest, &ctx.options.job)
                .ok_or_else(|| {
                    Error::InvalidSpec(format!(
                        "GKMCacheCapture {namespace}/{}: maxBytes does not parse",
                        capture.name_any()
                    ))
                })?;
            let made: Job = serde_json::from_value(made)?;
            match jobs.create(&PostParams::default(), &made).await {
                Ok(created) => {
                    info!(%namespace, job = %name, "capture Job created");
                    return Ok(created.metadata.uid);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Action::DeleteJob(name) => {
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            match jobs.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Action::None | Action::RequeueAfter(_) => {}
    }
    Ok(None)
}

/// Points the `GKMCache` the capture names (creating it when missing) at
/// the captured image, pinned to its digest.
async fn point_cache(
    client: &Client,
    capture: &GKMCacheCapture,
    namespace: &str,
    image: &str,
) -> Result<()> {
    let Some(cache) = &capture.spec.cache_name else {
        return Ok(());
    };
    let caches: Api<gkm_k8s_api::crd::GKMCache> = Api::namespaced(client.clone(), namespace);
    let applied = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": cache, "namespace": namespace},
        "spec": {"image": image},
    });
    caches
        .patch(
            cache,
            &PatchParams::apply(CAPTURE_FIELD_MANAGER).force(),
            &Patch::Apply(applied),
        )
        .await?;
    Ok(())
}

/// Writes `next` when it differs from `old`.
async fn write_status(
    client: &Client,
    namespace: &str,
    name: &str,
    old: &CaptureStatus,
    mut next: CaptureStatus,
) -> Result<()> {
    if is_transition(old, &next) {
        next.last_transition = Some(Time(jiff::Timestamp::now()));
    }
    if &next == old {
        return Ok(());
    }
    let captures: Api<GKMCacheCapture> = Api::namespaced(client.clone(), namespace);
    // Server-side apply of the whole status: fields the decision cleared
    // (the Job of a failed attempt) go too.
    let applied = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheCapture",
        "metadata": {"name": name, "namespace": namespace},
        "status": next,
    });
    captures
        .patch_status(
            name,
            &PatchParams::apply(CAPTURE_FIELD_MANAGER).force(),
            &Patch::Apply(applied),
        )
        .await?;
    info!(%namespace, capture = %name, phase = ?next.phase, reason = ?next.reason, "capture status");
    Ok(())
}
