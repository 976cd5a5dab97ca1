//! `GKMGPUQuota` at admission: `gkm-operator`, running as its
//! ServiceAccount with the shipped RBAC against a real kube-apiserver,
//! answers the chart's `gkm-gpu-quota` ValidatingWebhookConfiguration, so a
//! pod that never meets gkm's scheduler extender (created with
//! `spec.nodeName`, or bound by another scheduler) cannot take its
//! namespace past its quota of a GPU model.

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gkm_k8s_operator::admission::Endpoint;
use gkm_k8s_operator::admission::quota::{
    ENFORCED_LABEL, QUOTA_BINDING_WEBHOOK_NAME, QUOTA_CONFIGURATION_NAME, QUOTA_WEBHOOK_NAME,
    quota_configuration,
};
use gkm_testenv::{ControlPlane, Process, free_port};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde_json::{Value, json};

use support::SYSTEM;
/// The GPU model of the nodes `a100-*`, as gkm's agent labels it.
const A100: &str = "NVIDIA-A100-SXM4-80GB";
/// The label the model is read from.
const MODEL_LABEL: &str = "gkm.io/gpu.product";

/// One test at a time: the webhook configuration is cluster-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn deploy_dir() -> PathBuf {
    gkm_testenv::repo_root().join("deploy")
}

/// A running operator serving the webhooks, and the admin's client.
struct Ground {
    admin: kube::Client,
    operator: Process,
    _dir: tempfile::TempDir,
}

/// The operator as deployed (its ServiceAccount, the shipped RBAC), serving
/// the webhooks at a loopback URL the quota configuration points at; Nodes
/// `a100-1`, `a100-2` (model [`A100`]) and `h100-1` (another model).
async fn ground() -> anyhow::Result<Ground> {
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
    for (name, model) in [
        ("a100-1", A100),
        ("a100-2", A100),
        ("h100-1", "NVIDIA-H100-80GB-HBM3"),
    ] {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {MODEL_LABEL: model}},
        }))?;
        Api::<Node>::all(admin.clone())
            .patch(name, &apply, &Patch::Apply(&node))
            .await?;
    }

    let dir = gkm_testenv::temp_dir()?;
    let listen = format!("127.0.0.1:{}", free_port()?);
    let operator = support::start_operator(plane, &admin, "quota", &listen, &[], dir.path())
        .await?
        .process;
    Ok(Ground {
        admin,
        operator,
        _dir: dir,
    })
}

/// A namespace (with its `default` ServiceAccount, as the controller
/// manager would make it) and, with `gpus`, a quota `a100-gpus` of that
/// many GPUs of [`A100`], enforced at admission (the administrator's label).
async fn namespace(admin: &kube::Client, name: &str, gpus: Option<i64>) -> anyhow::Result<()> {
    let apply = PatchParams::apply("gkm-test").force();
    let labels = match gpus {
        Some(_) => json!({ENFORCED_LABEL.0: ENFORCED_LABEL.1}),
        None => json!({}),
    };
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(name, &apply, &Patch::Apply(&ns))
        .await?;
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default", "namespace": name}}))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), name)
        .patch("default", &apply, &Patch::Apply(&account))
        .await?;
    if let Some(gpus) = gpus {
        let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
            "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
            "metadata": {"name": "a100-gpus", "namespace": name},
            "spec": {"limits": [{"model": A100, "gpus": gpus}]},
        }))?;
        Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(admin.clone(), name)
            .patch("a100-gpus", &apply, &Patch::Apply(&quota))
            .await?;
    }
    Ok(())
}

/// A pod asking for one `nvidia.com/gpu`, naming `node` when given.
fn gpu_pod(name: &str, node: Option<&str>) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/infer:v1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }))?)
}

/// Creates `pod` in `namespace`: the apiserver's refusal message, if any.
async fn create(
    admin: &kube::Client,
    namespace: &str,
    pod: &Pod,
) -> anyhow::Result<Option<String>> {
    match Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), pod)
        .await
    {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) => Ok(Some(e.message)),
        Err(e) => Err(e.into()),
    }
}

/// Binds the pod `name` to `node` through a Binding, as any scheduler
/// does: the apiserver's refusal message, if any.
async fn bind(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
) -> anyhow::Result<Option<String>> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    match Api::<Pod>::namespaced(admin.clone(), namespace)
        .create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
        .await
    {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(e)) => Ok(Some(e.message)),
        Err(e) => Err(e.into()),
    }
}

