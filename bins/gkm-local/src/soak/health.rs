//! Whether the system is healthy: gkm's pods Ready, the real node Ready,
//! and every cache converged at the digest its tag points at, held on every
//! node that should hold it. Recovery times run until this holds.

use gkm_k8s_api::crd::{CacheState, GKMCache, GKMCacheNode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use super::state::{CacheTruth, Shared};
use super::workload::{NAMESPACE, REAL_NODE};
use crate::SYSTEM_NAMESPACE;

/// What is not healthy yet, or `None` when all is.
pub async fn unhealthy(
    client: &kube::Client,
    components: &[&str],
    shared: &Shared,
) -> anyhow::Result<Option<String>> {
    // gkm's pods.
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let list = match pods
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=gkm"))
        .await
    {
        Ok(list) => list,
        Err(e) => return Ok(Some(format!("the apiserver: {e}"))),
    };
    for component in components {
        let ready = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("app.kubernetes.io/name"))
                    .is_some_and(|n| n == component)
            })
            .filter(|p| pod_ready(p))
            .count();
        if ready != 1 {
            return Ok(Some(format!("{component}: {ready} Ready pods")));
        }
    }
    // The real node.
    let node = Api::<Node>::all(client.clone()).get(REAL_NODE).await?;
    let node_ready = node
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if !node_ready {
        return Ok(Some(format!("node {REAL_NODE} not Ready")));
    }
    // Every cache at its latest digest, on every node that should hold it.
    let truths = shared.caches().clone();
    for (name, truth) in &truths {
        if let Some(why) = cache_unconverged(client, name, truth).await? {
            return Ok(Some(why));
        }
    }
    Ok(None)
}

/// Why cache `name` has not converged at `truth`'s latest digest on every
/// node that should hold it, or `None` once it has.
pub async fn cache_unconverged(
    client: &kube::Client,
    name: &str,
    truth: &CacheTruth,
) -> anyhow::Result<Option<String>> {
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NAMESPACE);
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), NAMESPACE);
    let status = caches.get(name).await?.status.unwrap_or_default();
    if status.resolved_digest.as_deref() != Some(truth.latest.as_str()) {
        return Ok(Some(format!(
            "cache {name} resolved to {:?}, its tag is at {}",
            status.resolved_digest, truth.latest
        )));
    }
    if !status.counts.all_settled() || status.counts.node_error_cnt > 0 {
        return Ok(Some(format!(
            "cache {name} not settled: {:?}",
            status.counts
        )));
    }
    if truth.claim
        && let Some(why) = super::claims::unfilled(client, name, &truth.latest).await?
    {
        return Ok(Some(why));
    }
    for node in &truth.nodes {
        let state = reports
            .get_opt(node)
            .await?
            .and_then(|r| r.status)
            .and_then(|s| s.caches)
            .and_then(|c| c.get(name)?.get(&truth.latest)?.state);
        if !state.is_some_and(CacheState::is_on_node) {
            return Ok(Some(format!(
                "cache {name} at {} not on node {node} ({state:?})",
                truth.latest
            )));
        }
    }
    Ok(None)
}

/// Whether `pod` is Running with every container ready.
pub fn pod_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready))
}
