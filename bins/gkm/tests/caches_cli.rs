//! `gkm caches` against a real apiserver (etcd and kube-apiserver,
//! `gkm_testenv`): a GKMCache whose status (as the operator writes it)
//! counts a workload that compiled, and a ClusterGKMCache with no status
//! yet, listed as a user reads them.

// A test panics with what went wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gkm_k8s_api::crd::{CacheState, CacheStatus, ClusterGKMCache, GKMCache, WorkloadUsage};
use gkm_testenv::ControlPlane;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

mod support;

use support::gkm_ok;

const NS: &str = "caches-cli";

#[tokio::test(flavor = "multi_thread")]
async fn gkm_caches_lists_each_cache_with_its_workloads_hits() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane.ensure_namespace(NS).await?;
    let client = plane.client().await?;
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "kernels", "namespace": NS},
        "spec": {"image": "registry.example/kernels:v1"},
    }))?;
    caches.create(&PostParams::default(), &cache).await?;
    let mut status = CacheStatus {
        state: Some(CacheState::Running),
        resolved_digest: Some(format!("sha256:{}", "cd".repeat(32))),
        ..CacheStatus::default()
    };
    status.counts.node_cnt = 2;
    status.counts.node_in_use_cnt = 1;
    status.counts.node_not_in_use_cnt = 1;
    status.counts.pod_running_cnt = 1;
    status.workloads = Some(vec![WorkloadUsage {
        pods_ended: 2,
        pods_compiling: 1,
        new_entries: 2,
        entries_delivered: Some(4),
        new_entry_names: vec!["add_kernel".into(), "scaled_add_kernel".into()],
        ..WorkloadUsage::of(NS, "Job/warmup", "triton", Time(jiff::Timestamp::now()))
    }]);
    caches
        .patch_status(
            "kernels",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    let cluster: ClusterGKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "ClusterGKMCache",
        "metadata": {"name": "caches-cli-shared"},
        "spec": {"image": "registry.example/shared:v1"},
    }))?;
    Api::<ClusterGKMCache>::all(client.clone())
        .patch(
            "caches-cli-shared",
            &PatchParams::apply("caches-cli").force(),
            &Patch::Apply(&cluster),
        )
        .await?;

    let dir = tempfile::tempdir()?;
    let kubeconfig = plane.kubeconfig().display().to_string();
    let listed = gkm_ok(&["caches", "--kubeconfig", &kubeconfig], dir.path());
    eprintln!("gkm caches:\n{listed}");
    let rows: Vec<Vec<&str>> = listed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAMESPACE",
            "CACHE",
            "STATE",
            "DIGEST",
            "NODES",
            "PODS",
            "WORKLOAD",
            "HITS",
            "NEW",
            "DELIVERED"
        ]
    );
    assert!(
        rows.contains(&vec![
            NS,
            "kernels",
            "Running",
            "cdcdcdcdcdcd",
            "2/2",
            "1",
            "caches-cli/Job/warmup",
            "50%",
            "2",
            "4",
        ]),
        "{listed}"
    );
    assert!(
        rows.iter()
            .any(|r| r[..3] == ["-", "caches-cli-shared", "Pending"]),
        "{listed}"
    );

    // One namespace: its GKMCaches only.
    let one = gkm_ok(
        &["caches", "--kubeconfig", &kubeconfig, "-n", NS, "--json"],
        dir.path(),
    );
    let doc: serde_json::Value = serde_json::from_str(&one)?;
    let names: Vec<&str> = doc
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cache"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kernels"]);
    assert_eq!(doc[0]["hitRatio"], 0.5);
    assert_eq!(doc[0]["newEntries"], 2);

    // A tenant allowed to list its namespace's caches only: `-n` serves
    // it, the cluster-wide list is refused by the apiserver, saying so.
    plane
        .apply_object(
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "cache-reader", "namespace": NS},
                "rules": [{"apiGroups": ["gkm.io"], "resources": ["gkmcaches"], "verbs": ["list"]}],
            }),
            false,
        )
        .await?;
    plane
        .apply_object(
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "cache-reader", "namespace": NS},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cache-reader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "caches-cli-tenant"}],
            }),
            false,
        )
        .await?;
    let tenant = plane
        .kubeconfig_for("caches-cli-tenant", &[])?
        .display()
        .to_string();
    let mine = gkm_ok(
        &["caches", "--kubeconfig", &tenant, "-n", NS, "--json"],
        dir.path(),
    );
    let doc: serde_json::Value = serde_json::from_str(&mine)?;
    assert_eq!(doc[0]["cache"], "kernels", "{mine}");
    let everywhere = support::gkm_in(&["caches", "--kubeconfig", &tenant], dir.path());
    let said = support::text(&everywhere);
    eprintln!("gkm caches (tenant, every namespace):\n{said}");
    assert!(!everywhere.status.success(), "{said}");
    assert!(said.contains("forbidden"), "{said}");
    assert!(said.contains("gkm caches -n NAMESPACE"), "{said}");
    Ok(())
}
