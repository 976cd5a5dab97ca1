//! gkm installed the way users install it: its images, built by
//! `hack/images/build.sh` and imported into a real node's containerd, and the chart
//! `deploy/helm/gkm`, installed, upgraded and uninstalled with `helm` on a
//! control plane whose controllers and scheduler turn the chart's Deployment
//! and DaemonSets into pods on a real kubelet.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gkm_k8s_api::crd::{GKMCache, GKMCacheNode};
use gkm_local::chart::{self, COMPONENTS, SandboxChart};
use gkm_local::{cosign, fixture, push_signed_cache};
use gkm_testenv::{
    ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, Registry, Scheduler, eventually,
    field_managers, mounts_under, pod_log, settle, wait_for_pod,
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
    let states = RefCell::new(Vec::new());
    eventually("gkm's pods all Ready", TIMEOUT, || async {
        let current = gkm_pods(pods).await?;
        let names: Vec<&str> = current.keys().map(String::as_str).collect();
        let fresh = current
            .values()
            .all(|p| !old.contains(p.metadata.uid.as_deref().unwrap_or("")));
        if names == components && fresh && current.values().all(ready) {
            return Ok(Some(current));
        }
        *states.borrow_mut() = current
            .iter()
            .map(|(n, p)| format!("{n}: {:?}", p.status))
            .collect();
        Ok(None)
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}:\n{}\nkubelet:\n{}",
            states.borrow().join("\n"),
            node.kubelet_log_tail(40)
        )
    })
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

    // gkm's images, as hack/images/build.sh builds them for users (debug builds
    // here: the tests have built them already), imported into the node.
    chart::build_and_import_images(&work.path().join("images"), &[&node])?;

    // The node has no GPU: its agent reads a simulated T4.
    let gpus_dir = work.path().join("gpus");
    std::fs::create_dir_all(gpus_dir.join(NODE))?;
    std::fs::write(
        gpus_dir.join(NODE).join("gpus.yaml"),
        "gpus:\n- profile: T4\n",
    )?;
    let sandbox = SandboxChart::for_node(&plane, &node, work.path(), &gpus_dir)?;

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
    let chart = chart::chart_dir().display().to_string();
    let mut install_args = vec!["--set-json", &policy];
    install_args.extend(sandbox.args());
    let mut args = vec!["install", chart::RELEASE, &chart, "--create-namespace"];
    args.extend(&install_args);
    chart::helm(plane.kubeconfig(), &args)?;

    let client = plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let installed = wait_all_ready(&pods, &COMPONENTS, &BTreeSet::new(), &node).await?;
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
    let log = settle(
        TIMEOUT,
        || pod_log(&workloads, "reader", "triton"),
        |log| log.contains(&want),
    )
    .await?;
    anyhow::ensure!(
        log.contains(&want),
        "the workload never read the cache's kernel ({want}); log:\n{log}"
    );
    // The operator's and the agent's writes are recorded under their own
    // names (the binaries' User-Agent), none under `unknown`.
    let cache = Api::<GKMCache>::namespaced(client.clone(), "team")
        .get("vector-add")
        .await?;
    assert_eq!(
        field_managers(&cache),
        ["gkm-operator", "helm-real-node"],
        "{:?}",
        cache.metadata.managed_fields
    );
    // The agent writes its report after the pass that extracted the
    // cache, which the workload may have read already.
    let reports = Api::<GKMCacheNode>::namespaced(client.clone(), "team");
    let report = eventually("the agent's report of the node", TIMEOUT, || {
        let reports = reports.clone();
        async move { Ok(reports.get_opt(NODE).await?) }
    })
    .await?;
    assert_eq!(
        field_managers(&report),
        ["gkm-agent"],
        "{:?}",
        report.metadata.managed_fields
    );
    workloads
        .delete("reader", &DeleteParams::default().grace_period(0))
        .await?;
    eventually("the workload pod deleted", TIMEOUT, || async {
        Ok(workloads.get_opt("reader").await?.is_none().then_some(()))
    })
    .await?;

    // The operator serves the pvc-mutation webhook; its configuration is
    // the release's, so disabling the webhook or uninstalling removes it
    // (checked with every other leftover below), and it carries the CA the
    // operator's replicas share.
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = webhooks.get("gkm-pvc-mutation").await?;
    let release = configuration
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("meta.helm.sh/release-name"))
        .cloned();
    assert_eq!(
        release.as_deref(),
        Some(chart::RELEASE),
        "the webhook configuration is not the release's"
    );
    let bundle = configuration
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|w| w.client_config.ca_bundle);
    assert!(
        bundle.is_some(),
        "the webhook configuration has no caBundle"
    );

    // An upgrade to a changed value rolls every pod.
    let mut args = vec![
        "upgrade",
        chart::RELEASE,
        &chart,
        "--reuse-values",
        "--set",
        "logFormat=text",
    ];
    args.extend(&install_args);
    chart::helm(plane.kubeconfig(), &args)?;
    let old: BTreeSet<String> = installed
        .values()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let upgraded = wait_all_ready(&pods, &COMPONENTS, &old, &node).await?;
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
    chart::helm(
        plane.kubeconfig(),
        &["uninstall", chart::RELEASE, "--namespace", NS, "--wait"],
    )?;
    let left = settle(TIMEOUT, || leftovers(&client), |left| left.is_empty()).await?;
    anyhow::ensure!(left.is_empty(), "left after helm uninstall: {left:?}");
    let store = sandbox.store();
    let mounts: Vec<_> = mounts_under(&node.kubelet_dir())
        .into_iter()
        .filter(|m| m.to_string_lossy().contains("csi.gkm.io") || m.starts_with(store))
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
