//! The one reconcile for both cache kinds: resolve, verify, roll up, write
//! status once per real change; on deletion, wait for the nodes, then let go.

use std::sync::Arc;
use std::time::Duration;

use gkm_oci::{Image, ImageRef, Repo};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::Store;
use serde_json::json;
use tracing::{info, warn};

use super::Context;
use super::conditions::{Cond, merge};
use super::rollup::rollup;
use super::verdict::verdict;
use crate::cache_object::{CacheObject, NodeReport};
use crate::crd::{CacheState, CacheStatus};
use crate::error::{Error, Result};
use crate::pvc::{PvcMode, reconcile_claims, remove_claims};

/// The finalizer that holds a cache until no node uses or reports it.
pub const FINALIZER: &str = "gkm.io/cleanup";

/// Reconciles one cache of either kind.
pub async fn reconcile<K: CacheObject>(
    cache: Arc<K>,
    ctx: Arc<Context>,
    reports: Store<K::NodeReport>,
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

/// How the controller retries a failed reconcile.
pub fn error_policy<K: CacheObject>(cache: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    match error {
        Error::WaitingForNodes(_) => Action::requeue(Duration::from_secs(2)),
        // Retrying at once would only panic again: back off a while.
        Error::Panicked(why) => {
            tracing::error!(cache = %cache.key(), %why, "reconcile panicked");
            Action::requeue(Duration::from_secs(300))
        }
        other => {
            warn!(cache = %cache.key(), error = %other, "reconcile failed");
            Action::requeue(Duration::from_secs(10))
        }
    }
}

async fn apply<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    reports: &Store<K::NodeReport>,
) -> Result<Action> {
    let key = cache.key();
    let spec = cache.cache_spec();
    let old = cache.cache_status().cloned().unwrap_or_default();
    let generation = cache.meta().generation;
    let (interval, interval_note) = resolve_interval(
        spec.resolve_interval.as_deref(),
        ctx.config.resolve_interval,
    );
    if let Some(note) = &interval_note {
        warn!(cache = %key, "{note}");
    }

    let resolved = resolve(&spec.image, interval, ctx).await;
    let mut status = CacheStatus {
        observed_generation: generation,
        ..old.clone()
    };
    let mut wanted = Vec::new();
    match &resolved {
        Err(message) => {
            status.state = Some(CacheState::Error);
            wanted.push(Cond {
                type_: "Ready",
                status: false,
                reason: "ResolveFailed",
                message: message.clone(),
            });
        }
        Ok(digest) => {
            status.resolved_digest = Some(digest.clone());
            let (verification, checked) = verdict(cache, ctx, digest, &old).await;
            if checked {
                let (type_, reason) = if verification.verified {
                    (EventType::Normal, "Verified")
                } else {
                    (EventType::Warning, "VerificationFailed")
                };
                let note = verification.message.clone().unwrap_or_default();
                publish(cache, ctx, type_, reason, note).await;
            }
            let ok = verification.is_deliverable();
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
            status.verification = Some(verification);
            let entries = reports_for(&key.name, cache, reports);
            let (mut counts, state) = rollup(Some(digest), false, entries.iter());
            status.state = Some(if ok { state } else { CacheState::Error });
            if PvcMode::of(spec).is_some() || old.pvc_status.is_some() {
                let nodes = compatible_nodes(&key.name, cache, reports, digest);
                let claims = reconcile_claims(
                    cache,
                    &ctx.client,
                    &ctx.config.pvc,
                    Some(digest),
                    ok,
                    &nodes,
                )
                .await?;
                if let Some(state) = claims.state {
                    status.state = Some(if ok { state } else { CacheState::Error });
                }
                if PvcMode::of(spec).is_some() {
                    counts.pod_running_cnt = claims.pods_running;
                    counts.pod_outdated_cnt = claims.pods_outdated;
                }
                status.pvc_owner = claims.owner;
                status.pvc_status = claims.pvc_status;
            }
            status.counts = counts;
            let ready = ok && (counts.node_in_use_cnt + counts.node_not_in_use_cnt) > 0;
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
                message: format!(
                    "{} of {} nodes hold {digest}",
                    counts.node_in_use_cnt + counts.node_not_in_use_cnt,
                    counts.node_cnt
                ),
            });
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
    if let Some(message) = interval_note {
        wanted.push(Cond {
            type_: "ResolveIntervalValid",
            status: false,
            reason: "OutOfBounds",
            message,
        });
    }
    status.conditions = Some(merge(old.conditions.as_deref(), wanted, generation));
    write_status(cache, ctx, &old, status).await?;
    Ok(Action::requeue(interval))
}

