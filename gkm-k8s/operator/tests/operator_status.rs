//! How the operator writes status and what it counts, against a real
//! kube-apiserver and a real registry:
//!
//! - status is applied server-side by one field manager, `gkm-operator`, so
//!   a field the operator stops setting (`pvcStatus` after leaving PVC mode)
//!   is removed, and a steady cache is not written again;
//! - a refused image is announced once, not at every requeue;
//! - what the agents act on goes to each cache's release, written when it
//!   changes: a node's report that changes only the counts reaches no
//!   watcher of the releases, and the image's targets are read once per
//!   digest; a release deleted or changed by another hand is written again;
//! - the operator's metrics pass Prometheus's parser and promlint, with the
//!   reconciles per controller and the registry requests counted.

mod operator_support;

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use gkm_k8s_api::cache_object::Scope;
use gkm_k8s_api::crd::{
    CacheState, GKMCache, GKMCacheNode, GKMCacheRelease, ImageTarget, PvcOwner, PvcStatus,
};
use gkm_k8s_operator::{
    ImageVerifier, Metrics, OperatorCollector, OperatorConfig, RegistryVerifier, TenantSigners,
};
use gkm_oci::sign::{SignFormat, SigningKey, sign};
use gkm_testenv::{ControlPlane, Registry, eventually, field_managers, promlint, samples};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use operator_support::{OPERATOR_NAMESPACE, WAIT, cache, pem, push, put_secret, registry_options};
use serde_json::json;

const MANAGER: &str = "gkm-operator";

