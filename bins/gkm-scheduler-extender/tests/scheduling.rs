//! The extender behind a real kube-scheduler and kube-apiserver, with kwok
//! nodes carrying GPU capacity and model labels: what a user sees on pods.

mod support;

use gkm_k8s_api::crd::GKMGPUQuota;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::{Cluster, Outcome, asking, outcome, wait_for};

/// A quota on `model` for `ns`.
async fn quota(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    model: &str,
    gpus: i64,
) -> anyhow::Result<()> {
    let quota: GKMGPUQuota = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMGPUQuota",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"limits": [{"model": model, "gpus": gpus}]},
    }))?;
    Api::<GKMGPUQuota>::namespaced(cluster.client.clone(), ns)
        .create(&PostParams::default(), &quota)
        .await?;
    Ok(())
}

/// A node report for `node` in `ns` on the cache `vector-add`.
async fn report(
    cluster: &Cluster,
    ns: &str,
    node: &str,
    fits: bool,
    extracted: bool,
) -> anyhow::Result<()> {
    let api: Api<gkm_k8s_api::crd::GKMCacheNode> = Api::namespaced(cluster.client.clone(), ns);
    let object: gkm_k8s_api::crd::GKMCacheNode = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCacheNode",
        "metadata": {"name": node, "namespace": ns}, "spec": {},
    }))?;
    api.create(&PostParams::default(), &object).await?;
    let entry = if fits {
        json!({"state": if extracted { "Extracted" } else { "Downloading" }, "compatibleGPUs": [0], "incompatibleGPUs": []})
    } else {
        json!({"state": "Error", "compatibleGPUs": [], "incompatibleGPUs": [0],
               "incompatibleReasons": [{"id": 0, "reasons": ["backend cuda does not match hip"]}]})
    };
    let status = json!({"status": {"nodeName": node, "counts": {"nodeCnt": 1, "nodeInUseCnt": 0, "nodeNotInUseCnt": 0,
        "nodeErrorCnt": 0, "podRunningCnt": 0, "podDeletingCnt": 0, "podOutdatedCnt": 0},
        "caches": {"vector-add": {"sha256:0123": entry}}}});
    api.patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

fn on_model(model: &str, containers: Value) -> Value {
    json!({"nodeSelector": {"gkm.io/gpu.product": model}, "containers": containers})
}

fn with_cache(mut spec: Value) -> Value {
    spec["volumes"] = json!([{"name": "kernels", "csi": {"driver": "csi.gkm.io",
        "volumeAttributes": {"csi.gkm.io/GKMCache": "vector-add"}}}]);
    spec
}