async fn cleanup<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    reports: &Store<K::NodeReport>,
) -> Result<Action> {
    let key = cache.key();
    let old = cache.cache_status().cloned().unwrap_or_default();
    let entries = live_reports_for(cache, ctx, reports).await?;
    let (counts, _) = rollup(old.resolved_digest.as_deref(), true, entries.iter());
    let status = CacheStatus {
        state: Some(CacheState::Deleting),
        counts,
        ..old.clone()
    };
    write_status(cache, ctx, &old, status).await?;
    if !remove_claims(&key, &ctx.client, &ctx.config.pvc).await? {
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
    info!(cache = %key, "no node uses or reports the cache; releasing it");
    Ok(Action::await_change())
}

/// Each reporting node's entries for the cache named `name` (in the cache's
/// namespace for a namespaced cache), with the node's name.
fn reports_by_node<K: CacheObject>(
    name: &str,
    cache: &K,
    reports: &Store<K::NodeReport>,
) -> Vec<(
    String,
    std::collections::BTreeMap<String, crate::crd::NodeCacheStatus>,
)> {
    let namespace = cache.namespace();
    reports
        .state()
        .iter()
        .filter(|r| r.namespace() == namespace)
        .filter_map(|r| {
            let entries = r
                .report()
                .and_then(|s| s.caches.as_ref())
                .and_then(|c| c.get(name))?;
            Some((r.name_any(), entries.clone()))
        })
        .collect()
}

/// The entries of every node report for the cache named `name`.
fn reports_for<K: CacheObject>(
    name: &str,
    cache: &K,
    reports: &Store<K::NodeReport>,
) -> Vec<std::collections::BTreeMap<String, crate::crd::NodeCacheStatus>> {
    reports_by_node(name, cache, reports)
        .into_iter()
        .map(|(_, entries)| entries)
        .collect()
}

/// The nodes whose agents report `digest` of the cache named `name`
/// extracted (so compatible with their GPUs): where ReadWriteOnce claims go.
fn compatible_nodes<K: CacheObject>(
    name: &str,
    cache: &K,
    reports: &Store<K::NodeReport>,
    digest: &str,
) -> std::collections::BTreeSet<String> {
    reports_by_node(name, cache, reports)
        .into_iter()
        .filter(|(_, entries)| {
            entries.get(digest).is_some_and(|e| {
                matches!(
                    e.state,
                    Some(CacheState::Extracted | CacheState::Running | CacheState::Outdated)
                )
            })
        })
        .map(|(node, _)| node)
        .collect()
}

/// Like [`reports_for`], but reports of nodes that no longer exist (scaled
/// down, deleted) are removed rather than waited for: no agent will ever
/// update them, and a deletion waiting on them would never end.
async fn live_reports_for<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    reports: &Store<K::NodeReport>,
) -> Result<Vec<std::collections::BTreeMap<String, crate::crd::NodeCacheStatus>>> {
    let name = cache.key().name;
    let namespace = cache.namespace();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut out = Vec::new();
    for report in reports.state() {
        if report.namespace() != namespace {
            continue;
        }
        let Some(entries) = report
            .report()
            .and_then(|s| s.caches.as_ref())
            .and_then(|c| c.get(&name))
        else {
            continue;
        };
        let node = report.name_any();
        if nodes.get_opt(&node).await?.is_some() {
            out.push(entries.clone());
            continue;
        }
        let api = K::NodeReport::api(ctx.client.clone(), namespace.as_deref());
        match api.delete(&node, &DeleteParams::default()).await {
            Ok(_) => {
                info!(cache = %cache.key(), %node, "removed the report of a node that no longer exists")
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
    let image_data = Image::fetch(&repo)
        .await
        .map_err(|e| format!("resolving {image}: {e}"))?;
    let digest = image_data.digest.to_string();
    ctx.resolutions
        .record(image, &digest, now, MAX_RESOLVE_INTERVAL);
    Ok(digest)
}

/// Writes `new` unless it equals `old` (ignoring `lastUpdated`), with an
/// event when the state changes.
async fn write_status<K: CacheObject>(
    cache: &K,
    ctx: &Context,
    old: &CacheStatus,
    mut new: CacheStatus,
) -> Result<()> {
    new.last_updated = old.last_updated.clone();
    if &new == old {
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
    api.patch_status(
        &cache.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": new })),
    )
    .await?;
    ctx.metrics
        .status_writes
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// Parses a duration made of whole units (`90s`, `5m`, `1h30m`, `250ms`);
/// `None` for anything else, a value that overflows included. Never panics.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let value: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(value), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(value), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(value.checked_mul(60)?), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(value.checked_mul(3600)?), 1)
        } else {
            return None;
        };
        total = total.checked_add(unit)?;
        rest = &rest[len..];
    }
    Some(total)
}

/// The interval a cache's tags are resolved again at: `spec.resolveInterval`
/// within [`MIN_RESOLVE_INTERVAL`] and [`MAX_RESOLVE_INTERVAL`], else
/// `default`; with a note when the spec's value was not used as written.
pub fn resolve_interval(spec: Option<&str>, default: Duration) -> (Duration, Option<String>) {
    let Some(text) = spec else {
        return (default, None);
    };
    match parse_duration(text) {
        None => (
            default,
            Some(format!(
                "resolveInterval {text:?} is not a duration; using {default:?}"
            )),
        ),
        Some(d) if d < MIN_RESOLVE_INTERVAL => (
            MIN_RESOLVE_INTERVAL,
            Some(format!(
                "resolveInterval {text:?} is below the minimum; using {MIN_RESOLVE_INTERVAL:?}"
            )),
        ),
        Some(d) if d > MAX_RESOLVE_INTERVAL => (
            MAX_RESOLVE_INTERVAL,
            Some(format!(
                "resolveInterval {text:?} is above the maximum; using {MAX_RESOLVE_INTERVAL:?}"
            )),
        ),
        Some(d) => (d, None),
    }
}

/// The shortest `resolveInterval` honoured (the CRD refuses shorter ones).
pub const MIN_RESOLVE_INTERVAL: Duration = Duration::from_secs(10);
/// The longest `resolveInterval` honoured (the CRD refuses longer ones).
pub const MAX_RESOLVE_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_like_the_crd_pattern() {
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5 minutes"), None);
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("10"), None);
    }

    #[test]
    fn durations_that_overflow_are_refused_not_panics() {
        assert_eq!(parse_duration("9999999999999999h"), None);
        assert_eq!(parse_duration("18446744073709551615m"), None);
        assert_eq!(parse_duration("18446744073709551615s1s"), None);
        assert_eq!(parse_duration("99999999999999999999s"), None);
    }

    #[test]
    fn resolve_intervals_are_bounded() {
        use super::{MAX_RESOLVE_INTERVAL, MIN_RESOLVE_INTERVAL, resolve_interval};
        let default = Duration::from_secs(300);
        assert_eq!(resolve_interval(None, default), (default, None));
        assert_eq!(
            resolve_interval(Some("1m"), default).0,
            Duration::from_secs(60)
        );
        let (d, note) = resolve_interval(Some("0s"), default);
        assert_eq!(d, MIN_RESOLVE_INTERVAL);
        assert!(note.is_some_and(|n| n.contains("minimum")));
        assert_eq!(
            resolve_interval(Some("9999h"), default).0,
            MAX_RESOLVE_INTERVAL
        );
        let (d, note) = resolve_interval(Some("9999999999999999h"), default);
        assert_eq!(d, default);
        assert!(note.is_some_and(|n| n.contains("not a duration")));
    }

    proptest::proptest! {
        /// No text makes the parser panic.
        #[test]
        fn parsing_never_panics(text in "\\PC{0,40}|[0-9]{0,25}(ms|s|m|h)([0-9]{0,25}(ms|s|m|h)){0,3}") {
            let _ = parse_duration(&text);
        }
    }
}
