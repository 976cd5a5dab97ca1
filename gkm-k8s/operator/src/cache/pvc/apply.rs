//! Thin glue: applies a [`Plan`] with server-side apply (one field manager),
//! removes what the cache owns and the plan no longer names, reads the fill
//! Jobs and the pods using the claims back into status, and on deletion
//! waits for those pods before removing Jobs, claims and volumes.
//!
//! What it reads comes from the watches ([`Watches`]) and from the answers
//! to its own writes, never from a list: a reconcile costs its writes only.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use serde_json::json;
use tracing::info;

use super::facts::{ClaimFacts, ClaimUser};
use super::objects::{self, PvcOptions};
use super::plan::{ImageVariants, Plan, PlanInput, PvcMode, plan};
use super::status::{Fill, NamespaceFacts, claims_status};
use super::watch::{Owned, Watches};
use crate::error::{Error, Result};
use crate::names::FIELD_MANAGER;
use gkm_k8s_api::cache_object::{CacheKey, CacheObject};
use gkm_k8s_api::crd::{CacheState, PvcOwner, PvcStatus};
use gkm_k8s_runtime::watched_index::ObjectId;

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

/// What this reconcile's own writes answered: each applied claim's
/// annotations and each applied Job's fill, by (namespace, name). Fresher
/// than the watches, which show a write a moment later.
#[derive(Debug, Default)]
struct Applied {
    claims: BTreeMap<(String, String), ClaimFacts>,
    fills: BTreeMap<(String, String), Fill>,
}

/// What the operator resolved a cache's image to, as its claims are
/// planned from it.
#[derive(Debug, Clone, Copy)]
pub struct ResolvedImage<'a> {
    /// The digest the tag resolves to now, if resolved.
    pub digest: Option<&'a str>,
    /// The operator's recorded verdict: may this digest be delivered?
    pub deliverable: bool,
    /// The nodes whose agents report the digest compatible, each with the
    /// variant it holds ([`PlanInput::compatible_nodes`]).
    pub compatible_nodes: &'a BTreeMap<String, Option<u64>>,
    /// What the digest is: one image, or an index of variants.
    pub variants: ImageVariants<'a>,
}

/// Applies what `cache` should have in PVC mode for its `image` (nothing
/// in CSI mode: what it owned is removed), and reports what is there.
pub async fn reconcile_claims<K: CacheObject>(
    cache: &K,
    client: &Client,
    watches: &Watches,
    options: &PvcOptions,
    image: ResolvedImage<'_>,
) -> Result<ClaimsOutcome> {
    let key = cache.key();
    let spec = cache.cache_spec();
    let namespaces = watches.namespaces();
    let digest = image.digest;
    let wanted = plan(&PlanInput {
        key: &key,
        spec,
        digest,
        deliverable: image.deliverable,
        existing_namespaces: &namespaces,
        compatible_nodes: image.compatible_nodes,
        variants: image.variants,
        make_volumes: options.volume_dir.is_some(),
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut applied = Applied::default();
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
        let written = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &claim.namespace)
            .patch(&claim.name, &params, &Patch::Apply(&body))
            .await?;
        let id = (claim.namespace.clone(), claim.name.clone());
        applied.claims.insert(id.clone(), ClaimFacts::of(&written));
        // Each Job is pinned to the digest it extracts: of a multi-target
        // image, its claim's variant.
        if let Some(d) = claim.fill_digest.as_deref()
            && let Some(body) =
                objects::job(&key, spec, claim, d, &pinned(&spec.image, d)?, options)
            && let Some(name) = &claim.job
        {
            let job = Api::<Job>::namespaced(client.clone(), &claim.namespace)
                .patch(name, &params, &Patch::Apply(&body))
                .await?;
            applied.fills.insert(id, Fill::of(job.status.as_ref()));
        }
    }
    prune(&key, client, watches, &wanted).await?;
    let previous = cache.cache_status().and_then(|s| s.pvc_status.as_ref());
    observe(
        &key,
        spec,
        client,
        watches,
        &wanted,
        &mut applied,
        digest,
        previous,
    )
    .await
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

/// Removes the Jobs, claims and volumes `key` owns that `wanted` does not
/// name. What the watches do not show yet is removed by the reconcile its
/// arrival triggers.
async fn prune(key: &CacheKey, client: &Client, watches: &Watches, wanted: &Plan) -> Result<()> {
    let claims: BTreeSet<ObjectId> = wanted
        .claims
        .iter()
        .map(|c| (Some(c.namespace.clone()), c.name.clone()))
        .collect();
    let jobs: BTreeSet<ObjectId> = wanted
        .claims
        .iter()
        .filter_map(|c| Some((Some(c.namespace.clone()), c.job.clone()?)))
        .collect();
    let volumes: BTreeSet<ObjectId> = wanted
        .claims
        .iter()
        .filter_map(|c| Some((None, c.volume.clone()?)))
        .collect();
    let owned = watches.owned(key);
    // A Job of another digest goes at once: two fills never write one claim.
    for (namespace, name) in &owned.jobs {
        if !jobs.contains(&(namespace.clone(), name.clone())) {
            delete_job(client, namespace.as_deref().unwrap_or_default(), name).await?;
        }
    }
    for (namespace, name) in &owned.claims {
        if !claims.contains(&(namespace.clone(), name.clone())) {
            let namespace = namespace.as_deref().unwrap_or_default();
            info!(cache = %key, claim = %format!("{namespace}/{name}"), "removing a claim the cache no longer asks for");
            delete(
                &Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace),
                name,
            )
            .await?;
        }
    }
    for (_, name) in &owned.volumes {
        if !volumes.contains(&(None, name.clone())) {
            delete_volume_once_unclaimed(client, name, None).await?;
        }
    }
    Ok(())
}

