//! gkm installed the way users install it: its images, built by
//! `hack/images.sh` and imported into a real node's containerd, and the chart
//! `deploy/helm/gkm`, installed, upgraded and uninstalled with `helm` on a
//! control plane whose controllers and scheduler turn the chart's Deployment
//! and DaemonSets into pods on a real kubelet.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gkm_k8s::crd::GKMCache;
use gkm_local::{cosign, fixture, push_signed_cache, repo_root};
use gkm_testenv::{
    Component, ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, Registry, Scheduler,
    find_binary, free_port, mounts_under, pod_log, wait_for_pod, workspace_binary,
};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, Discovery};
use serde_json::json;
use sha2::{Digest as _, Sha256};

const NS: &str = "gkm-system";
const NODE: &str = "real-helm";
const TIMEOUT: Duration = Duration::from_secs(240);
/// The fixture's kernel directory.
const KERNEL_DIR: &str = "5W7KJQDTJCL4UGPMKKCS7TEEPZKSWOY4774SZQ6674FWSXG5MNXQ";

/// Runs `helm` against `plane`; its stdout, or an error with its stderr.
fn helm(plane: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(find_binary(Component::Helm)?)
        .args(args)
        .arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes a Helm post-renderer (kustomize, through `kubectl kustomize`) into
/// `dir` and returns its path.
///
/// Everything it changes is forced by the machine the tests run on, not by
/// gkm or Kubernetes: this control plane has no kube-proxy and its apiserver
/// and registry listen on loopback only (plain HTTP), so the pods that call
/// them share the host's network, are pointed at the apiserver's loopback
/// address and allow an insecure registry; on the host network the
/// operator's and the agent's metrics need ports of their own (and a new
/// operator pod cannot start beside the old one); the machine
/// has no GPU, so the agent reads the simulated inventory in `gpus_dir`.
/// Users install the chart as it is.
fn sandbox_post_renderer(
    dir: &Path,
    apiserver_port: u16,
    gpus_dir: &Path,
) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir)?;
    let api_env = [
        r#"{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}"#.to_string(),
        format!(r#"{{"name": "KUBERNETES_SERVICE_PORT", "value": "{apiserver_port}"}}"#),
    ];
    let mut patches = String::new();
    for (kind, name, metrics_port) in [
        ("Deployment", "gkm-operator", Some(free_port()?)),
        ("DaemonSet", "gkm-agent", Some(free_port()?)),
        ("DaemonSet", "gkm-device-plugin", None),
    ] {
        let mut ops = vec![
            r#"{"op": "add", "path": "/spec/template/spec/hostNetwork", "value": true}"#
                .to_string(),
        ];
        for env in &api_env {
            ops.push(format!(
                r#"{{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {env}}}"#
            ));
        }
        if kind == "Deployment" {
            // On the host network a new operator pod cannot start beside the
            // old one (their ports collide): replace it instead.
            ops.push(
                r#"{"op": "add", "path": "/spec/strategy", "value": {"type": "Recreate"}}"#
                    .to_string(),
            );
        }
        if name != "gkm-device-plugin" {
            // The test registry speaks plain HTTP.
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "GKM_INSECURE_REGISTRY", "value": "true"}}"#
                    .to_string(),
            );
        }
        if name == "gkm-agent" {
            // The node has no GPU: the agent reads a simulated T4 instead.
            ops.push(format!(
                r#"{{"op": "add", "path": "/spec/template/spec/volumes/-", "value": {{"name": "gpus", "hostPath": {{"path": "{}", "type": "Directory"}}}}}}"#,
                gpus_dir.display()
            ));
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {"name": "gpus", "mountPath": "/simulated", "readOnly": true}}"#
                    .to_string(),
            );
            ops.push(
                r#"{"op": "add", "path": "/spec/template/spec/containers/0/env/-", "value": {"name": "GKM_SIMULATE", "value": "/simulated/gpus.yaml"}}"#
                    .to_string(),
            );
        }
        if let Some(port) = metrics_port {
            ops.push(format!(
                r#"{{"op": "replace", "path": "/spec/template/spec/containers/0/args/2", "value": "--metrics-addr=0.0.0.0:{port}"}}"#
            ));
            ops.push(format!(
                r#"{{"op": "replace", "path": "/spec/template/spec/containers/0/ports/0/containerPort", "value": {port}}}"#
            ));
        }
        patches.push_str(&format!(
            "  - target: {{kind: {kind}, name: {name}}}\n    patch: '[{}]'\n",
            ops.join(", ")
        ));
    }
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("resources: [rendered.yaml]\npatches:\n{patches}"),
    )?;
    let script = dir.join("post-render.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -eu\ncat > '{dir}/rendered.yaml'\nexec '{kubectl}' kustomize '{dir}'\n",
            dir = dir.display(),
            kubectl = find_binary(Component::Kubectl)?.display()
        ),
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(script.display().to_string())
}