/// Who writes a cache's status, and how: (manager, operation) pairs.
fn status_managers(cache: &GKMCache) -> Vec<(String, String)> {
    cache
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| f.subresource.as_deref() == Some("status"))
        .map(|f| {
            (
                f.manager.clone().unwrap_or_default(),
                f.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_is_applied_by_the_operator_and_counted() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    let registry = Registry::shared()?;
    let ns = "operator-status";
    plane.ensure_namespace(ns).await?;
    plane.ensure_namespace(OPERATOR_NAMESPACE).await?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), ns);
    let (signed, digest) = push(registry, "operator-status/signed").await?;
    let (unsigned, _) = push(registry, "operator-status/unsigned").await?;
    let (key, _) = SigningKey::generate_p256()?;
    sign(
        &signed.parse()?,
        &registry_options(),
        &digest.parse()?,
        &key,
        SignFormat::Bundle,
    )
    .await?;
    put_secret(&client, ns, "signer", &pem(key.public_key())).await?;

    let apply = PatchParams::apply("gkm-test").force();
    let signature =
        json!({"signers": [{"key": {"secretRef": {"name": "signer", "key": "cosign.pub"}}}]});
    // What an operator from before server-side apply left behind: status
    // written by a merge patch naming no field manager, with a pvcStatus.
    let object = cache(
        ns,
        "upgraded",
        json!({"image": signed, "signature": signature}),
    )?;
    caches
        .patch("upgraded", &apply, &Patch::Apply(&object))
        .await?;
    let old_status = json!({"status": {
        "state": "Pending",
        "pvcOwner": PvcOwner::Operator,
        "pvcStatus": {ns: {"pvcName": "upgraded-cache"}},
    }});
    caches
        .patch_status(
            "upgraded",
            &PatchParams::default(),
            &Patch::Merge(&old_status),
        )
        .await?;
    let before = caches.get("upgraded").await?;
    assert_eq!(
        status_managers(&before),
        [("unknown".to_string(), "Update".to_string())],
        "{:?}",
        before.metadata.managed_fields
    );

    let metrics = Arc::new(Metrics::default());
    let config = OperatorConfig {
        registry: registry_options(),
        resolve_interval: Duration::from_secs(1),
        // The caches name their own signers: counted in this namespace only.
        tenant_signers: TenantSigners::in_namespaces([ns]),
        ..OperatorConfig::default()
    };
    let verifier: Arc<dyn ImageVerifier> = Arc::new(
        RegistryVerifier::new(client.clone(), registry_options(), OPERATOR_NAMESPACE)
            .with_metrics(metrics.clone()),
    );
    // The operator's client identifies itself, as the binary's does.
    let mut operator_config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(plane.kubeconfig())?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    gkm_k8s_runtime::identity::identify(&mut operator_config, MANAGER);
    let operator = tokio::spawn(gkm_k8s_operator::run(
        kube::Client::try_from(operator_config)?,
        config,
        verifier,
        metrics.clone(),
    ));

    for (name, image) in [("steady", &signed), ("refused", &unsigned)] {
        let object = cache(ns, name, json!({"image": image, "signature": signature}))?;
        caches.patch(name, &apply, &Patch::Apply(&object)).await?;
    }
    let steady = eventually("the signed cache verified", WAIT, || async {
        let cache = caches.get("steady").await?;
        let verified = cache
            .status
            .as_ref()
            .and_then(|s| s.verification.as_ref())
            .is_some_and(|v| v.verified);
        Ok(verified.then_some(cache))
    })
    .await?;
    let status = steady.status.clone().unwrap_or_default();
    // No node reports it: verified, waiting for nodes.
    assert_eq!(status.state, Some(CacheState::Pending), "{status:?}");
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.as_str(), c.reason.as_str()));
    assert_eq!(ready, Some(("False", "NoNodeReady")), "{status:?}");

    // One manager owns the status, by apply; nobody updates it otherwise.
    assert_eq!(
        status_managers(&steady),
        [(MANAGER.to_string(), "Apply".to_string())],
        "{:?}",
        steady.metadata.managed_fields
    );

    // Its other writes (the finalizer) are its own too, not `unknown`'s.
    assert_eq!(
        field_managers(&steady),
        ["gkm-operator", "gkm-test"],
        "{:?}",
        steady.metadata.managed_fields
    );
    assert!(
        steady
            .finalizers()
            .iter()
            .any(|f| f == gkm_k8s_operator::FINALIZER)
    );

    // After the upgrade the operator took over what the old writer owned,
    // and dropped the pvcStatus it no longer writes.
    let upgraded = eventually("the old pvcStatus removed", WAIT, || async {
        let cache = caches.get("upgraded").await?;
        let done = cache
            .status
            .as_ref()
            .is_some_and(|s| s.pvc_status.is_none() && s.verification.is_some());
        Ok(done.then_some(cache))
    })
    .await?;
    assert_eq!(
        status_managers(&upgraded),
        [(MANAGER.to_string(), "Apply".to_string())],
        "{:?}",
        upgraded.metadata.managed_fields
    );
    let status = upgraded.status.clone().unwrap_or_default();
    assert_eq!(status.pvc_owner, None, "{status:?}");
    assert_eq!(status.resolved_digest.as_deref(), Some(digest.as_str()));
    let status = steady.status.clone().unwrap_or_default();

    // A steady cache is reconciled again and again but not written again.
    let reconciles = metrics.reconciles(Scope::Namespaced);
    eventually("more reconciles", WAIT, || async {
        Ok((metrics.reconciles(Scope::Namespaced) >= reconciles + 4).then_some(()))
    })
    .await?;
    let after = caches.get("steady").await?;
    assert_eq!(
        after.status.as_ref().and_then(|s| s.last_updated.clone()),
        status.last_updated,
        "the steady cache's status was written again"
    );

    // What an earlier pass wrote in PVC mode, applied by the same manager:
    // back in CSI mode, the operator's next status leaves it out, and the
    // apiserver removes it.
    let mut with_claims = status.clone();
    with_claims.pvc_owner = Some(PvcOwner::Operator);
    with_claims.pvc_status = Some(
        [(
            ns.to_string(),
            PvcStatus {
                pvc_name: Some("steady-cache".into()),
                ..PvcStatus::default()
            },
        )]
        .into(),
    );
    let body = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "status": with_claims,
    });
    // What the write stored (the operator may clear it right after, before
    // a read here would see it).
    let seeded = caches
        .patch_status(
            "steady",
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?
        .status
        .unwrap_or_default();
    assert!(seeded.pvc_status.is_some(), "the seed took: {seeded:?}");
    let cleared = eventually("pvcStatus removed", WAIT, || async {
        let status = caches.get("steady").await?.status.unwrap_or_default();
        Ok((status.pvc_status.is_none()).then_some(status))
    })
    .await?;
    assert_eq!(cleared.pvc_owner, None, "{cleared:?}");
    assert_eq!(cleared.resolved_digest.as_deref(), Some(digest.as_str()));

    // The refused cache is checked at every requeue, and announced once.
    eventually("the unsigned cache refused", WAIT, || async {
        let status = caches.get("refused").await?.status.unwrap_or_default();
        Ok((status.state == Some(CacheState::Error)).then_some(()))
    })
    .await?;
    let (reconciles, writes) = (
        metrics.reconciles(Scope::Namespaced),
        metrics.status_writes(),
    );
    eventually("the refused cache checked again", WAIT, || async {
        Ok((metrics.reconciles(Scope::Namespaced) >= reconciles + 6).then_some(()))
    })
    .await?;
    assert_eq!(
        metrics.status_writes(),
        writes,
        "nothing changed, yet status was written"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let failures: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("VerificationFailed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("refused")
        })
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(field_managers(&failures[0]), [MANAGER], "{failures:?}");
    assert!(
        failures[0].series.is_none(),
        "the same refusal was published again: {:?}",
        failures[0].series
    );

    // The metrics, as a scrape reads them.
    let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
    registry.register_collector(Box::new(OperatorCollector(metrics.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    promlint(&text)?;
    let samples = samples(&text)?;
    let value = |name: &str, labels: &[(&str, &str)]| {
        samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .sum::<f64>()
    };
    assert!(
        value(
            "gkm_operator_reconciles_total",
            &[("controller", "gkmcache")]
        ) >= 10.0,
        "{text}"
    );
    assert!(
        value(
            "gkm_operator_reconcile_duration_seconds_count",
            &[("controller", "gkmcache")]
        ) >= 10.0,
        "{text}"
    );
    assert!(
        value(
            "gkm_operator_registry_requests_total",
            &[("operation", "resolve"), ("outcome", "ok")]
        ) >= 2.0,
        "{text}"
    );
    assert!(
        value(
            "gkm_operator_registry_requests_total",
            &[("operation", "verify"), ("outcome", "ok")]
        ) >= 2.0,
        "{text}"
    );
    assert_eq!(
        value("gkm_operator_caches", &[("state", "Pending")]),
        2.0,
        "{text}"
    );
    assert_eq!(
        value("gkm_operator_caches", &[("state", "Error")]),
        1.0,
        "{text}"
    );
    assert!(
        value("gkm_operator_status_writes_total", &[]) >= 3.0,
        "{text}"
    );
    // Conditions are a list keyed by type, as served: another writer's
    // condition joins the operator's instead of replacing them.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let served = crds.get("gkmcaches.gkm.io").await?;
    let conditions = served.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref()?.get("status"))
        .and_then(|s| s.properties.as_ref()?.get("conditions"))
        .expect("status.conditions in the served schema");
    assert_eq!(conditions.x_kubernetes_list_type.as_deref(), Some("map"));
    assert_eq!(
        conditions.x_kubernetes_list_map_keys.as_deref(),
        Some(&["type".to_string()][..])
    );
    let theirs = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "status": {"conditions": [{
            "type": "Mirrored", "status": "True", "reason": "Copied",
            "message": "copied elsewhere", "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]},
    });
    caches
        .patch_status(
            "refused",
            &PatchParams::apply("gkm-test-mirror"),
            &Patch::Apply(&theirs),
        )
        .await?;
    let status = caches.get("refused").await?.status.unwrap_or_default();
    let types: Vec<&str> = status
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert!(types.contains(&"Mirrored"), "{types:?}");
    assert!(
        types.contains(&"Verified"),
        "the operator's went: {types:?}"
    );
    assert!(types.contains(&"Ready"), "the operator's went: {types:?}");

    // What the agents watch: each cache's release, owned by the cache. The
    // steady cache's holds the digest, deliverable, and the image's one
    // variant with the sm75 target; the refused cache's says why, with no
    // variant.
    let releases: Api<GKMCacheRelease> = Api::namespaced(client.clone(), ns);
    let release = eventually("the steady cache's release", WAIT, || async {
        Ok(releases.get_opt("steady").await?)
    })
    .await?;
    let published = &release.spec.release;
    assert_eq!(published.digest.as_deref(), Some(digest.as_str()));
    assert!(published.deliverable && published.refusal.is_none());
    let variants = published.variants.clone().unwrap_or_default();
    assert_eq!(variants.len(), 1, "{published:?}");
    assert_eq!(variants[0].digest, digest);
    assert_eq!(
        variants[0].targets,
        [ImageTarget {
            backend: "cuda".into(),
            arch: "75".into(),
            warp_size: 32,
            ..variants[0].targets[0].clone()
        }]
    );
    let owner = release
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert_eq!(owner.len(), 1);
    assert_eq!(
        (owner[0].kind.as_str(), Some(owner[0].uid.clone())),
        ("GKMCache", steady.metadata.uid.clone())
    );
    let refused = releases.get("refused").await?.spec.release;
    assert!(!refused.deliverable && refused.variants.is_none());
    assert!(
        refused
            .refusal
            .as_deref()
            .is_some_and(|r| !r.is_empty() && !r.contains("not verified yet")),
        "{refused:?}"
    );
    let value_now = |name: &str, labels: &[(&str, &str)]| -> anyhow::Result<f64> {
        let mut registry = prometheus_client::registry::Registry::with_prefix("gkm");
        registry.register_collector(Box::new(OperatorCollector(metrics.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(gkm_testenv::samples(&text)?
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .sum())
    };
    // gkm's images carry their targets in the manifest's annotations too:
    // the manifest read to resolve the tag gave them, with no read of
    // their own.
    assert_eq!(
        value_now(
            "gkm_operator_registry_requests_total",
            &[("operation", "variants")]
        )?,
        0.0
    );
    // From here on, a watch of the namespace's three releases, as an
    // agent's.
    let listed = eventually("the three caches' releases", WAIT, || async {
        let listed = releases.list(&ListParams::default()).await?;
        Ok((listed.items.len() == 3).then_some(listed))
    })
    .await?;
    let mut watched = releases
        .watch(
            &WatchParams::default(),
            listed.metadata.resource_version.as_deref().unwrap_or("0"),
        )
        .await?
        .boxed();
    let (release_writes, status_writes) = (metrics.release_writes(), metrics.status_writes());

    // A node's report counts while its Node exists (the operator's watch
    // of Nodes says so); once the Node is gone, the operator removes the
    // report and stops counting it.
    let node = "operator-status-node";
    plane.ensure_node(node).await?;
    let reports: Api<GKMCacheNode> = Api::namespaced(client.clone(), ns);
    let report = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "metadata": {"name": node, "namespace": ns},
    });
    let agent = PatchParams::apply("gkm-test-agent").force();
    reports.patch(node, &agent, &Patch::Apply(&report)).await?;
    let report_status = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "status": {"nodeName": node, "caches": {"steady": {digest.as_str(): {"state": "Extracted"}}}},
    });
    reports
        .patch_status(node, &agent, &Patch::Apply(&report_status))
        .await?;
    let counted = |nodes: i32| {
        let caches = caches.clone();
        move || {
            let caches = caches.clone();
            async move {
                let status = caches.get("steady").await?.status.unwrap_or_default();
                Ok((status.counts.node_cnt == nodes).then_some(()))
            }
        }
    };
    eventually("the node's report counted", WAIT, counted(1)).await?;
    Api::<Node>::all(client.clone())
        .delete(node, &DeleteParams::default())
        .await?;
    eventually("the gone node's report removed", WAIT, || async {
        Ok(reports.get_opt(node).await?.is_none().then_some(()))
    })
    .await?;
    eventually("the gone node no longer counted", WAIT, counted(0)).await?;

    // The counts changed twice (status written), the releases not at all:
    // the watch of the releases saw no event.
    assert!(metrics.status_writes() >= status_writes + 2);
    assert_eq!(metrics.release_writes(), release_writes);
    let seen = tokio::time::timeout(Duration::from_secs(3), watched.try_next()).await;
    match seen {
        Err(_) => {}
        Ok(Ok(Some(WatchEvent::Bookmark(_)))) | Ok(Ok(None)) => {}
        Ok(other) => anyhow::bail!("a count-only change reached the releases' watch: {other:?}"),
    }

    // Deleting the cache: its release says so (the same watch sees it at
    // once), then goes with it.
    caches.delete("steady", &DeleteParams::default()).await?;
    let event = tokio::time::timeout(Duration::from_secs(30), watched.try_next()).await??;
    match event {
        Some(WatchEvent::Modified(r)) if r.spec.release.deleting => {}
        Some(WatchEvent::Deleted(_)) => {}
        other => anyhow::bail!("expected the release marked deleting, got {other:?}"),
    }
    eventually("the deleted cache's release removed", WAIT, || async {
        Ok(releases.get_opt("steady").await?.is_none().then_some(()))
    })
    .await?;

    // A release changed or deleted by another hand is written again at
    // once, though its cache did not change: the refused cache's release,
    // made to say its image may be delivered, then deleted.
    let written = releases.get("refused").await?;
    let forged = json!({"spec": {"release": {"deliverable": true, "refusal": null}}});
    releases
        .patch("refused", &PatchParams::default(), &Patch::Merge(&forged))
        .await?;
    eventually("the changed release restored", WAIT, || async {
        let now = releases.get("refused").await?;
        Ok((now.spec.release == written.spec.release).then_some(()))
    })
    .await?;
    releases.delete("refused", &DeleteParams::default()).await?;
    let restored = eventually("the deleted release restored", WAIT, || async {
        let now = releases.get_opt("refused").await?;
        Ok(now.filter(|r| r.uid() != written.uid()))
    })
    .await?;
    assert_eq!(restored.spec.release, written.spec.release);
    assert_eq!(restored.owner_references(), written.owner_references());

    assert!(!operator.is_finished(), "the operator stopped");
    operator.abort();
    Ok(())
}