/// Deletes the gkm-made volume `name` once its claim is gone (asked of the
/// apiserver: a volume is removed rarely, and never while claimed), with
/// its directory when `options` lets the operator see it.
async fn delete_volume_once_unclaimed(
    client: &Client,
    name: &str,
    options: Option<&PvcOptions>,
) -> Result<()> {
    let api = Api::<PersistentVolume>::all(client.clone());
    let Some(volume) = api.get_opt(name).await? else {
        return Ok(());
    };
    if !claim_gone(client, &volume).await? {
        return Ok(());
    }
    if let Some(options) = options {
        remove_volume_dir(options, name);
    }
    delete(&api, name).await
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

/// Everything a cache owns, listed by its labels: asked of the apiserver
/// only when the watches show nothing left of a deleted cache, since
/// letting it go on a view a moment old would leave behind what nobody
/// removes then.
async fn list_owned(key: &CacheKey, client: &Client) -> Result<Owned> {
    let selector = ListParams::default().labels(&objects::owner_selector(key));
    fn ids<K: kube::Resource + Clone>(
        found: kube::core::ObjectList<kube::core::PartialObjectMeta<K>>,
    ) -> Vec<ObjectId> {
        found
            .items
            .iter()
            .map(gkm_k8s_runtime::watched_index::id_of)
            .collect()
    }
    Ok(Owned {
        jobs: ids(Api::<Job>::all(client.clone())
            .list_metadata(&selector)
            .await?),
        claims: ids(Api::<PersistentVolumeClaim>::all(client.clone())
            .list_metadata(&selector)
            .await?),
        volumes: ids(Api::<PersistentVolume>::all(client.clone())
            .list_metadata(&selector)
            .await?),
    })
}

/// Reads the fills back, records on each claim the digest it holds once
/// its Job completed, reads the pods using the claims, and makes the status
/// of what it read ([`claims_status`]).
#[allow(clippy::too_many_arguments)]
async fn observe(
    key: &CacheKey,
    spec: &gkm_k8s_api::crd::CacheSpec,
    client: &Client,
    watches: &Watches,
    wanted: &Plan,
    applied: &mut Applied,
    digest: Option<&str>,
    previous: Option<&BTreeMap<String, PvcStatus>>,
) -> Result<ClaimsOutcome> {
    let Some(mode) = PvcMode::of(spec) else {
        return Ok(ClaimsOutcome::default());
    };
    let mut facts = read_fills(wanted, applied);
    if let Some(digest) = digest {
        for (namespace, seen) in &facts {
            for (claim, fill) in &seen.fills {
                if *fill == Fill::Done {
                    record_fill(client, applied, namespace, claim, digest).await?;
                }
            }
        }
    }
    // After the fills are recorded, so a refill shows in the pods at once.
    read_pods(watches, key, wanted, applied, &mut facts).await?;
    Ok(claims_status(key, mode, wanted, digest, previous, &facts))
}

/// Where each planned claim's fill Job stands, by namespace, as applying
/// it answered.
fn read_fills(wanted: &Plan, applied: &Applied) -> BTreeMap<String, NamespaceFacts> {
    let mut facts: BTreeMap<String, NamespaceFacts> = BTreeMap::new();
    for claim in &wanted.claims {
        let seen = facts.entry(claim.namespace.clone()).or_default();
        if claim.job.is_none() {
            continue;
        }
        let fill = applied
            .fills
            .get(&(claim.namespace.clone(), claim.name.clone()))
            .copied()
            .unwrap_or(Fill::Pending);
        seen.fills.insert(claim.name.clone(), fill);
    }
    facts
}

/// Counts, per namespace, the pods using its claims (or a claim named after
/// the cache), as running or as started before a refill.
async fn read_pods(
    watches: &Watches,
    key: &CacheKey,
    wanted: &Plan,
    applied: &Applied,
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
        for (_, user) in watches.pods_using(namespace, &names).await? {
            if refilled_since(watches, applied, namespace, &user) {
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
async fn record_fill(
    client: &Client,
    applied: &mut Applied,
    namespace: &str,
    claim: &str,
    digest: &str,
) -> Result<()> {
    let id = (namespace.to_string(), claim.to_string());
    let Some(held) = applied.claims.get(&id) else {
        return Ok(());
    };
    if held.filled.as_deref() == Some(digest) {
        return Ok(());
    }
    let mut patch = json!({"metadata": {"annotations": {FILLED_ANNOTATION: digest}}});
    if held.filled.is_some() {
        patch["metadata"]["annotations"][REFILLED_AT_ANNOTATION] =
            json!(Timestamp::now().to_string());
    }
    let written = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    applied.claims.insert(id, ClaimFacts::of(&written));
    Ok(())
}

/// Whether a claim `user` uses was refilled after the pod started.
fn refilled_since(watches: &Watches, applied: &Applied, namespace: &str, user: &ClaimUser) -> bool {
    let Some(started) = user.created else {
        return false;
    };
    user.claims.iter().any(|claim| {
        let held = applied
            .claims
            .get(&(namespace.to_string(), claim.clone()))
            .cloned()
            .or_else(|| watches.claim(namespace, claim));
        held.and_then(|c| c.refilled_at)
            .is_some_and(|refilled| refilled > started)
    })
}

/// On deletion: while pods use the cache's claims, nothing is removed
/// (`Err(WaitingForPods)`); then its Jobs, claims and volumes are deleted
/// (and gkm-made volume directories removed where the operator sees them),
/// and `Ok(true)` once none is left.
pub async fn remove_claims(
    key: &CacheKey,
    client: &Client,
    watches: &Watches,
    options: &PvcOptions,
) -> Result<bool> {
    let mut owned = watches.owned(key);
    if owned.is_empty() {
        owned = list_owned(key, client).await?;
        if owned.is_empty() {
            return Ok(true);
        }
    }
    let mut by_namespace: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (namespace, name) in &owned.claims {
        by_namespace
            .entry(namespace.clone().unwrap_or_default())
            .or_default()
            .insert(name.clone());
    }
    let mut users = Vec::new();
    for (namespace, claims) in &by_namespace {
        for (pod, _) in watches.pods_using(namespace, claims).await? {
            users.push(format!("{namespace}/{pod}"));
        }
    }
    if !users.is_empty() {
        return Err(Error::WaitingForNodes(format!(
            "{key}: pods still use its claims: {}",
            users.join(", ")
        )));
    }
    for (namespace, name) in &owned.jobs {
        delete_job(client, namespace.as_deref().unwrap_or_default(), name).await?;
    }
    for (namespace, name) in &owned.claims {
        delete(
            &Api::<PersistentVolumeClaim>::namespaced(
                client.clone(),
                namespace.as_deref().unwrap_or_default(),
            ),
            name,
        )
        .await?;
    }
    for (_, name) in &owned.volumes {
        delete_volume_once_unclaimed(client, name, Some(options)).await?;
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
    let uid = crate::names::FILL_UID as u32;
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