/// The refusal a pod of `namespace` asking one more GPU gets at 2 of 2.
fn over_quota(namespace: &str) -> String {
    format!(
        "gkm: quota {namespace}/a100-gpus reached: namespace {namespace} holds 2 of 2 GPUs of model {A100}, the pod asks 1"
    )
}

#[tokio::test]
async fn a_pod_naming_its_node_cannot_exceed_its_namespaces_gpu_model_quota() -> anyhow::Result<()>
{
    let _serial = SERIAL.lock().await;
    let mut ground = ground().await?;
    let admin = ground.admin.clone();
    namespace(&admin, "quota-team", Some(2)).await?;
    namespace(&admin, "quota-free", None).await?;

    // Two GPUs of the model: within the quota, on either node of it.
    for (name, node) in [("infer-1", "a100-1"), ("infer-2", "a100-2")] {
        let refused = create(&admin, "quota-team", &gpu_pod(name, Some(node))?).await?;
        assert_eq!(refused, None, "{name} on {node} was refused");
    }
    // The third is refused, naming the quota, the model, the limit and the use.
    let refused = create(&admin, "quota-team", &gpu_pod("infer-3", Some("a100-1"))?).await?;
    let message = refused.ok_or_else(|| {
        anyhow::anyhow!(
            "a third A100 GPU pod naming its node was admitted over a quota of 2; log:\n{}",
            ground.operator.log_tail(20)
        )
    })?;
    assert!(
        message.contains(&over_quota("quota-team")),
        "the refusal does not say why: {message}"
    );
    // Another model is not capped by it; another namespace has no quota.
    assert_eq!(
        create(&admin, "quota-team", &gpu_pod("train-1", Some("h100-1"))?).await?,
        None
    );
    for i in 0..3 {
        let pod = gpu_pod(&format!("free-{i}"), Some("a100-1"))?;
        assert_eq!(create(&admin, "quota-free", &pod).await?, None);
    }
    // A node whose model is not known yet (not joined, or not labelled by
    // the agent) counts against no quota: a GPU pod naming it is refused,
    // saying which label is missing, rather than let past every quota.
    let bare: Node = serde_json::from_value(json!({"metadata": {"name": "new-gpu-node"}}))?;
    Api::<Node>::all(admin.clone())
        .patch(
            "new-gpu-node",
            &PatchParams::apply("gkm-test").force(),
            &Patch::Apply(&bare),
        )
        .await?;
    for (name, node, why) in [
        ("early-1", "new-gpu-node", "the node has no GPU-model label"),
        ("early-2", "not-joined-yet", "no such node"),
    ] {
        let refused = create(&admin, "quota-team", &gpu_pod(name, Some(node))?).await?;
        let message = refused.ok_or_else(|| {
            anyhow::anyhow!("a GPU pod on {node}, whose model is unknown, passed the quota")
        })?;
        assert!(
            message.contains(why) && message.contains("gkm.io/gpu.product"),
            "the refusal does not say what is unknown: {message}"
        );
    }
    ground.operator.check_running()?;
    Ok(())
}

#[tokio::test]
async fn binding_a_pod_beyond_its_namespaces_gpu_model_quota_is_refused() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut ground = ground().await?;
    let admin = ground.admin.clone();
    namespace(&admin, "quota-bind", Some(2)).await?;
    for name in ["bound-1", "bound-2", "bound-3", "bound-4"] {
        assert_eq!(
            create(&admin, "quota-bind", &gpu_pod(name, None)?).await?,
            None
        );
    }
    for (name, node) in [("bound-1", "a100-1"), ("bound-2", "a100-2")] {
        let refused = bind(&admin, "quota-bind", name, node).await?;
        assert_eq!(refused, None, "binding {name} to {node} was refused");
    }
    let refused = bind(&admin, "quota-bind", "bound-3", "a100-1").await?;
    let message = refused.ok_or_else(|| {
        anyhow::anyhow!(
            "a bind to a third A100 GPU was admitted over a quota of 2; log:\n{}",
            ground.operator.log_tail(20)
        )
    })?;
    assert!(
        message.contains(&over_quota("quota-bind")),
        "the refusal does not say why: {message}"
    );
    let pod = Api::<Pod>::namespaced(admin.clone(), "quota-bind")
        .get("bound-3")
        .await?;
    assert_eq!(
        pod.spec.and_then(|s| s.node_name),
        None,
        "bound-3 was bound"
    );
    // A node of another model is not capped by the quota.
    assert_eq!(bind(&admin, "quota-bind", "bound-4", "h100-1").await?, None);
    ground.operator.check_running()?;
    Ok(())
}

