//! PVC delivery reads from watches: on a real apiserver whose audit log
//! records every request of the operator's ServiceAccount, the operator
//! (in-process, as that ServiceAccount, under the shipped RBAC) makes and
//! keeps a `GKMCache`'s and a `ClusterGKMCache`'s claims, and reconciles
//! them when what they own or read changes — a pod mounting a claim comes
//! and goes, a claim is deleted, a served namespace appears — well within
//! the resolve interval, so only the watches can have triggered it, while
//! the audit log shows no list request at all.

mod operator_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use gkm_k8s_api::crd::{ClusterGKMCache, GKMCache};
use gkm_k8s_operator::OperatorConfig;
use gkm_testenv::{ControlPlane, ControlPlaneOptions, Registry, eventually};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use operator_support::{WAIT, push, registry_options, spawn_operator};
use serde_json::json;

const OPERATOR_USER: &str = "system:serviceaccount:gkm-system:gkm-operator";
/// One audit event per request of the operator's ServiceAccount.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [\"system:serviceaccount:gkm-system:gkm-operator\"]
- level: None
";
const TEAM: &str = "watched-team";
/// A namespace the cluster cache serves before it exists.
const LATER: &str = "watched-later";
/// The cluster cache, named past the 63 characters a label value may hold:
/// its claims are labelled with a cut name and still found as its own.
const SHARED: &str = "shared-add-named-longer-than-the-63-characters-a-label-value-may-hold";

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

/// The operator's requests logged after byte `from` of the audit log, as
/// (verb, resource).
fn operator_requests(log: &Path, from: u64) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read(log)?;
    let text = String::from_utf8_lossy(&text[from as usize..]).into_owned();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let event: serde_json::Value = serde_json::from_str(line)?;
        if event["user"]["username"] != OPERATOR_USER {
            continue;
        }
        out.push((
            event["verb"].as_str().unwrap_or_default().to_string(),
            event["objectRef"]["resource"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ));
    }
    Ok(out)
}

