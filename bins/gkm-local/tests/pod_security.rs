//! The chart's default rendering against Pod Security `restricted`, as a
//! real apiserver's PodSecurity admission judges it: every workload passes
//! except the node daemons that need the host, and those fail only for the
//! reasons this file names.

use std::collections::BTreeMap;
use std::process::Command;

use gkm_local::repo_root;
use gkm_testenv::{Component, ControlPlane, find_binary};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use serde::Deserialize;
use serde_json::json;

/// The node daemons allowed to fail `restricted`, with why each needs the
/// host, and a word each of their refusals must name.
///
/// - `gkm-agent`: extracts kernel caches into the node's store and reads the
///   kubelet's pod-resources socket, both `hostPath` volumes; it runs as root
///   to write the store that every pod's CSI mount reads.
/// - `gkm-csi`: a CSI node plugin; it bind-mounts cache trees into pods'
///   volume directories under the kubelet's directory, which needs
///   `privileged` (mount propagation `Bidirectional`) and `hostPath`.
/// - `gkm-device-plugin`: registers with the kubelet through the
///   device-plugins socket directory (`hostPath`) and reads the GPUs.
const NODE_DAEMONS: &[(&str, &str)] = &[
    ("gkm-agent", "hostPath"),
    ("gkm-csi", "privileged"),
    ("gkm-device-plugin", "hostPath"),
];

/// The chart rendered with default values (release `gkm` in `gkm-system`)
/// plus `extra` `helm` arguments, as YAML documents.
fn render(extra: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let chart = repo_root().join("deploy/helm/gkm");
    let mut args = vec![
        "template".to_string(),
        "gkm".into(),
        chart.display().to_string(),
        "--namespace".into(),
        "gkm-system".into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let out = Command::new(find_binary(Component::Helm)?)
        .args(&args)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(serde_json::to_value(value)?);
        }
    }
    Ok(docs)
}

/// `kind/name` → the Pod its pod template makes, for every workload kind
/// that has one (`Deployment`, `DaemonSet`, `StatefulSet`, `Job`,
/// `CronJob`), placed in `namespace`.
fn pods_of(docs: &[serde_json::Value], namespace: &str) -> BTreeMap<String, Pod> {
    let mut pods = BTreeMap::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let template = match kind {
            "Deployment" | "DaemonSet" | "StatefulSet" | "Job" => &doc["spec"]["template"],
            "CronJob" => &doc["spec"]["jobTemplate"]["spec"]["template"],
            _ => continue,
        };
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let mut metadata = template["metadata"].clone();
        metadata["name"] = json!(name);
        metadata["namespace"] = json!(namespace);
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]});
        let pod: Pod = serde_json::from_value(pod)
            .unwrap_or_else(|e| panic!("{kind}/{name}: its pod template is not a Pod: {e}"));
        pods.insert(format!("{kind}/{name}"), pod);
    }
    pods
}

#[tokio::test]
async fn the_charts_defaults_pass_pod_security_restricted() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    let client = plane.client().await?;
    let namespace = "gkm-restricted";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": namespace, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}
    }))?;
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }

    // The defaults, and the defaults with the scheduler extender switched on
    // (its only switch), so its Deployment is judged too.
    let mut pods = pods_of(&render(&[])?, namespace);
    pods.extend(pods_of(
        &render(&["--set", "schedulerExtender.enabled=true"])?,
        namespace,
    ));
    for expected in [
        "Deployment/gkm-operator",
        "Deployment/gkm-scheduler-extender",
        "DaemonSet/gkm-agent",
        "DaemonSet/gkm-csi",
        "DaemonSet/gkm-device-plugin",
    ] {
        assert!(
            pods.contains_key(expected),
            "the chart no longer renders {expected}: {:?}",
            pods.keys()
        );
    }

    // The pods run as the chart's ServiceAccounts, which admission looks up.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    for pod in pods.values() {
        let Some(account) = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
        else {
            continue;
        };
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": account}}))?;
        match accounts.create(&PostParams::default(), &sa).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }

    let api: Api<Pod> = Api::namespaced(client, namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut wrong = Vec::new();
    for (what, pod) in &pods {
        let name = what.split_once('/').map(|(_, n)| n).unwrap_or(what);
        let daemon = NODE_DAEMONS.iter().find(|(n, _)| *n == name);
        match (api.create(&dry_run, pod).await, daemon) {
            (Ok(_), None) => {}
            (Ok(_), Some(_)) => wrong.push(format!(
                "{what} now passes restricted: take it off NODE_DAEMONS"
            )),
            (Err(kube::Error::Api(e)), Some((_, reason)))
                if e.code == 403
                    && e.message.contains("violates PodSecurity \"restricted")
                    && e.message.contains(reason) => {}
            (Err(e), Some((_, reason))) => wrong.push(format!(
                "{what} is a node daemon refused for {reason}, but: {e}"
            )),
            (Err(e), None) => wrong.push(format!("{what} fails Pod Security restricted: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    Ok(())
}
