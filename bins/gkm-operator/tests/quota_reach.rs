//! How far the GPU-quota webhook reaches, as the chart installs it: only
//! namespaces an administrator labelled `gkm.io/gpu-quota: enforced` wait
//! on gkm. With the operator not running at all (its webhook Service has
//! no endpoint), a real kube-scheduler binds a pod of any other namespace
//! and a real node runs it; a pod of an enforced namespace stays unbound,
//! so the configuration is in force. Real kube-apiserver, kube-scheduler,
//! kubelet and containerd.

use std::process::Command;
use std::time::Duration;

use gkm_k8s_operator::admission::quota::{ENFORCED_LABEL, QUOTA_CONFIGURATION_NAME};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, RealNode, RealNodeOptions, Scheduler, pod_events, wait_for_pod,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Deserialize as _;
use serde_json::{Value, json};

const NODE: &str = "quota-reach-node";

/// The chart's admission webhook configurations, rendered for `gkm-system`
/// with its defaults.
fn chart_webhook_configurations() -> anyhow::Result<Vec<Value>> {
    let helm = gkm_testenv::find_binary(gkm_testenv::Component::Helm)?;
    let out = Command::new(helm)
        .args(["template", "gkm"])
        .arg(gkm_testenv::repo_root().join("deploy/helm/gkm"))
        .args(["--namespace", "gkm-system"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&String::from_utf8(out.stdout)?) {
        let value = Value::deserialize(doc)?;
        if value["kind"]
            .as_str()
            .is_some_and(|k| k.ends_with("WebhookConfiguration"))
        {
            found.push(value);
        }
    }
    Ok(found)
}

/// A busybox pod that prints and sleeps, placed by the scheduler (no node
/// lifecycle controller runs here to lift a new node's `not-ready` taint,
/// so the pod tolerates it).
fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo started; exec sleep 100000"],
            }],
        },
    }))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_in_a_namespace_without_quota_is_bound_while_the_operator_is_down()
-> anyhow::Result<()> {
    let plane = ControlPlane::start().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let admin = plane.client().await?;
    let configurations = chart_webhook_configurations()?;
    anyhow::ensure!(
        configurations
            .iter()
            .any(|c| c["metadata"]["name"] == QUOTA_CONFIGURATION_NAME),
        "the chart renders no {QUOTA_CONFIGURATION_NAME}"
    );
    // As the chart installs them, with no operator behind their Service.
    for configuration in &configurations {
        plane.apply_object(configuration, false).await?;
    }
    let apply = PatchParams::apply("gkm-test").force();
    for (name, labels) in [
        ("team-free", json!({})),
        ("team-capped", json!({ENFORCED_LABEL.0: ENFORCED_LABEL.1})),
    ] {
        plane.ensure_pod_namespace(name).await?;
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
        Api::<Namespace>::all(admin.clone())
            .patch(name, &apply, &Patch::Apply(&ns))
            .await?;
    }
    let quota: gkm_k8s_api::crd::GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": "a100", "namespace": "team-capped"},
        "spec": {"limits": [{"model": "NVIDIA-A100", "gpus": 2}]},
    }))?;
    Api::<gkm_k8s_api::crd::GKMGPUQuota>::namespaced(admin.clone(), "team-capped")
        .create(&PostParams::default(), &quota)
        .await?;
    // The apiserver's view of webhook configurations follows a watch.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let _scheduler = Scheduler::start(
        &plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;
    let node = RealNode::start(
        &plane,
        RealNodeOptions {
            name: NODE.into(),
            ..RealNodeOptions::default()
        },
    )
    .await?;

    for namespace in ["team-free", "team-capped"] {
        Api::<Pod>::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &pod("work")?)
            .await?;
    }
    let free = Api::<Pod>::namespaced(admin.clone(), "team-free");
    let running = wait_for_pod(&free, "work", Duration::from_secs(120), |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nkubelet:\n{}", node.kubelet_log_tail(20)))?;
    assert_eq!(
        running.spec.and_then(|s| s.node_name).as_deref(),
        Some(NODE),
        "the pod of a namespace without quota runs on the real node"
    );

    // The enforced namespace does wait on the (absent) webhook: its bind is
    // refused by the apiserver, and the pod stays unbound.
    let capped = Api::<Pod>::namespaced(admin.clone(), "team-capped");
    let refused = gkm_testenv::eventually(
        "the scheduler's bind in the enforced namespace refused by the quota webhook",
        Duration::from_secs(60),
        || {
            let admin = admin.clone();
            async move {
                let events = pod_events(&admin, "team-capped", "work").await?;
                Ok(events
                    .into_iter()
                    .find(|e| e.contains("gpu-quota-binding.gkm.io")))
            }
        },
    )
    .await?;
    assert!(refused.contains("failed calling webhook"), "{refused}");
    let pod = capped.get("work").await?;
    assert_eq!(
        pod.spec.and_then(|s| s.node_name),
        None,
        "a pod of an enforced namespace was bound with the operator down"
    );
    Ok(())
}