fn reader(name: &str, claim: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "app", "image": "busybox"}],
            "volumes": [{"name": "kernels",
                         "persistentVolumeClaim": {"claimName": claim, "readOnly": true}}],
        },
    }))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn pvc_reconciles_follow_watches_and_list_nothing() -> anyhow::Result<()> {
    let dir = gkm_testenv::temp_dir()?;
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY)?;
    let audit = dir.path().join("audit.log");
    let options = ControlPlaneOptions {
        apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ],
        // A deleted claim goes once no pod uses it: the protection
        // controller removes its finalizer.
        controller_manager: true,
        extra_controllers: vec!["persistentvolumeclaim-protection-controller".into()],
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start_in_dir(dir.path(), options).await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/operator.yaml"))
        .await?;
    plane.ensure_namespace(TEAM).await?;
    let admin = plane.client().await?;
    let (image, _) = push(Registry::shared()?, "pvc-watches/cache").await?;

    // The operator as its ServiceAccount; tags are resolved again only
    // after 5 minutes, so every reconcile below is a watch's doing. No
    // signer is configured: the claims are made and never filled.
    let client = plane
        .client_for(
            OPERATOR_USER,
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:gkm-system",
            ],
        )
        .await?;
    let config = OperatorConfig {
        registry: registry_options(),
        resolve_interval: Duration::from_secs(300),
        ..OperatorConfig::default()
    };
    let operator = spawn_operator(&client, config);

    let caches: Api<GKMCache> = Api::namespaced(admin.clone(), TEAM);
    let clusters: Api<ClusterGKMCache> = Api::all(admin.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), TEAM);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), TEAM);
    let spec = json!({"image": image, "storageClassName": "standard",
                      "accessModes": ["ReadOnlyMany"]});
    plane
        .apply_object(
            &json!({"apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
                    "metadata": {"name": "vector-add", "namespace": TEAM}, "spec": spec}),
            false,
        )
        .await?;
    let mut cluster_spec = spec.clone();
    cluster_spec["workloadNamespaces"] = json!([TEAM, LATER]);
    plane
        .apply_object(
            &json!({"apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
                    "metadata": {"name": SHARED}, "spec": cluster_spec}),
            false,
        )
        .await?;
    eventually("the cache's claim, in its status", WAIT, || async {
        let cache = caches.get("vector-add").await?;
        let named = cache
            .status
            .and_then(|s| s.pvc_status)
            .is_some_and(|p| p.contains_key(TEAM));
        Ok((named && claims.get_opt("vector-add").await?.is_some()).then_some(()))
    })
    .await?;
    // Its missing namespace gets no claim (nothing is verified here, so the
    // verdict decides the state; the claims show in pvcStatus).
    let served = || async {
        let cache = clusters.get(SHARED).await?;
        let namespaces: Vec<String> = cache
            .status
            .and_then(|s| s.pvc_status)
            .map(|p| p.into_keys().collect())
            .unwrap_or_default();
        anyhow::Ok(namespaces)
    };
    eventually(
        "the cluster cache's claim where its namespace exists",
        WAIT,
        || async {
            let made = claims.get_opt(SHARED).await?.is_some();
            Ok((made && served().await? == [TEAM]).then_some(()))
        },
    )
    .await?;
    let labels = claims
        .get(SHARED)
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("gkm.io/cache"),
        Some(&gkm_k8s_operator::names::label_value(SHARED)),
        "a long name is labelled cut"
    );
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), TEAM);
    eventually(
        "the namespace's default ServiceAccount, for pods",
        WAIT,
        || async { Ok(accounts.get_opt("default").await?.map(drop)) },
    )
    .await?;

    // From here on, every reconcile reads the watches.
    let mark = std::fs::metadata(&audit)?.len();
    pods.create(&PostParams::default(), &reader("reader", "vector-add")?)
        .await?;
    eventually("the pod using the claim is counted", WAIT, || async {
        let cache = caches.get("vector-add").await?;
        Ok(cache
            .status
            .filter(|s| s.counts.pod_running_cnt == 1)
            .map(drop))
    })
    .await?;
    claims.delete(SHARED, &DeleteParams::default()).await?;
    eventually("a deleted claim is made again", WAIT, || async {
        let claim = claims.get_opt(SHARED).await?;
        Ok(claim
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(drop))
    })
    .await?;
    plane.ensure_namespace(LATER).await?;
    eventually("a namespace that appears gets its claim", WAIT, || async {
        let later: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), LATER);
        let made = later.get_opt(SHARED).await?.is_some();
        Ok((made && served().await? == [LATER, TEAM]).then_some(()))
    })
    .await?;
    pods.delete("reader", &DeleteParams::default().grace_period(0))
        .await?;
    eventually("the pod that went is no longer counted", WAIT, || async {
        let cache = caches.get("vector-add").await?;
        Ok(cache
            .status
            .filter(|s| s.counts.pod_running_cnt == 0)
            .map(drop))
    })
    .await?;

    let requests = operator_requests(&audit, mark)?;
    let lists: Vec<_> = requests.iter().filter(|(verb, _)| verb == "list").collect();
    assert!(lists.is_empty(), "the reconciles listed: {lists:?}");
    let claim_writes = requests
        .iter()
        .filter(|(verb, resource)| verb == "patch" && resource == "persistentvolumeclaims")
        .count();
    assert!(
        claim_writes >= 4,
        "the caches were reconciled meanwhile (claims applied {claim_writes} times): {requests:?}"
    );

    // Deleting a cache still removes what it made.
    clusters.delete(SHARED, &DeleteParams::default()).await?;
    eventually(
        "the deleted cluster cache and its claims are gone",
        WAIT,
        || async {
            let later: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), LATER);
            let gone = clusters.get_opt(SHARED).await?.is_none()
                && claims.get_opt(SHARED).await?.is_none()
                && later.get_opt(SHARED).await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    operator.abort();
    Ok(())
}
