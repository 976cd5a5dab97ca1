//! Thin glue: applies a [`Plan`] with server-side apply (one field manager),
//! removes what the cache owns and the plan no longer names, reads the fill
//! Jobs and the pods using the claims back into status, and on deletion
//! waits for those pods before removing Jobs, claims and volumes.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::info;

use super::objects::{self, PvcOptions};
use super::plan::{Plan, PlanInput, PvcMode, plan};
use super::status::{FAILED_AFTER, Fill, NamespaceFacts, claims_status};
use crate::error::{Error, Result};
use gkm_k8s_api::cache_object::{CacheKey, CacheObject};
use gkm_k8s_api::crd::{CacheState, PvcOwner, PvcStatus};

/// The field manager of every object gkm applies for PVC delivery.
pub const FIELD_MANAGER: &str = "gkm-operator";
/// The claim annotation naming the digest its content was filled from.
pub const FILLED_ANNOTATION: &str = "gkm.io/filled-digest";
/// The claim annotation naming when the current content was filled, set
/// only on a refill (a pod started before it runs on older content).
pub const REFILLED_AT_ANNOTATION: &str = "gkm.io/refilled-at";

/// What PVC delivery observed for a cache.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClaimsOutcome {
    /// The Status column in PVC mode; `None` leaves the node rollup's
    /// (nothing is filled on purpose, and the rollup says why).
    pub state: Option<CacheState>,
    /// `status.pvcOwner`.
    pub owner: Option<PvcOwner>,
    /// `status.pvcStatus`, by namespace.
    pub pvc_status: Option<BTreeMap<String, PvcStatus>>,
    /// Pods using a claim filled from the resolved digest.
    pub pods_running: i32,
    /// Pods using a claim refilled since they started.
    pub pods_outdated: i32,
}

/// Applies what `cache` should have in PVC mode (nothing in CSI mode: what
/// it owned is removed), and reports what is there.
pub async fn reconcile_claims<K: CacheObject>(
    cache: &K,
    client: &Client,
    options: &PvcOptions,
    digest: Option<&str>,
    deliverable: bool,
    compatible_nodes: &BTreeSet<String>,
) -> Result<ClaimsOutcome> {
    let key = cache.key();
    let spec = cache.cache_spec();
    let namespaces: BTreeSet<String> = Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter_map(|n| n.metadata.name)
        .collect();
    let wanted = plan(&PlanInput {
        key: &key,
        spec,
        digest,
        deliverable,
        existing_namespaces: &namespaces,
        compatible_nodes,
        make_volumes: options.volume_dir.is_some(),
    });
    let image = match digest {
        Some(d) => Some(pinned(&spec.image, d)?),
        None => None,
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for claim in &wanted.claims {
        if let Some(body) = objects::volume(&key, spec, claim, options) {
            prepare_volume_dir(options, claim.volume.as_deref().unwrap_or_default());
            Api::<PersistentVolume>::all(client.clone())
                .patch(
                    claim.volume.as_deref().unwrap_or_default(),
                    &params,
                    &Patch::Apply(&body),
                )
                .await?;
        }
        let body = objects::claim(&key, spec, claim, options);
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), &claim.namespace)
            .patch(&claim.name, &params, &Patch::Apply(&body))
            .await?;
        if let (Some(d), Some(image)) = (digest, image.as_deref())
            && let Some(body) = objects::job(&key, spec, claim, d, image, options)
            && let Some(name) = &claim.job
        {
            Api::<Job>::namespaced(client.clone(), &claim.namespace)
                .patch(name, &params, &Patch::Apply(&body))
                .await?;
        }
    }
    prune(&key, client, &wanted).await?;
    let previous = cache.cache_status().and_then(|s| s.pvc_status.as_ref());
    observe(&key, spec, client, &wanted, digest, previous).await
}

/// `REPO@DIGEST` for the cache's image.
fn pinned(image: &str, digest: &str) -> Result<String> {
    let reference: gkm_oci::ImageRef = image
        .parse()
        .map_err(|e| Error::InvalidSpec(format!("spec.image {image:?}: {e}")))?;
    let digest: gkm_oci::Digest = digest
        .parse()
        .map_err(|e| Error::InvalidSpec(format!("resolved digest {digest:?}: {e}")))?;
    Ok(reference.with_digest(&digest).to_string())
}