/// What a row expects.
enum Expect {
    On(&'static str),
    PendingWith(&'static str),
}

#[tokio::test]
async fn scenario_table() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    for ns in ["ml", "team", "fill"] {
        cluster.namespace(ns).await?;
    }
    let gpus = |n: &'static str| [("nvidia.com/gpu", n)];
    cluster
        .gpu_node("t4-packed", "Tesla-T4", &gpus("4"), &[])
        .await?;
    cluster
        .gpu_node("t4-empty", "Tesla-T4", &gpus("4"), &[])
        .await?;
    cluster
        .gpu_node("t4-half", "Tesla-T4", &gpus("4"), &[])
        .await?;
    let devices =
        r#"[{"id":"GPU-0","cores":100,"memory":16384},{"id":"GPU-1","cores":100,"memory":16384}]"#;
    cluster
        .gpu_node(
            "shared",
            "Tesla-V100",
            &[("gkm.io/gpu-cores", "200"), ("gkm.io/gpu-memory", "32768")],
            &[("gkm.io/gpu-devices", devices)],
        )
        .await?;
    cluster
        .gpu_node("a100", "NVIDIA-A100", &gpus("2"), &[])
        .await?;
    for node in ["l4-ready", "l4-compatible", "l4-unknown", "l4-wrong"] {
        cluster.gpu_node(node, "NVIDIA-L4", &gpus("1"), &[]).await?;
    }
    cluster.gpu_node("cpu-only", "", &[], &[]).await?;
    report(&cluster, "ml", "l4-ready", true, true).await?;
    report(&cluster, "ml", "l4-compatible", true, false).await?;
    report(&cluster, "ml", "l4-wrong", false, false).await?;
    quota(&cluster, "team", "a100", "NVIDIA-A100", 1).await?;

    // What is there before the scheduler starts: pods bound by name.
    let bound = |node: &str, containers: Value| json!({"nodeName": node, "containers": containers});
    for i in 0..3 {
        let spec = bound("t4-packed", asking(json!({"nvidia.com/gpu": "1"})));
        cluster.pod("fill", &format!("packed-{i}"), spec).await?;
    }
    cluster
        .pod(
            "fill",
            "half-0",
            bound("t4-half", asking(json!({"nvidia.com/gpu": "1"}))),
        )
        .await?;
    let on_gpu1 = bound(
        "shared",
        asking(json!({"gkm.io/gpu-cores": "70", "gkm.io/gpu-memory": "1024"})),
    );
    cluster.pod("fill", "shared-0", on_gpu1).await?;
    let assigned = json!({"metadata": {"annotations": {
        "gkm.io/gpu-assignment": r#"{"gkm.io/gpu-cores":["GPU-1"],"gkm.io/gpu-memory":["GPU-1"]}"#}}});
    Api::<Pod>::namespaced(cluster.client.clone(), "fill")
        .patch(
            "shared-0",
            &PatchParams::default(),
            &Patch::Merge(&assigned),
        )
        .await?;
    cluster
        .pod(
            "team",
            "a100-0",
            bound("a100", asking(json!({"nvidia.com/gpu": "1"}))),
        )
        .await?;

    cluster.start_extender().await?;
    let config = support::scheduler_config(&cluster.extender_addr)?;
    cluster.start_scheduler(&config)?;

    let one_gpu = || asking(json!({"nvidia.com/gpu": "1"}));
    let rows: Vec<(&str, &str, Value, Expect)> = vec![
        (
            "whole GPU: the most packed T4 node that fits",
            "ml",
            on_model("Tesla-T4", one_gpu()),
            Expect::On("t4-packed"),
        ),
        (
            "whole GPU: then the next most packed, the idle node stays whole",
            "ml",
            on_model("Tesla-T4", one_gpu()),
            Expect::On("t4-half"),
        ),
        (
            "whole GPUs: more than any node has free",
            "ml",
            on_model("Tesla-T4", asking(json!({"nvidia.com/gpu": "5"}))),
            Expect::PendingWith("Insufficient nvidia.com/gpu"),
        ),
        (
            "shared GPU: the device that strands least (GPU-1)",
            "ml",
            on_model(
                "Tesla-V100",
                asking(json!({"gkm.io/gpu-cores": "20", "gkm.io/gpu-memory": "2048"})),
            ),
            Expect::On("shared"),
        ),
        (
            "shared GPU: no device has the memory",
            "ml",
            on_model(
                "Tesla-V100",
                asking(json!({"gkm.io/gpu-cores": "50", "gkm.io/gpu-memory": "20000"})),
            ),
            Expect::PendingWith("gkm: no GPU has 50% cores and 20000 MiB free"),
        ),
        (
            "quota: namespace team at its A100 limit",
            "team",
            on_model("NVIDIA-A100", one_gpu()),
            Expect::PendingWith(
                "gkm: quota team/a100 reached: namespace team holds 1 of 1 GPUs of model NVIDIA-A100, the pod asks 1",
            ),
        ),
        (
            "another namespace is not held by team's quota",
            "ml",
            on_model("NVIDIA-A100", one_gpu()),
            Expect::On("a100"),
        ),
        (
            "cache: where it is extracted",
            "ml",
            with_cache(on_model("NVIDIA-L4", one_gpu())),
            Expect::On("l4-ready"),
        ),
        (
            "cache: then where a GPU fits it",
            "ml",
            with_cache(on_model("NVIDIA-L4", one_gpu())),
            Expect::On("l4-compatible"),
        ),
        (
            "cache: never where no GPU fits it",
            "ml",
            with_cache(
                json!({"nodeSelector": {"kubernetes.io/hostname": "l4-wrong"}, "containers": one_gpu()}),
            ),
            Expect::PendingWith(
                "gkm: GKMCache ml/vector-add does not fit this node's GPUs (GPU 0: backend cuda does not match hip)",
            ),
        ),
        (
            "no GPUs: scheduled as usual",
            "ml",
            json!({"nodeSelector": {"kubernetes.io/hostname": "cpu-only"}}),
            Expect::On("cpu-only"),
        ),
    ];
    let mut table = Vec::new();
    let mut failures = 0;
    for (i, (what, ns, spec, expect)) in rows.into_iter().enumerate() {
        let name = format!("row-{i}");
        cluster.pod(ns, &name, spec).await?;
        let got = match &expect {
            Expect::On(_) => {
                wait_for(&cluster.client, ns, &name, |o| {
                    matches!(o, Outcome::Bound(_))
                })
                .await?
            }
            Expect::PendingWith(text) => {
                wait_for(
                    &cluster.client,
                    ns,
                    &name,
                    |o| matches!(o, Outcome::Pending(m) if m.contains(text)),
                )
                .await?
            }
        };
        let ok = match (&expect, &got) {
            (Expect::On(node), Outcome::Bound(on)) => node == on,
            (Expect::PendingWith(text), Outcome::Pending(m)) => m.contains(text),
            _ => false,
        };
        failures += usize::from(!ok);
        table.push(format!(
            "{} {what}: {got:?}",
            if ok { "ok  " } else { "FAIL" }
        ));
    }
    let table = table.join("\n");
    assert_eq!(failures, 0, "\n{table}\n{}", cluster.logs());

    // The shared-GPU pod carries the device the extender chose.
    let ml: Api<Pod> = Api::namespaced(cluster.client.clone(), "ml");
    let shared = ml.get("row-3").await?;
    let assignment = shared
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(gkm_core::assignment::ANNOTATION))
        .map(|v| gkm_core::assignment::Assignment::parse(v));
    let expected = gkm_core::assignment::Assignment::new()
        .with("gkm.io/gpu-cores", vec!["GPU-1".to_string()])
        .with("gkm.io/gpu-memory", vec!["GPU-1".to_string()]);
    assert_eq!(assignment, Some(Ok(expected)));

    // The quota's status shows its use.
    let quotas: Api<GKMGPUQuota> = Api::namespaced(cluster.client.clone(), "team");
    let used = gkm_testenv::settle(
        support::SETTLE,
        || async {
            Ok(quotas
                .get("a100")
                .await?
                .status
                .map(|s| s.used)
                .unwrap_or_default())
        },
        |used| !used.is_empty(),
    )
    .await?;
    assert_eq!(
        used.iter()
            .map(|u| (u.model.as_str(), u.gpus))
            .collect::<Vec<_>>(),
        [("NVIDIA-A100", 1)]
    );

    // With the extender gone, GPU pods wait with the reason and pods without
    // GPUs still schedule.
    if let Some(mut extender) = cluster.extender.take() {
        extender.kill();
    }
    cluster
        .pod("ml", "gpu-while-down", on_model("Tesla-T4", one_gpu()))
        .await?;
    cluster
        .pod(
            "ml",
            "cpu-while-down",
            json!({"nodeSelector": {"kubernetes.io/hostname": "cpu-only"}}),
        )
        .await?;
    let addr = cluster.extender_addr.clone();
    let gpu = wait_for(
        &cluster.client,
        "ml",
        "gpu-while-down",
        |o| matches!(o, Outcome::Pending(m) if m.contains(&addr)),
    )
    .await?;
    let cpu = wait_for(&cluster.client, "ml", "cpu-while-down", |o| {
        matches!(o, Outcome::Bound(_))
    })
    .await?;
    assert!(
        matches!(&gpu, Outcome::Pending(m) if m.contains(&addr)),
        "{gpu:?}"
    );
    assert_eq!(cpu, Outcome::Bound("cpu-only".into()));
    Ok(())
}

/// The pods of `ns` and how many are bound.
async fn bound_pods(pods: &Api<Pod>) -> anyhow::Result<(Vec<Pod>, usize)> {
    let list = pods.list(&ListParams::default()).await?.items;
    let bound = list
        .iter()
        .filter(|p| matches!(outcome(p), Outcome::Bound(_)))
        .count();
    Ok((list, bound))
}

/// Waits until every pod of `ns` is either bound or refused with `reason`,
/// returning how many are bound.
async fn settle(pods: &Api<Pod>, reason: &str) -> anyhow::Result<(Vec<Pod>, usize)> {
    gkm_testenv::settle(
        support::SETTLE,
        || bound_pods(pods),
        |(list, _)| {
            list.iter().all(|p| match outcome(p) {
                Outcome::Bound(_) => true,
                Outcome::Pending(m) => m.contains(reason),
            })
        },
    )
    .await
}

/// The scheduler calls the extender over mutual TLS here.
#[tokio::test]
async fn fifty_pods_at_once_against_a_quota_of_eight() -> anyhow::Result<()> {
    let mut cluster = Cluster::start().await?;
    cluster.namespace("burst").await?;
    for i in 0..4 {
        cluster
            .gpu_node(
                &format!("a100-{i}"),
                "NVIDIA-A100",
                &[("nvidia.com/gpu", "8")],
                &[],
            )
            .await?;
    }
    quota(&cluster, "burst", "a100", "NVIDIA-A100", 8).await?;
    // Over mutual TLS, as shipped: the scheduler trusts the extender's CA
    // and presents its client certificate.
    let certificates = cluster.start_extender_mtls().await?;
    let config = support::scheduler_config_mtls(&cluster.extender_addr, &certificates)?;
    cluster.start_scheduler(&config)?;

    let creates = (0..50).map(|i| {
        let spec = json!({"containers": asking(json!({"nvidia.com/gpu": "1"}))});
        let cluster = &cluster;
        async move { cluster.pod("burst", &format!("job-{i:02}"), spec).await }
    });
    for created in futures::future::join_all(creates).await {
        created?;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "burst");
    let reason =
        "gkm: quota burst/a100 reached: namespace burst holds 8 of 8 GPUs of model NVIDIA-A100";
    let (list, bound) = settle(&pods, reason).await?;
    let pending: Vec<String> = list
        .iter()
        .filter_map(|p| match outcome(p) {
            Outcome::Pending(m) => Some(m),
            Outcome::Bound(_) => None,
        })
        .collect();
    assert_eq!(bound, 8, "{}", cluster.logs());
    assert_eq!(pending.len(), 42);
    assert!(pending.iter().all(|m| m.contains(reason)), "{pending:?}");

    // Deleting two bound pods lets exactly two more in.
    let deleted: Vec<String> = list
        .iter()
        .filter(|p| matches!(outcome(p), Outcome::Bound(_)))
        .take(2)
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    for name in &deleted {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await?;
    }
    let (list, bound) = gkm_testenv::settle(
        support::SETTLE,
        || settle(&pods, reason),
        |(list, bound)| list.len() == 48 && *bound == 8,
    )
    .await?;
    assert_eq!((list.len(), bound), (48, 8), "{}", cluster.logs());
    let quotas: Api<GKMGPUQuota> = Api::namespaced(cluster.client.clone(), "burst");
    let status = quotas.get("a100").await?.status.unwrap_or_default();
    assert!(status.used.iter().all(|u| u.gpus <= 8), "{status:?}");
    Ok(())
}