/// The `EnforcedAtAdmission` condition of quota `name` in `namespace`
/// once it is `status`: its message.
async fn enforced_condition(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    status: &str,
) -> anyhow::Result<String> {
    let quotas = Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(admin.clone(), namespace);
    gkm_testenv::eventually(
        &format!("quota {namespace}/{name} EnforcedAtAdmission={status}"),
        Duration::from_secs(30),
        || {
            let quotas = &quotas;
            async move {
                let quota = quotas.get(name).await?;
                Ok(quota
                    .status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .find(|c| c.type_ == "EnforcedAtAdmission" && c.status == status)
                    .map(|c| c.message))
            }
        },
    )
    .await
}

#[tokio::test]
async fn a_quota_in_a_namespace_without_the_label_says_it_is_not_enforced_and_how_to_enforce_it()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let ground = ground().await?;
    let admin = ground.admin.clone();
    namespace(&admin, "quota-unlabelled", None).await?;
    let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100-gpus", "namespace": "quota-unlabelled"},
        "spec": {"limits": [{"model": A100, "gpus": 1}]},
    }))?;
    Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(admin.clone(), "quota-unlabelled")
        .create(&PostParams::default(), &quota)
        .await?;
    let message = enforced_condition(&admin, "quota-unlabelled", "a100-gpus", "False").await?;
    assert!(
        message.contains("kubectl label namespace quota-unlabelled gkm.io/gpu-quota=enforced"),
        "the condition does not say how to enforce the quota: {message}"
    );
    // Unlabelled, a pod naming its node goes past the quota unjudged...
    for name in ["free-1", "free-2"] {
        let pod = gpu_pod(name, Some("a100-1"))?;
        assert_eq!(create(&admin, "quota-unlabelled", &pod).await?, None);
    }
    // ...and once the administrator labels the namespace, the quota says so.
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(json!({
        "metadata": {"name": "quota-unlabelled",
                     "labels": {ENFORCED_LABEL.0: ENFORCED_LABEL.1}}}))?;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(
            "quota-unlabelled",
            &PatchParams::apply("gkm-test").force(),
            &Patch::Apply(&ns),
        )
        .await?;
    enforced_condition(&admin, "quota-unlabelled", "a100-gpus", "True").await?;
    Ok(())
}

/// The chart's configuration is the one the operator's crate describes
/// (CEL expressions compared word by word: YAML folds them over lines).
#[test]
fn the_chart_renders_the_quota_webhook_the_operator_answers() -> anyhow::Result<()> {
    let helm = gkm_testenv::find_binary(gkm_testenv::Component::Helm)?;
    let out = Command::new(helm)
        .args(["template", "gkm"])
        .arg(deploy_dir().join("helm/gkm"))
        .args(["--namespace", SYSTEM])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut rendered = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc)?;
        if value["kind"] == "ValidatingWebhookConfiguration"
            && value["metadata"]["name"] == QUOTA_CONFIGURATION_NAME
        {
            rendered = Some(value);
        }
    }
    let rendered = rendered
        .ok_or_else(|| anyhow::anyhow!("the chart renders no {QUOTA_CONFIGURATION_NAME}"))?;
    let service = Endpoint::Service {
        namespace: SYSTEM.into(),
        name: "gkm-operator-webhook".into(),
        port: 443,
    };
    let words = |v: &Value| -> Value {
        let mut v = v.clone();
        for c in v["matchConditions"].as_array_mut().into_iter().flatten() {
            let expression = c["expression"].as_str().unwrap_or_default();
            c["expression"] = json!(expression.split_whitespace().collect::<Vec<_>>().join(" "));
        }
        v
    };
    let ours = quota_configuration(&service, SYSTEM, None);
    for i in 0..2 {
        assert_eq!(
            words(&rendered["webhooks"][i]),
            words(&ours["webhooks"][i]),
            "the chart's quota webhook {i} differs from the operator's"
        );
    }
    assert_eq!(rendered["webhooks"][0]["name"], QUOTA_WEBHOOK_NAME);
    assert_eq!(rendered["webhooks"][1]["name"], QUOTA_BINDING_WEBHOOK_NAME);
    assert_eq!(rendered["webhooks"].as_array().map(Vec::len), Some(2));
    let names: HashSet<&str> = ours["webhooks"][0]["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names.len(), 3);
    Ok(())
}