/// Whether every container of `pod` is ready and the pod is Running.
fn ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c.ready))
}

/// The gkm pods, by their `app.kubernetes.io/name`.
async fn gkm_pods(pods: &Api<Pod>) -> anyhow::Result<BTreeMap<String, Pod>> {
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/part-of=gkm"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let name = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name").cloned())
                .unwrap_or_default();
            (name, p)
        })
        .collect())
}

/// Waits until exactly the `components` each have one pod, Running and
/// Ready, none of them in `old` (pod UIDs); returns them.
async fn wait_all_ready(
    pods: &Api<Pod>,
    components: &[&str],
    old: &BTreeSet<String>,
    node: &RealNode,
) -> anyhow::Result<BTreeMap<String, Pod>> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let current = gkm_pods(pods).await?;
        let names: Vec<&str> = current.keys().map(String::as_str).collect();
        let fresh = current
            .values()
            .all(|p| !old.contains(p.metadata.uid.as_deref().unwrap_or("")));
        if names == components && fresh && current.values().all(ready) {
            return Ok(current);
        }
        if Instant::now() > deadline {
            let states: Vec<String> = current
                .iter()
                .map(|(n, p)| format!("{n}: {:?}", p.status))
                .collect();
            anyhow::bail!(
                "gkm's pods never all became Ready:\n{}\nkubelet:\n{}",
                states.join("\n"),
                node.kubelet_log_tail(40)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Every object the chart could have made, that still exists: `kind/name`
/// of the objects labelled `app.kubernetes.io/part-of=gkm`, cluster-wide,
/// in every served resource but CRDs and events.
async fn leftovers(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut found = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(kube::discovery::verbs::LIST)
                || resource.kind == "CustomResourceDefinition"
                || resource.kind == "Event"
            {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let list = api
                .list(&ListParams::default().labels("app.kubernetes.io/part-of=gkm"))
                .await?;
            for item in list.items {
                found.push(format!(
                    "{}/{}",
                    resource.kind,
                    item.metadata.name.unwrap_or_default()
                ));
            }
        }
    }
    Ok(found)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_upgrades_and_uninstalls_on_a_real_node() -> anyhow::Result<()> {
    let plane = ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: true,
        workload_controllers: true,
        ..ControlPlaneOptions::default()
    })
    .await?;
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
    let work = gkm_testenv::temp_dir()?;

    // gkm's images, as hack/images.sh builds them for users (debug builds
    // here: the tests have built them already), imported into the node.
    let bin_dir = workspace_binary("gkm-operator")?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let components = ["gkm-agent", "gkm-csi", "gkm-device-plugin", "gkm-operator"];
    let out = Command::new(repo_root().join("hack/images.sh"))
        .args(["--profile", "dev", "--bin-dir"])
        .arg(&bin_dir)
        .arg("--out")
        .arg(work.path().join("images"))
        .arg("--import")
        .arg(node.containerd_socket())
        .args(components)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "hack/images.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let port: u16 = plane
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no port in {}", plane.url()))?;
    let gpus_dir = work.path().join("gpus");
    std::fs::create_dir_all(&gpus_dir)?;
    std::fs::write(gpus_dir.join("gpus.yaml"), "gpus:\n- profile: T4\n")?;
    let post_renderer = sandbox_post_renderer(&work.path().join("post-render"), port, &gpus_dir)?;

    // A signed cache in a registry, and the public key as the chart's
    // default signature policy.
    let registry = Registry::start()?;
    let key = cosign::generate_key_pair(&work.path().join("keys/release"))?;
    let (image, _digest) = push_signed_cache(
        &registry,
        &fixture("triton-vector-add-cuda-sm75"),
        "gkm/vector-add",
        "cuda",
        &key,
    )
    .await?;
    let policy = format!(
        "signature.defaultPolicy={}",
        json!({"signers": [{"key": {"publicKey": key.public_pem}}]})
    );
    let chart = repo_root().join("deploy/helm/gkm").display().to_string();
    // The node's own directories: its kubelet's root, where its kubelet
    // serves device plugins, and a store inside the kubelet's root, because
    // this machine's `/` is not a shared mount and the node's kubelet root
    // is (the CSI driver's HostToContainer propagation needs one).
    let kubelet_dir = format!("kubeletDir={}", node.kubelet_dir().display());
    let device_plugins = format!(
        "devicePlugin.devicePluginsDir={}",
        node.device_plugins_dir().display()
    );
    let store = node.kubelet_dir().join("gkm");
    let store_dir = format!("storeDir={}", store.display());
    let install_args = [
        "--namespace",
        NS,
        "--set",
        "image.pullPolicy=Never",
        "--set",
        &kubelet_dir,
        "--set",
        &device_plugins,
        "--set",
        &store_dir,
        "--set-json",
        &policy,
        "--post-renderer",
        &post_renderer,
        "--wait",
        "--timeout=4m",
    ];
    let mut args = vec!["install", "gkm", &chart, "--create-namespace"];
    args.extend(install_args);
    helm(&plane, &args)?;

    let client = plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let installed = wait_all_ready(&pods, &components, &BTreeSet::new(), &node).await?;
    // Each runs under the chart's ServiceAccount; only the CSI driver is
    // privileged.
    for (name, pod) in &installed {
        let spec = pod.spec.as_ref().expect("a pod has a spec");
        assert_eq!(spec.service_account_name.as_deref(), Some(name.as_str()));
        let privileged = spec.containers.iter().any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
        assert_eq!(
            privileged,
            name == "gkm-csi",
            "{name} privileged: {privileged}"
        );
    }
    let operator = &installed["gkm-operator"];
    let user = operator
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.run_as_user);
    assert_eq!(user, Some(65532), "the operator runs as a user, not root");

    // A cache with no policy of its own is verified against the chart's
    // default policy, extracted by the agent and read by a workload pod
    // through the CSI driver.
    plane.ensure_namespace("team").await?;
    let cache = json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": "team"},
        "spec": {"image": image},
    });
    Api::<GKMCache>::namespaced(client.clone(), "team")
        .patch(
            "vector-add",
            &PatchParams::apply("helm-real-node").force(),
            &Patch::Apply(&cache),
        )
        .await?;
    let workloads: Api<Pod> = Api::namespaced(client.clone(), "team");
    let reader = gkm_local::cache_pod(
        "team",
        "reader",
        NODE,
        "/cache",
        json!({"csi.gkm.io/GKMCache": "vector-add"}),
        "sha256sum \"$TRITON_CACHE_DIR\"/*/add_kernel.cubin; exec sleep 100000",
    )?;
    workloads.create(&PostParams::default(), &reader).await?;
    wait_for_pod(&workloads, "reader", TIMEOUT, |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    })
    .await?;
    let kernel = std::fs::read(
        fixture("triton-vector-add-cuda-sm75")
            .join(KERNEL_DIR)
            .join("add_kernel.cubin"),
    )?;
    let want = format!(
        "{}  /cache/{KERNEL_DIR}/add_kernel.cubin",
        hex::encode(Sha256::digest(&kernel))
    );
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let log = pod_log(&workloads, "reader", "triton").await?;
        if log.contains(&want) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the workload never read the cache's kernel ({want}); log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    workloads
        .delete("reader", &DeleteParams::default().grace_period(0))
        .await?;
    let deadline = Instant::now() + TIMEOUT;
    while workloads.get_opt("reader").await?.is_some() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the workload pod was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // The operator serves the pvc-mutation webhook; its configuration is
    // owned by the chart's ClusterRole, so uninstalling removes it (checked
    // with every other leftover below).
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = webhooks.get("gkm-pvc-mutation").await?;
    let owners = configuration.metadata.owner_references.unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "ClusterRole" && o.name == "gkm-operator"),
        "the webhook configuration is not owned by the chart's ClusterRole: {owners:?}"
    );

    // An upgrade to a changed value rolls every pod.
    let mut args = vec![
        "upgrade",
        "gkm",
        &chart,
        "--reuse-values",
        "--set",
        "logFormat=text",
    ];
    args.extend(install_args);
    helm(&plane, &args)?;
    let old: BTreeSet<String> = installed
        .values()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let upgraded = wait_all_ready(&pods, &components, &old, &node).await?;
    for (name, pod) in &upgraded {
        let args = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].args.clone())
            .unwrap_or_default();
        assert!(
            !args.contains(&"--log-json".to_string()),
            "{name} still logs JSON: {args:?}"
        );
    }

    // Uninstalled: no gkm object is left but the CRDs, no gkm mount on the
    // node; the node store is kept, as the chart's notes say.
    helm(&plane, &["uninstall", "gkm", "--namespace", NS, "--wait"])?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = leftovers(&client).await?;
        if left.is_empty() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "left after helm uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mounts: Vec<_> = mounts_under(&node.kubelet_dir())
        .into_iter()
        .filter(|m| m.to_string_lossy().contains("csi.gkm.io") || m.starts_with(&store))
        .collect();
    assert!(mounts.is_empty(), "gkm mounts left: {mounts:?}");
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&()),
    );
    crds.get("gkmcaches.gkm.io").await?;
    assert!(store.is_dir(), "the node store is kept");
    Ok(())
}