/// Removes the Jobs, claims and volumes `key` owns that `wanted` does not name.
async fn prune(key: &CacheKey, client: &Client, wanted: &Plan) -> Result<()> {
    let claims: BTreeSet<(String, String)> = wanted
        .claims
        .iter()
        .map(|c| (c.namespace.clone(), c.name.clone()))
        .collect();
    let jobs: BTreeSet<(String, String)> = wanted
        .claims
        .iter()
        .filter_map(|c| Some((c.namespace.clone(), c.job.clone()?)))
        .collect();
    let volumes: BTreeSet<String> = wanted
        .claims
        .iter()
        .filter_map(|c| c.volume.clone())
        .collect();
    let owned = Owned::list(key, client).await?;
    // A Job of another digest goes at once: two fills never write one claim.
    for job in &owned.jobs {
        let id = (job.namespace().unwrap_or_default(), job.name_any());
        if !jobs.contains(&id) {
            delete_job(client, &id.0, &id.1).await?;
        }
    }
    for claim in &owned.claims {
        let id = (claim.namespace().unwrap_or_default(), claim.name_any());
        if !claims.contains(&id) {
            info!(cache = %key, claim = %format!("{}/{}", id.0, id.1), "removing a claim the cache no longer asks for");
            delete(
                &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &id.0),
                &id.1,
            )
            .await?;
        }
    }
    for volume in &owned.volumes {
        if !volumes.contains(&volume.name_any()) && claim_gone(client, volume).await? {
            delete(
                &Api::<PersistentVolume>::all(client.clone()),
                &volume.name_any(),
            )
            .await?;
        }
    }
    Ok(())
}

/// Whether a gkm-made volume's claim is gone (its volume may go then).
async fn claim_gone(client: &Client, volume: &PersistentVolume) -> Result<bool> {
    let Some(claim) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Ok(true);
    };
    let (Some(ns), Some(name)) = (&claim.namespace, &claim.name) else {
        return Ok(true);
    };
    Ok(Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
        .is_none())
}

async fn delete_job(client: &Client, namespace: &str, name: &str) -> Result<()> {
    let api = Api::<Job>::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Everything a cache owns, found by its labels.
struct Owned {
    jobs: Vec<Job>,
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
}

impl Owned {
    async fn list(key: &CacheKey, client: &Client) -> Result<Owned> {
        let selector = ListParams::default().labels(&objects::owner_selector(key));
        Ok(Owned {
            jobs: Api::<Job>::all(client.clone()).list(&selector).await?.items,
            claims: Api::<PersistentVolumeClaim>::all(client.clone())
                .list(&selector)
                .await?
                .items,
            volumes: Api::<PersistentVolume>::all(client.clone())
                .list(&selector)
                .await?
                .items,
        })
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.claims.is_empty() && self.volumes.is_empty()
    }
}

/// The workload pods in `namespace` whose volumes name one of `claims`
/// (not finished, not gkm's fill Jobs).
async fn pods_using(
    client: &Client,
    namespace: &str,
    claims: &BTreeSet<String>,
) -> Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|vs| {
                    vs.iter().any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| claims.contains(&c.claim_name))
                    })
                })
        })
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        // gkm's own fill Jobs are no workload.
        .filter(|p| {
            p.labels().get(objects::MANAGED_BY.0).map(String::as_str) != Some(objects::MANAGED_BY.1)
        })
        .collect())
}

/// Reads the Jobs back, records on each claim the digest it holds once its
/// Job completed, reads the pods using the claims, and makes the status of
/// what it read ([`claims_status`]).
async fn observe(
    key: &CacheKey,
    spec: &gkm_k8s_api::crd::CacheSpec,
    client: &Client,
    wanted: &Plan,
    digest: Option<&str>,
    previous: Option<&BTreeMap<String, PvcStatus>>,
) -> Result<ClaimsOutcome> {
    let Some(mode) = PvcMode::of(spec) else {
        return Ok(ClaimsOutcome::default());
    };
    let mut facts = read_fills(client, wanted).await?;
    if let Some(digest) = digest {
        for (namespace, seen) in &facts {
            for (claim, fill) in &seen.fills {
                if *fill == Fill::Done {
                    record_fill(client, namespace, claim, digest).await?;
                }
            }
        }
    }
    // After the fills are recorded, so a refill shows in the pods at once.
    read_pods(client, key, wanted, &mut facts).await?;
    Ok(claims_status(key, mode, wanted, digest, previous, &facts))
}

/// Where each planned claim's fill Job stands, by namespace.
async fn read_fills(client: &Client, wanted: &Plan) -> Result<BTreeMap<String, NamespaceFacts>> {
    let mut facts: BTreeMap<String, NamespaceFacts> = BTreeMap::new();
    for claim in &wanted.claims {
        let seen = facts.entry(claim.namespace.clone()).or_default();
        let Some(job_name) = &claim.job else { continue };
        let job = Api::<Job>::namespaced(client.clone(), &claim.namespace)
            .get_opt(job_name)
            .await?;
        let js = job.as_ref().and_then(|j| j.status.as_ref());
        let fill = if js.and_then(|s| s.succeeded).unwrap_or(0) > 0 {
            Fill::Done
        } else if js.and_then(|s| s.failed).unwrap_or(0) > FAILED_AFTER {
            Fill::Failed
        } else {
            Fill::Pending
        };
        seen.fills.insert(claim.name.clone(), fill);
    }
    Ok(facts)
}

