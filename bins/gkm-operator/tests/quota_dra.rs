//! `GKMGPUQuota` and GPUs allocated through DRA: `gkm-operator`, running
//! as its ServiceAccount with the shipped RBAC against a real
//! kube-apiserver, answers the chart's `gkm-gpu-quota` webhooks counting
//! the `gpu.gkm.io` devices a namespace's ResourceClaims were allocated,
//! each once, whatever DeviceClass asked for it.

mod support;

use std::path::PathBuf;

use gkm_k8s_operator::admission::quota::ENFORCED_LABEL;
use gkm_testenv::{ControlPlane, Process, free_port};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The GPU model of the nodes `dra-a100-*`, as gkm's agent labels it.
const A100: &str = "NVIDIA-A100-SXM4-80GB";
const MODEL_LABEL: &str = "gkm.io/gpu.product";
const TEAM: &str = "quota-dra";

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

/// The operator as deployed (its ServiceAccount, the shipped RBAC), serving
/// the webhooks at a loopback URL the quota configuration points at; nodes
/// `dra-a100-1` and `dra-a100-2` of [`A100`]; namespace [`TEAM`] with a
/// quota of two A100s, enforced at admission.
async fn ground() -> anyhow::Result<(kube::Client, Process, tempfile::TempDir)> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane
        .apply_file(&deploy_dir().join("namespace.yaml"))
        .await?;
    plane
        .apply_file(&deploy_dir().join("rbac/operator.yaml"))
        .await?;
    let admin = plane.client().await?;
    let apply = PatchParams::apply("gkm-test").force();
    for name in ["dra-a100-1", "dra-a100-2"] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {MODEL_LABEL: A100}},
        }))?;
        Api::<Node>::all(admin.clone())
            .patch(name, &apply, &Patch::Apply(&node))
            .await?;
    }
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
        "metadata": {"name": TEAM, "labels": {ENFORCED_LABEL.0: ENFORCED_LABEL.1}}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(TEAM, &apply, &Patch::Apply(&ns))
        .await?;
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "default", "namespace": TEAM}});
    plane.apply_object(&account, false).await?;
    let quota = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100-gpus", "namespace": TEAM},
        "spec": {"limits": [{"model": A100, "gpus": 2}]},
    });
    plane.apply_object(&quota, false).await?;

    let dir = gkm_testenv::temp_dir()?;
    let listen = format!("127.0.0.1:{}", free_port()?);
    let operator = support::start_operator(plane, &admin, "quota-dra", &listen, &[], dir.path())
        .await?
        .process;
    Ok((admin, operator, dir))
}

/// Claim `name` of [`TEAM`] through `class`, allocated `device` of the
/// pool of `node` (as kube-scheduler writes an allocation).
async fn allocated_claim(
    admin: &kube::Client,
    name: &str,
    class: &str,
    node: &str,
    device: &str,
) -> anyhow::Result<()> {
    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), TEAM);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class}}]}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let status = json!({"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.gkm.io", "pool": node, "device": device}]}}}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// An unbound pod of [`TEAM`] using claim `claim` and asking no GPU
/// resource.
async fn claim_pod(admin: &kube::Client, name: &str, claim: &str) -> anyhow::Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "main", "image": "registry.invalid/train:v1",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }))?;
    Api::<Pod>::namespaced(admin.clone(), TEAM)
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Binds pod `name` to `node` as any scheduler does: the refusal, if any.
async fn bind(admin: &kube::Client, name: &str, node: &str) -> anyhow::Result<Option<String>> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": TEAM},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    match Api::<Pod>::namespaced(admin.clone(), TEAM)
        .create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
        .await
    {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) => Ok(Some(e.message)),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn gpus_allocated_through_any_device_class_count_once_against_the_quota_at_bind()
-> anyhow::Result<()> {
    let (admin, mut operator, _dir) = ground().await?;

    // One A100 held through gkm-gpu and, shared, through a cache class:
    // one GPU. A pod whose claim got a second one fits a quota of two.
    allocated_claim(&admin, "held-gpu", "gkm-gpu", "dra-a100-2", "gpu-0").await?;
    allocated_claim(
        &admin,
        "held-cache",
        &format!("gkm-cache.{TEAM}.llama"),
        "dra-a100-2",
        "gpu-0",
    )
    .await?;
    allocated_claim(&admin, "first", "gkm-model-a100", "dra-a100-1", "gpu-1").await?;
    claim_pod(&admin, "first", "first").await?;
    let refused = bind(&admin, "first", "dra-a100-1").await?;
    assert_eq!(
        refused,
        None,
        "a second A100 under a quota of two was refused; log:\n{}",
        operator.log_tail(20)
    );

    // A third, through yet another class and asking no GPU resource at all:
    // refused, naming the quota.
    allocated_claim(
        &admin,
        "third",
        &format!("gkm-cache.{TEAM}.other"),
        "dra-a100-1",
        "gpu-2",
    )
    .await?;
    claim_pod(&admin, "third", "third").await?;
    let refused = bind(&admin, "third", "dra-a100-1").await?;
    let message = refused.ok_or_else(|| {
        anyhow::anyhow!(
            "a third A100 allocated through a cache class was bound over a quota of two; log:\n{}",
            operator.log_tail(20)
        )
    })?;
    assert!(
        message.contains(&format!(
            "gkm: quota {TEAM}/a100-gpus reached: namespace {TEAM} holds 2 of 2 GPUs of model {A100}, the pod asks 1"
        )),
        "the refusal does not say why: {message}"
    );
    operator.check_running()?;
    Ok(())
}
