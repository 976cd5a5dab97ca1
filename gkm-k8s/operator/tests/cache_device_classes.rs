//! Per-cache DeviceClasses against a real apiserver and kube-scheduler:
//!
//! - the class's CEL, evaluated by the scheduler's DRA allocator, selects
//!   exactly the devices gkm-core's fit check accepts, on a table of GPUs
//!   published in ResourceSlices as gkm-dra-plugin encodes them;
//! - the chart's RBAC and `gkm-operator-scope` policy (dra.enabled): the
//!   operator's identity writes and deletes its own classes, and no other.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context as _;
use gkm_core::cache::Summary;
use gkm_core::compat::{NODE_CHECK, check_summary};
use gkm_core::{CacheKey, Gpu, Vendor};
use gkm_k8s_api::crd::{CacheRelease, ImageVariant};
use gkm_k8s_operator::cache::device_class::device_class;
use gkm_testenv::{
    ControlPlane, Scheduler, eventually, service_account_groups, service_account_user,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "cache-classes";
const DRIVER: &str = "gpu.gkm.io";
const TIMEOUT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// The GPUs of the table: what a fit check looks at, in combinations.
fn table() -> Vec<Gpu> {
    let mut gpus = Vec::new();
    let cuda = |arch: &str, warp: Option<u32>, toolkit: Option<&str>| Gpu {
        vendor: Vendor::Nvidia,
        product: format!("sm_{arch}"),
        backend: Some(gkm_core::Backend::Cuda),
        arch: Some(arch.parse().unwrap_or_else(|e| panic!("{e}"))),
        warp_size: warp,
        toolkit_version: toolkit.map(str::to_string),
        ..Gpu::default()
    };
    for arch in ["75", "80", "86", "90", "100"] {
        for warp in [None, Some(32)] {
            for toolkit in [None, Some("11.8"), Some("12.4"), Some("13.0")] {
                gpus.push(cuda(arch, warp, toolkit));
            }
        }
    }
    gpus.push(cuda("90", Some(64), None));
    for arch in ["gfx90a", "gfx942"] {
        for warp in [None, Some(32), Some(64)] {
            gpus.push(Gpu {
                vendor: Vendor::Amd,
                product: arch.to_string(),
                backend: Some(gkm_core::Backend::Hip),
                arch: arch.parse().ok(),
                warp_size: warp,
                ..Gpu::default()
            });
        }
    }
    // Without an architecture; without a backend (bound to vfio-pci).
    gpus.push(Gpu {
        arch: None,
        ..cuda("90", Some(32), None)
    });
    gpus.push(Gpu {
        backend: None,
        ..cuda("90", Some(32), None)
    });
    for (index, gpu) in gpus.iter_mut().enumerate() {
        gpu.index = index as u32;
    }
    gpus
}

/// The device name of the table's GPU `index`.
fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The table as one node's pool, each GPU with the attributes
/// gkm-dra-plugin publishes for it.
fn table_slice(node: &str, gpus: &[Gpu]) -> anyhow::Result<ResourceSlice> {
    let devices: Vec<serde_json::Value> = gpus
        .iter()
        .map(|gpu| {
            let mut attributes = serde_json::to_value(gkm_k8s_dra::devices::gpu_attributes(gpu))?;
            attributes["type"] = json!({"string": "gpu"});
            Ok(json!({"name": device_name(gpu.index), "attributes": attributes}))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-table")},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))?)
}

/// A deliverable release whose variants have these targets (summary labels).
fn release(variants: &[&str]) -> anyhow::Result<CacheRelease> {
    let variants = variants
        .iter()
        .map(|label| {
            Ok(ImageVariant::new(
                &DIGEST.parse()?,
                &Summary::from_label(label)?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(CacheRelease {
        image: "registry.example.com/caches/c:v1".into(),
        digest: Some(DIGEST.into()),
        deliverable: true,
        variants: Some(variants),
        ..CacheRelease::default()
    })
}

/// The GPUs of `gpus` some variant of `release` fits, by the check nodes
/// make ([`NODE_CHECK`]).
fn fitting(release: &CacheRelease, gpus: &[Gpu]) -> anyhow::Result<BTreeSet<String>> {
    let mut fit = BTreeSet::new();
    for variant in release.variants.iter().flatten() {
        let report = check_summary(&variant.summary()?, gpus, &NODE_CHECK);
        fit.extend(report.compatible_gpus().map(|g| device_name(g.index)));
    }
    Ok(fit)
}

/// A Node the scheduler may place pods on (no kubelet behind it).
async fn schedulable_node(plane: &ControlPlane, name: &str) -> anyhow::Result<()> {
    plane.ensure_node(name).await?;
    let nodes: Api<Node> = Api::all(plane.client().await?);
    let room = json!({"pods": "20", "cpu": "8", "memory": "16Gi"});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"capacity": room, "allocatable": room}})),
        )
        .await?;
    Ok(())
}

/// The devices the scheduler allocated to the claim `name`, once it has.
async fn allocated(claims: &Api<ResourceClaim>, name: &str) -> anyhow::Result<BTreeSet<String>> {
    eventually(&format!("the claim {name} allocated"), TIMEOUT, || async {
        let claim = claims.get(name).await?;
        Ok(claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .map(|results| results.into_iter().map(|r| r.device).collect()))
    })
    .await
}

#[tokio::test]
async fn a_caches_class_selects_exactly_the_gpus_its_targets_fit() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    let admin = plane.client().await?;
    plane.ensure_pod_namespace(NS).await?;
    let gpus = table();
    let cases = [
        // A Triton cache for T4s (PTX ISA 8.4: a CUDA 12 toolkit).
        vec![r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32,"ptx_version":84}]}"#],
        // A multi-target image: H100s with a CUDA 12 build, MI300s.
        vec![
            r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32,"ptx_version":87}]}"#,
            r#"{"targets":[{"backend":"hip","arch":"gfx942","warp_size":64}]}"#,
        ],
        // Built with CUDA 13: only drivers of CUDA 13 or of unknown version.
        vec![
            r#"{"targets":[{"backend":"cuda","arch":"80","warp_size":32,"cuda_version":"13.0"}]}"#,
        ],
        vec![r#"{"targets":[{"backend":"hip","arch":"gfx90a","warp_size":64}]}"#],
        // An arch-specific target: exactly 9.0.
        vec![r#"{"targets":[{"backend":"cuda","arch":"90a","warp_size":32,"ptx_version":90}]}"#],
    ];
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let params = PatchParams::apply("cache-classes-test").force();
    // One node per case, each with the whole table: a claim for all
    // matching devices never finds them taken by an earlier case's.
    for i in 0..cases.len() {
        let node = format!("fit-table-{i}");
        schedulable_node(plane, &node).await?;
        let slice = table_slice(&node, &gpus)?;
        let name = slice.metadata.name.clone().unwrap_or_default();
        slices.patch(&name, &params, &Patch::Apply(&slice)).await?;
    }
    let scheduler = Scheduler::start(
        plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;

    for (i, variants) in cases.iter().enumerate() {
        let release = release(variants)?;
        let want = fitting(&release, &gpus)?;
        anyhow::ensure!(!want.is_empty(), "case {i} fits no GPU of the table");
        let cache = CacheKey::named(Some(NS), &format!("case-{i}"));
        let class = device_class(&cache, &release);
        let class_name = class.metadata.name.clone().unwrap_or_default();
        classes
            .patch(&class_name, &params, &Patch::Apply(&class))
            .await?;
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("case-{i}"), "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": class_name, "allocationMode": "All",
            }}]}},
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("case-{i}"), "namespace": NS},
            "spec": {
                "automountServiceAccountToken": false,
                // The apiserver taints new Nodes not-ready; no kubelet
                // lifts it here.
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": format!("case-{i}")}],
                "containers": [{"name": "main", "image": "busybox",
                                "resources": {"claims": [{"name": "gpus"}]}}],
            },
        }))?;
        pods.create(&PostParams::default(), &pod).await?;
        let got = match allocated(&claims, &format!("case-{i}")).await {
            Ok(got) => got,
            Err(e) => {
                let pod = pods.get(&format!("case-{i}")).await?;
                anyhow::bail!(
                    "{e}\npod status: {:?}\nscheduler:\n{}",
                    pod.status.and_then(|s| s.conditions),
                    scheduler.log_tail(40)
                );
            }
        };
        assert_eq!(
            got, want,
            "case {i} {variants:?}: the scheduler (the class's CEL) and gkm-core's check disagree"
        );
    }
    Ok(())
}

