//! gkm's Dynamic Resource Allocation path on the real node
//! ([`GpuPath::Dra`]): the DRA kubelet plugin (`gkm-dra-plugin`, driver
//! [`DRIVER`]) offers the node's GPUs as ResourceSlices instead of the
//! device plugin offering them as extended resources, and pods get a GPU
//! through a ResourceClaim of the DeviceClass the operator makes for a
//! cache (the GPUs the cache's kernels fit).
//!
//! The machine has no GPU: the plugin reads a simulated node's sysfs,
//! `/dev` and `/proc` ([`simulated_t4`]), the same kind of tree its own
//! tests give it.

use std::path::Path;

use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::Api;

pub use gkm_testenv::{AllocatedDevice, allocated_devices, pod_claim_name};

/// The DRA driver gkm's plugin serves.
pub const DRIVER: &str = "gpu.gkm.io";

/// How the real node's GPUs reach pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuPath {
    /// The device plugin: GPUs as extended resources (`nvidia.com/gpu`).
    #[default]
    DevicePlugin,
    /// The DRA kubelet plugin: GPUs as ResourceSlices, claimed through
    /// ResourceClaims of the chart's and the operator's DeviceClasses.
    Dra,
}

/// The simulated T4's PCI address on the real node.
const T4_ADDRESS: &str = "0000:3b:00.0";

/// The simulated T4's UUID.
pub const T4_UUID: &str = "GPU-75000000-1111-2222-3333-444444444444";

/// The device the plugin names the simulated T4 (from its PCI address).
pub const T4_DEVICE: &str = "gpu-0000-3b-00-0";

/// Makes a node's sysfs, `/dev` and `/proc` under `root` with one NVIDIA T4
/// (sm75) bound to the `nvidia` driver, its device nodes character devices
/// with the numbers of `/dev/null`, as the DRA plugin reads them (without
/// NVML).
pub fn simulated_t4(root: &Path) -> anyhow::Result<NodeTree> {
    let tree = NodeTree::new(root)?.with_char_devices()?;
    tree.pci(&Pci::gpu(T4_ADDRESS, 0x10de, 0x1eb8).driver("nvidia"))?;
    tree.nvidia_gpu(T4_ADDRESS, T4_UUID, 0)?;
    tree.dev_node("nvidia-uvm")?;
    Ok(tree)
}

/// A ResourceClaimTemplate `name` in `namespace` asking for one device of
/// the DeviceClass `class` (request `gpu`).
pub fn claim_template(
    namespace: &str,
    name: &str,
    class: &str,
) -> anyhow::Result<ResourceClaimTemplate> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class}},
        ]}}},
    }))?)
}

/// A busybox pod `name` in `namespace`, placed by kube-scheduler, whose
/// container `main` holds a GPU claimed from the claim template `template`
/// and prints the variable CDI gave it, then waits.
pub fn claim_pod(namespace: &str, name: &str, template: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {crate::REAL_NODE_LABEL: "true"},
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{
                "name": "main",
                "image": gkm_testenv::BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    "tr '\\0' '\\n' < /proc/1/environ | grep -E '^NVIDIA_VISIBLE_DEVICES='; exec sleep 100000"],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        }
    }))?)
}

/// The DeviceClass the operator makes for the GKMCache `namespace/name`.
pub fn cache_class(namespace: &str, name: &str) -> String {
    gkm_k8s_operator::cache::device_class::class_name(&gkm_core::CacheKey::named(
        Some(namespace),
        name,
    ))
}

/// A pod's GPU, claimed through a cache's DeviceClass.
#[derive(Debug, Clone)]
pub struct ClaimedGpu {
    /// The cache's DeviceClass the claim names.
    pub class: String,
    /// The ResourceClaim made for the pod from its template.
    pub claim: String,
    /// The devices the claim was allocated.
    pub devices: Vec<AllocatedDevice>,
}

/// Waits for the operator's DeviceClass of the GKMCache `namespace/cache`,
/// makes a claim template `<cache>-gpu` of it and a pod `<cache>-gpu`
/// ([`claim_pod`]) using it, and waits until the pod runs with its claim
/// allocated; the claim and its devices.
pub async fn claim_cache_gpu(
    client: &kube::Client,
    namespace: &str,
    cache: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<ClaimedGpu> {
    use k8s_openapi::api::resource::v1::DeviceClass;
    use kube::api::PostParams;

    let class = cache_class(namespace, cache);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    gkm_testenv::eventually(
        &format!("the operator's DeviceClass {class}"),
        timeout,
        || async { Ok(classes.get_opt(&class).await?.map(|_| ())) },
    )
    .await?;
    let name = format!("{cache}-gpu");
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    templates
        .create(
            &PostParams::default(),
            &claim_template(namespace, &name, &class)?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.create(&PostParams::default(), &claim_pod(namespace, &name, &name)?)
        .await?;
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    gkm_testenv::wait_for_pod(&pods, &name, timeout, running).await?;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let claim = gkm_testenv::eventually(&format!("the claim of pod {name}"), timeout, || async {
        pod_claim_name(&pods, &name, "gpu").await
    })
    .await?;
    let devices = gkm_testenv::eventually(
        &format!("the allocation of claim {claim}"),
        timeout,
        || async {
            let devices = allocated_devices(&claims, &claim).await?;
            Ok((!devices.is_empty()).then_some(devices))
        },
    )
    .await?;
    Ok(ClaimedGpu {
        class,
        claim,
        devices,
    })
}
