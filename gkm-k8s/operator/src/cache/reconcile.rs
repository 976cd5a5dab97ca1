//! The one reconcile for both cache kinds: resolve, verify, roll up, write
//! status once per real change; on deletion, wait for the nodes, then let go.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gkm_oci::{Image, ImageRef, Repo};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::Context;
use super::release::{release_of, remove_release, write_release};
use super::rollup::NodeEntries;
use super::rollup::{rollup, variant_nodes, variant_status, workload_usage};
use super::status::{Claims, Observed, Resolved, deleting, desired};
use super::status_owners::{LEGACY_STATUS_MANAGERS, upgrade_patch};
use super::tag_follow::{self, Decision, HISTORY_ANNOTATION, History, Hold};
use super::verdict::{verdict, verdict_event};
use crate::cache::pvc::{ImageVariants, PvcMode, ResolvedImage, reconcile_claims, remove_claims};
use crate::error::{Error, Result};
use crate::metrics::RegistryOperation;
use crate::names::FIELD_MANAGER;
use crate::report_index::ReportIndex;
use gkm_k8s_api::cache_object::{CacheObject, NodeReport};
use gkm_k8s_api::crd::{CacheStatus, MAX_RESOLVE_INTERVAL, VerificationStatus, resolve_interval};

/// The finalizer that holds a cache until no node uses or reports it.
pub const FINALIZER: &str = "gkm.io/cleanup";