/// The chart's operator RBAC and policies with dra.enabled, rendered into
/// `dir`.
fn render_chart(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let chart = gkm_testenv::repo_root().join("deploy/helm/gkm");
    let out = Command::new(gkm_testenv::find_binary(gkm_testenv::Component::Helm)?)
        .args(["template", "gkm"])
        .arg(&chart)
        .args(["--namespace", "gkm-system", "--set", "dra.enabled=true"])
        .args(["--show-only", "templates/rbac/operator.yaml"])
        .args(["--show-only", "templates/policies/operator-scope.yaml"])
        .args(["--show-only", "templates/manifests/dra-deviceclasses.yaml"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("operator.yaml");
    std::fs::write(&path, out.stdout)?;
    Ok(path)
}

/// Whether `result` is the operator-scope policy's refusal.
fn refused<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("gkm-operator may") => {}
        other => panic!("{what}: expected the operator-scope policy's refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn the_operator_writes_and_deletes_only_its_own_device_classes() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane
        .apply_file(&gkm_testenv::repo_root().join("deploy/namespace.yaml"))
        .await?;
    let work = gkm_testenv::temp_dir()?;
    plane.apply_file(&render_chart(work.path())?).await?;
    let user = service_account_user("gkm-system", "gkm-operator");
    let groups = service_account_groups("gkm-system");
    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
    let operator: Api<DeviceClass> = Api::all(plane.client_for(&user, &groups).await?);
    let params = PatchParams::apply("gkm-operator").force();

    // A class that takes over every pod's nvidia.com/gpu request: refused
    // (once the apiserver has loaded the policy).
    let cache = CacheKey::named(Some(NS), "llama");
    let own = device_class(
        &cache,
        &release(&[r#"{"targets":[{"backend":"cuda","arch":"90","warp_size":32}]}"#])?,
    );
    let name = own.metadata.name.clone().unwrap_or_default();
    let mut hijack = own.clone();
    hijack.spec.extended_resource_name = Some("nvidia.com/gpu".into());
    let last = std::cell::RefCell::new(String::new());
    eventually(
        "the operator-scope policy's refusal",
        Duration::from_secs(20),
        || async {
            match operator.patch(&name, &params, &Patch::Apply(&hijack)).await {
                Err(kube::Error::Api(s))
                    if s.code == 403 && s.message.contains("gkm-operator may") =>
                {
                    Ok(Some(()))
                }
                other => {
                    *last.borrow_mut() = format!("{other:?}");
                    Ok(None)
                }
            }
        },
    )
    .await
    .with_context(|| {
        format!(
            "the operator's identity wrote a class with an extended resource: {}",
            last.borrow()
        )
    })?;

    // Its own class: written, changed, deleted.
    operator.patch(&name, &params, &Patch::Apply(&own)).await?;
    let moved = device_class(
        &cache,
        &release(&[r#"{"targets":[{"backend":"cuda","arch":"75","warp_size":32}]}"#])?,
    );
    operator
        .patch(&name, &params, &Patch::Apply(&moved))
        .await?;

    // Classes that are not its own: refused.
    let mut unlabelled = own.clone();
    unlabelled.metadata.name = Some("gkm-cache.other.unlabelled".into());
    unlabelled.metadata.labels = None;
    refused(
        "an unlabelled class",
        operator
            .patch(
                "gkm-cache.other.unlabelled",
                &params,
                &Patch::Apply(&unlabelled),
            )
            .await,
    );
    let mut misnamed = own.clone();
    misnamed.metadata.name = Some("all-gpus".into());
    refused(
        "a class of another name",
        operator
            .patch("all-gpus", &params, &Patch::Apply(&misnamed))
            .await,
    );
    let mut any_driver = own.clone();
    if let Some(selectors) = any_driver.spec.selectors.as_mut() {
        selectors.remove(0);
    }
    refused(
        "a class selecting any driver's devices",
        operator
            .patch(&name, &params, &Patch::Apply(&any_driver))
            .await,
    );
    // The chart's classes: neither changed nor deleted.
    let take_over = json!({"metadata": {"labels": {
        gkm_k8s_operator::cache::device_class::CLASS_LABEL: "true",
    }}});
    refused(
        "the chart's gkm-gpu, changed",
        operator
            .patch(
                "gkm-gpu",
                &PatchParams::default(),
                &Patch::Merge(&take_over),
            )
            .await,
    );
    refused(
        "the chart's gkm-gpu, deleted",
        operator.delete("gkm-gpu", &DeleteParams::default()).await,
    );

    operator.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}