/// Counts, per namespace, the pods using its claims (or a claim named after
/// the cache), as running or as started before a refill.
async fn read_pods(
    client: &Client,
    key: &CacheKey,
    wanted: &Plan,
    facts: &mut BTreeMap<String, NamespaceFacts>,
) -> Result<()> {
    for (namespace, seen) in facts.iter_mut() {
        let names: BTreeSet<String> = wanted
            .claims
            .iter()
            .filter(|c| &c.namespace == namespace)
            .map(|c| c.name.clone())
            .chain(std::iter::once(key.name().to_string()))
            .collect();
        for pod in pods_using(client, namespace, &names).await? {
            if refilled_since(client, namespace, &pod).await? {
                seen.pods_outdated += 1;
            } else {
                seen.pods_running += 1;
            }
        }
    }
    Ok(())
}

/// Marks `claim` as holding `digest`; on a refill (it held another digest)
/// records when, so that pods started before count as outdated.
async fn record_fill(client: &Client, namespace: &str, claim: &str, digest: &str) -> Result<()> {
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let Some(current) = api.get_opt(claim).await? else {
        return Ok(());
    };
    let annotations = current.annotations();
    let held = annotations.get(FILLED_ANNOTATION);
    if held.map(String::as_str) == Some(digest) {
        return Ok(());
    }
    let mut patch = json!({"metadata": {"annotations": {FILLED_ANNOTATION: digest}}});
    if held.is_some() {
        patch["metadata"]["annotations"][REFILLED_AT_ANNOTATION] =
            json!(Timestamp::now().to_string());
    }
    api.patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Whether a claim `pod` uses was refilled after the pod started.
async fn refilled_since(client: &Client, namespace: &str, pod: &Pod) -> Result<bool> {
    let Some(started) = pod.metadata.creation_timestamp.as_ref() else {
        return Ok(false);
    };
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let Some(source) = &volume.persistent_volume_claim else {
            continue;
        };
        let Some(claim) = api.get_opt(&source.claim_name).await? else {
            continue;
        };
        let refilled = claim
            .annotations()
            .get(REFILLED_AT_ANNOTATION)
            .and_then(|t| t.parse::<Timestamp>().ok());
        if refilled.is_some_and(|t| t > started.0) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// On deletion: while pods use the cache's claims, nothing is removed
/// (`Err(WaitingForPods)`); then its Jobs, claims and volumes are deleted
/// (and gkm-made volume directories removed where the operator sees them),
/// and `Ok(true)` once none is left.
pub async fn remove_claims(key: &CacheKey, client: &Client, options: &PvcOptions) -> Result<bool> {
    let owned = Owned::list(key, client).await?;
    if owned.is_empty() {
        return Ok(true);
    }
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for claim in &owned.claims {
        by_namespace
            .entry(claim.namespace().unwrap_or_default())
            .or_default()
            .insert(claim.name_any());
    }
    let mut users = Vec::new();
    for (namespace, claims) in &by_namespace {
        for pod in pods_using(client, namespace, claims).await? {
            users.push(format!("{namespace}/{}", pod.name_any()));
        }
    }
    if !users.is_empty() {
        return Err(Error::WaitingForNodes(format!(
            "{key}: pods still use its claims: {}",
            users.join(", ")
        )));
    }
    for job in &owned.jobs {
        delete_job(
            client,
            &job.namespace().unwrap_or_default(),
            &job.name_any(),
        )
        .await?;
    }
    for claim in &owned.claims {
        delete(
            &Api::<PersistentVolumeClaim>::namespaced(
                client.clone(),
                &claim.namespace().unwrap_or_default(),
            ),
            &claim.name_any(),
        )
        .await?;
    }
    for volume in &owned.volumes {
        if claim_gone(client, volume).await? {
            remove_volume_dir(options, &volume.name_any());
            delete(
                &Api::<PersistentVolume>::all(client.clone()),
                &volume.name_any(),
            )
            .await?;
        }
    }
    Ok(false)
}

/// Makes a gkm-made volume's directory owned by the fill user when the
/// operator can see the volume directory (it runs with it mounted, or on a
/// node sharing it): hostPath volumes take no `fsGroup`, and the kubelet
/// would make the directory root's, which a non-root fill cannot write.
/// Where the operator cannot see it, the fill says what is wrong.
fn prepare_volume_dir(options: &PvcOptions, name: &str) {
    let Some(dir) = options.volume_dir.as_ref().filter(|d| d.is_dir()) else {
        return;
    };
    let path = dir.join(name);
    let uid = objects::FILL_UID as u32;
    let owned = std::fs::metadata(&path)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == uid)
        .unwrap_or(false);
    if owned || name.is_empty() {
        return;
    }
    let made = std::fs::create_dir_all(&path)
        .and_then(|()| std::os::unix::fs::chown(&path, Some(uid), Some(uid)));
    if let Err(e) = made {
        tracing::warn!(path = %path.display(), error = %e, "preparing a volume directory for a non-root fill");
    }
}

/// Removes a gkm-made volume's directory when the operator can see it (the
/// operator runs with the volume directory mounted, or on a node sharing it).
fn remove_volume_dir(options: &PvcOptions, name: &str) {
    if let Some(dir) = &options.volume_dir {
        let path = dir.join(name);
        if path.is_dir()
            && let Err(e) = std::fs::remove_dir_all(&path)
        {
            tracing::warn!(path = %path.display(), error = %e, "removing a volume directory");
        }
    }
}