/// Reconciles one cache of either kind.
pub async fn reconcile<K: CacheObject>(
    cache: Arc<K>,
    ctx: Arc<Context>,
    reports: Arc<ReportIndex>,
) -> Result<Action> {
    let api = K::api(ctx.client.clone(), cache.namespace().as_deref());
    finalizer(&api, FINALIZER, cache, |event| async {
        match event {
            Finalizer::Apply(cache) => apply(cache.as_ref(), &ctx, &reports).await,
            Finalizer::Cleanup(cache) => cleanup(cache.as_ref(), &ctx, &reports).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

async fn apply<K: CacheObject>(cache: &K, ctx: &Context, reports: &ReportIndex) -> Result<Action> {
    let key = cache.key();
    let spec = cache.cache_spec();
    let old = cache.cache_status().cloned().unwrap_or_default();
    let (interval, interval_note) = resolve_interval(
        spec.resolve_interval.as_deref(),
        ctx.config.resolve_interval,
    );
    if let Some(note) = &interval_note {
        warn!(cache = %key, "{note}");
    }

    // Fetch: the digest, then its verdict, the nodes' reports, the claims.
    let resolution = match resolve(&spec.image, interval, ctx).await {
        Err(message) => Err(message),
        Ok(digest) => Ok(observe(cache, ctx, &old, reports, digest).await?),
    };
    // Decide, then write once.
    let observed = Observed {
        generation: cache.meta().generation,
        old: &old,
        interval_note,
        resolution,
    };
    let mut status = desired(&observed);
    // The image's variants (read once per digest, usually with the
    // resolution itself), and of a multi-target image the nodes holding each.
    let variants = variants_of(spec, &status, ctx).await;
    if let (Ok(resolved), Some(Ok(published))) = (&observed.resolution, &variants) {
        status.variants = variant_status(&resolved.digest, published, &resolved.variant_nodes);
    }
    write_status(cache, ctx, &old, status.clone()).await?;
    // What the nodes act on, once the status says it.
    let unread = matches!(variants, Some(Err(_)));
    let release = release_of(spec, &status, variants, false);
    let for_class = ctx.config.device_classes.then(|| release.clone());
    if write_release(cache, &ctx.client, &ctx.releases, release).await? {
        ctx.metrics.release_written();
    }
    // After the release: a class that cannot be written (no DRA API, no
    // rights) fails the reconcile, never the nodes' delivery.
    if let Some(release) = for_class {
        ctx.device_classes
            .write(&ctx.client, &key, &release)
            .await?;
    }
    // Targets that could not be read are asked for again soon, not only at
    // the next resolution.
    Ok(Action::requeue(if unread {
        interval.min(crate::cache::variants::RETRY_AFTER)
    } else {
        interval
    }))
}

/// The variants of the digest `status` resolved, when its verdict lets it
/// be delivered (nodes read nothing of an image they may not deliver).
async fn variants_of(
    spec: &gkm_k8s_api::crd::CacheSpec,
    status: &CacheStatus,
    ctx: &Context,
) -> Option<std::result::Result<Vec<gkm_k8s_api::crd::ImageVariant>, String>> {
    let digest = status.resolved()?;
    if !status
        .verification
        .as_ref()
        .is_some_and(|v| v.admits(digest.as_str()))
    {
        return None;
    }
    Some(read_variants(spec, &digest, ctx).await)
}

/// The variants of `digest`, the image `spec` names (read once per digest).
async fn read_variants(
    spec: &gkm_k8s_api::crd::CacheSpec,
    digest: &gkm_oci::Digest,
    ctx: &Context,
) -> std::result::Result<Vec<gkm_k8s_api::crd::ImageVariant>, String> {
    let read = |ok, took| {
        ctx.metrics
            .registry_request(RegistryOperation::Variants, ok, took)
    };
    ctx.variants
        .of(&spec.image, digest, &ctx.config.registry, read)
        .await
}

/// What is known about `digest`, the image `cache` resolved to: its verdict
/// (announced when it is news), whether the cache follows its tag there
/// ([`tag_follow`]), the nodes' reports rolled up for the digest it serves,
/// and the claims when the cache is or was in PVC mode.
async fn observe<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    old: &CacheStatus,
    reports: &ReportIndex,
    digest: String,
) -> Result<Resolved> {
    let spec = cache.cache_spec();
    let (verification, checked) = verdict(cache, ctx, &digest, old).await;
    let (digest, verification, checked, hold) =
        follow_or_hold(cache, ctx, old, digest, verification, checked).await?;
    match &hold {
        None => {
            if let Some((type_, reason)) =
                verdict_event(old.verification.as_ref(), &verification, checked)
            {
                let note = verification.message.clone().unwrap_or_default();
                publish(cache, ctx, type_, reason, note).await;
            }
        }
        Some((reason, message)) => {
            let news =
                !old.conditions.iter().flatten().any(|c| {
                    c.type_ == TAG_FOLLOWED && c.reason == *reason && c.message == *message
                });
            if news {
                publish(
                    cache,
                    ctx,
                    EventType::Warning,
                    "TagNotFollowed",
                    message.clone(),
                )
                .await;
            }
        }
    }
    let entries = live_reports_for(cache, ctx, reports).await?;
    let nodes = rollup(Some(&digest), false, entries.iter().map(|(_, e)| e));
    let variant_nodes = variant_nodes(&digest, entries.iter().map(|(_, e)| e));
    let workloads = workload_usage(&digest, entries.iter().map(|(_, e)| e));
    let pvc_mode = PvcMode::of(spec).is_some();
    let claims = if pvc_mode || old.pvc_status.is_some() {
        // Of a multi-target image, each fill takes its nodes' variant: read
        // the variants (kept per digest, so the release reuses this read).
        let read = match digest.parse::<gkm_oci::Digest>() {
            Ok(parsed) if pvc_mode && verification.is_deliverable() => {
                Some(read_variants(spec, &parsed, ctx).await)
            }
            _ => None,
        };
        let variant_digests: Vec<String> = match &read {
            Some(Ok(variants)) => variants.iter().map(|v| v.digest.clone()).collect(),
            _ => Vec::new(),
        };
        let variants = match &read {
            Some(Err(why)) => ImageVariants::Unread(why),
            Some(Ok(_)) if !variant_digests.contains(&digest) => {
                ImageVariants::MultiTarget(&variant_digests)
            }
            _ => ImageVariants::Single,
        };
        let outcome = reconcile_claims(
            cache,
            &ctx.client,
            &ctx.pvc_watches,
            &ctx.config.pvc,
            ResolvedImage {
                digest: Some(&digest),
                deliverable: verification.is_deliverable(),
                compatible_nodes: &compatible_nodes(&entries, &digest),
                variants,
            },
        )
        .await?;
        Some(Claims { pvc_mode, outcome })
    } else {
        None
    };
    Ok(Resolved {
        digest,
        verification,
        nodes,
        variant_nodes,
        workloads,
        claims,
        hold,
    })
}

/// The `TagFollowed` condition's type.
const TAG_FOLLOWED: &str = "TagFollowed";

/// The digest served, its verdict, whether signatures were checked for it
/// now, and for a tag not followed, the `TagFollowed` condition's reason and
/// message.
type Served = (
    String,
    VerificationStatus,
    bool,
    Option<(&'static str, String)>,
);

/// Follows the tag to `digest` (recording the digest moved away from in the
/// cache's history), or keeps serving the digest the cache served, as
/// [`tag_follow::decide`] says.
async fn follow_or_hold<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    old: &CacheStatus,
    digest: String,
    verification: VerificationStatus,
    checked: bool,
) -> Result<Served> {
    let spec = cache.cache_spec();
    let image = &spec.image;
    let history = History::of(cache.annotations(), image);
    let quarantined = |d: &str| spec.quarantines(d);
    // What the cache serves, under the spec it has now: a changed spec is
    // followed as written.
    let current = old
        .resolved_digest
        .clone()
        .filter(|_| old.observed_generation == cache.meta().generation)
        .filter(|d| old.verification.as_ref().is_some_and(|v| v.admits(d)))
        .filter(|d| !quarantined(d));
    let why = verification.message.clone().unwrap_or_default();
    let hold = match tag_follow::decide(
        &digest,
        verification.is_deliverable(),
        &why,
        current.as_deref(),
        &history,
        quarantined,
    ) {
        Decision::Follow => {
            if let Some(from) = current.as_deref().filter(|c| *c != digest) {
                record_history(cache, ctx, &history.moved(from, &digest)).await?;
            }
            return Ok((digest, verification, checked, None));
        }
        Decision::Hold(hold) => hold,
    };
    // What to stay on: the digest served; under a quarantine, else the
    // digests moved away from, the most recent first.
    let mut stay_on: Vec<String> = current.iter().cloned().collect();
    if matches!(hold, Hold::Quarantined { .. }) {
        stay_on.extend(
            history
                .most_recent_first()
                .filter(|d| !quarantined(d) && current.as_deref() != Some(*d))
                .map(str::to_string),
        );
    }
    for candidate in stay_on {
        // Still verified under the policy in force (re-checked as usual)?
        let (kept, kept_checked) = verdict(cache, ctx, &candidate, old).await;
        if kept.admits(&candidate) {
            let message = hold.message(Some(&candidate));
            return Ok((
                candidate,
                kept,
                kept_checked,
                Some((hold.reason(), message)),
            ));
        }
    }
    // Nothing verified to stay on: the tag's digest, refused if it is a
    // rollback or quarantined.
    let message = hold.message(None);
    let mut verification = verification;
    if matches!(hold, Hold::RolledBack { .. } | Hold::Quarantined { .. }) {
        verification.deliverable = Some(false);
        verification.message = Some(message.clone());
        // Refused for the hold, not for its signatures: checked again at the
        // next reconcile rather than reused, so lifting the hold delivers it.
        verification.checked_at = None;
    }
    Ok((
        digest,
        verification,
        checked,
        Some((hold.reason(), message)),
    ))
}

/// Writes `history` into the cache's annotation.
async fn record_history<K: CacheObject>(cache: &K, ctx: &Context, history: &History) -> Result<()> {
    let api = K::api(ctx.client.clone(), cache.namespace().as_deref());
    let patch = json!({"metadata": {"annotations": {HISTORY_ANNOTATION: history.to_annotation()}}});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(&cache.name_any(), &params, &Patch::Merge(&patch))
        .await?;
    info!(cache = %cache.key(), replaced = ?history.replaced.last(), "the tag moved; the digest it replaced is remembered");
    Ok(())
}

async fn cleanup<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    reports: &ReportIndex,
) -> Result<Action> {
    let key = cache.key();
    // New claims stop landing through the cache's class at once; claims
    // allocated already keep their devices.
    if ctx.config.device_classes {
        ctx.device_classes.remove(&ctx.client, &key).await?;
    }
    let old = cache.cache_status().cloned().unwrap_or_default();
    let entries = live_reports_for(cache, ctx, reports).await?;
    let (counts, _) = rollup(
        old.resolved_digest.as_deref(),
        true,
        entries.iter().map(|(_, e)| e),
    );
    let status = deleting(&old, cache.meta().generation, counts, entries.len());
    write_status(cache, ctx, &old, status).await?;
    // The nodes drop what they held for it, keeping what pods still use.
    let release = release_of(cache.cache_spec(), &old, None, true);
    if write_release(cache, &ctx.client, &ctx.releases, release).await? {
        ctx.metrics.release_written();
    }
    if !remove_claims(&key, &ctx.client, &ctx.pvc_watches, &ctx.config.pvc).await? {
        return Err(Error::WaitingForNodes(format!(
            "{key}: its Jobs, claims and volumes are being removed"
        )));
    }
    if !entries.is_empty() {
        return Err(Error::WaitingForNodes(format!(
            "{key}: {} nodes still report it ({} pods use it)",
            entries.len(),
            counts.pod_deleting_cnt
        )));
    }
    remove_release(cache, &ctx.client, &ctx.releases).await?;
    info!(cache = %key, "no node uses or reports the cache; releasing it");
    ctx.pending_writes
        .forget(cache.uid().as_deref().unwrap_or_default());
    Ok(Action::await_change())
}

/// The nodes that serve `digest` ([`gkm_k8s_api::NodeFit::serves`]: their agents report
/// it extracted, so compatible with their GPUs), each with the variant it
/// holds of a multi-target image: where ReadWriteOnce claims go.
fn compatible_nodes(
    entries: &[(String, NodeEntries)],
    digest: &str,
) -> BTreeMap<String, Option<u64>> {
    entries
        .iter()
        .filter_map(|(node, entries)| {
            let (_, entry) = entries
                .iter()
                .find(|(d, e)| d == digest && e.fit.serves())?;
            Some((node.clone(), entry.variant))
        })
        .collect()
}

/// The entries of the nodes that report the cache, by node; reports of
/// nodes that no longer exist (scaled down, deleted) are removed rather
/// than counted or waited for: no agent will ever update them, and a
/// deletion waiting on them would never end.
async fn live_reports_for<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    reports: &ReportIndex,
) -> Result<Vec<(String, NodeEntries)>> {
    let key = cache.key();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut out = Vec::new();
    for (node, entries) in reports.for_cache(&key) {
        // The watched Nodes answer for nearly every report. A node missing
        // there is asked of the apiserver before its report goes: the watch
        // may not show a Node created a moment ago yet.
        let watched = ctx.nodes.get(&ObjectRef::new(&node)).is_some();
        if watched || nodes.get_metadata_opt(&node).await?.is_some() {
            out.push((node, entries));
            continue;
        }
        let api = K::NodeReport::api(ctx.client.clone(), key.namespace());
        match api.delete(&node, &DeleteParams::default()).await {
            Ok(_) => {
                info!(cache = %key, %node, "removed the report of a node that no longer exists")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// The digest `image` resolves to: remembered for `interval`, else asked
/// of the registry.
async fn resolve(image: &str, interval: Duration, ctx: &Context) -> Result<String, String> {
    let now = std::time::Instant::now();
    if let Some(digest) = ctx.resolutions.fresh(image, interval, now) {
        return Ok(digest);
    }
    let reference: ImageRef = image
        .parse()
        .map_err(|e| format!("spec.image {image:?}: {e}"))?;
    let repo = Repo::open(&reference, &ctx.config.registry).map_err(|e| format!("{image}: {e}"))?;
    let resolved = Image::resolve_manifest(&repo).await;
    ctx.metrics
        .registry_request(RegistryOperation::Resolve, resolved.is_ok(), now.elapsed());
    let resolution = resolved.map_err(|e| format!("resolving {image}: {e}"))?;
    // The image's targets, from the manifest (or index) just read.
    ctx.variants.seed(image, &resolution);
    let digest = resolution.digest().to_string();
    ctx.resolutions
        .record(image, &digest, now, MAX_RESOLVE_INTERVAL);
    Ok(digest)
}

/// Applies `new` (server-side, as [`FIELD_MANAGER`]) unless it equals `old`
/// ignoring `lastUpdated`, with an event when the state changes. The body
/// is the whole status the operator wants: a field it leaves out (a
/// `pvcStatus` after leaving PVC mode, a namespace's entry in it) is
/// removed, which a merge patch would leave in place.
/// Status fields a writer without a field manager owns are first taken
/// over ([`super::status_owners`]), so they are removed the same way.
async fn write_status<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    old: &CacheStatus,
    mut new: CacheStatus,
) -> Result<()> {
    new.last_updated = old.last_updated.clone();
    let uid = cache.uid().unwrap_or_default();
    if &new == old || ctx.pending_writes.repeats(&uid, old, &new) {
        return Ok(());
    }
    if new.state != old.state {
        let message = format!(
            "{:?} → {:?} ({})",
            old.state.unwrap_or_default(),
            new.state.unwrap_or_default(),
            new.resolved_digest.as_deref().unwrap_or("unresolved")
        );
        publish(cache, ctx, EventType::Normal, "StateChanged", message).await;
    }
    new.last_updated = Some(Time(Timestamp::now()));
    let api = K::api(ctx.client.clone(), cache.namespace().as_deref());
    if let Some(upgrade) = upgrade_patch(cache.meta(), FIELD_MANAGER, LEGACY_STATUS_MANAGERS) {
        // Status fields a writer without a field manager updated become this apply's, so
        // the apply below may drop them. Refused when the object changed
        // since it was read; the next reconcile works from the new one.
        let patch = Patch::Json::<()>(serde_json::from_value(upgrade)?);
        api.patch(&cache.name_any(), &PatchParams::default(), &patch)
            .await?;
    }
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": new,
    });
    api.patch_status(
        &cache.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    ctx.pending_writes.record(&uid, &new);
    ctx.metrics.status_written();
    Ok(())
}

async fn publish<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &cache.object_ref(&())).await {
        warn!(error = %e, "publishing an event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report_index::Entry;
    use gkm_k8s_api::crd::{CacheState, NodeCacheStatus};

    #[test]
    fn claims_go_to_the_nodes_that_serve_the_digest() {
        let reported = |state: CacheState, gpus: &[i32]| {
            Entry::from(&NodeCacheStatus {
                state: Some(state),
                compatible_gpus: Some(gpus.to_vec()),
                ..NodeCacheStatus::default()
            })
        };
        let digest = "sha256:a";
        let node = |name: &str, entry: Entry| (name.to_string(), vec![(digest.to_string(), entry)]);
        let entries = [
            node("extracted", reported(CacheState::Extracted, &[])),
            node("running", reported(CacheState::Running, &[0])),
            node("outdated", reported(CacheState::Outdated, &[])),
            // Fits, but nothing to claim on yet.
            node("downloading", reported(CacheState::Downloading, &[0])),
            node("incompatible", reported(CacheState::Incompatible, &[0])),
            (
                "other-digest".to_string(),
                vec![("sha256:b".to_string(), reported(CacheState::Extracted, &[]))],
            ),
        ];
        let nodes: Vec<String> = compatible_nodes(&entries, digest).into_keys().collect();
        assert_eq!(nodes, ["extracted", "outdated", "running"]);
    }
}
