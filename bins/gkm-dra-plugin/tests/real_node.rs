//! `gkm-dra-plugin` with a real kube-scheduler, kubelet, containerd (CDI on,
//! reading the node's own spec directory) and runc, against a sysfs, /dev
//! and /proc tree the test makes: an H100 and an A100 on the `nvidia`
//! driver.
//!
//! The tree's device nodes are character devices with the numbers of
//! `/dev/null` (1:3), made with mknod: CDI copies a device's type and
//! numbers into the container, so the containers really get `/dev/nvidia0`,
//! and those nodes are harmless.
//!
//! One test walks the story: the node's ResourceSlice (a GPU whose device
//! node goes leaves it, and comes back with it), a DeviceClass for
//! H100s, a pod whose claim gets the H100 and sees what CDI injected, a
//! plugin restart and a kubelet restart that leave the pod and its claim as
//! they were, a second claim after them that gets the A100, unpreparing,
//! VM-shaped pods claiming a passthrough GPU and a vGPU that read their
//! device metadata files (the PCI address, the mdev UUID) as KubeVirt's
//! virt-launcher does, claims through a cache's DeviceClass (made by the
//! operator from a real Triton image in a real registry) landing on the
//! GPUs the cache fits and following its tag, and the slices going when
//! the plugin stops.

mod support;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, ControlPlaneOptions, RealNode, RealNodeOptions, Scheduler,
    eventually, running_pod_log, until,
};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const NODE: &str = "real-dra";
const NS: &str = "dra";
const DRIVER: &str = "gpu.gkm.io";
const H100_UUID: &str = "GPU-6e000000-1111-2222-3333-444444444444";
const H100_B_UUID: &str = "GPU-9b000000-1111-2222-3333-444444444444";
const A100_UUID: &str = "GPU-7f000000-1111-2222-3333-444444444444";
const H100: &str = "NVIDIA H100 SXM5 80GB";
/// The chart's class for H100s (support::install names the model).
const H100_CLASS: &str = "gkm-model-h100";

/// Where a pod's claim comes from.
#[derive(Clone, Copy)]
enum ClaimSource<'a> {
    /// The ResourceClaim of this name.
    Claim(&'a str),
    /// A ResourceClaim made for the pod from the template of this name.
    Template(&'a str),
}

/// A busybox pod (scheduled by kube-scheduler) in [`NS`] whose container
/// `container` uses the claim from `source` (the pod's name for it
/// `pod_claim`, its request `request` when given) and runs `script`, then
/// waits.
fn busybox_pod(
    name: &str,
    container: &str,
    (pod_claim, source, request): (&str, ClaimSource<'_>, Option<&str>),
    script: &str,
) -> anyhow::Result<Pod> {
    let pod_claim_entry = match source {
        ClaimSource::Claim(claim) => json!({"name": pod_claim, "resourceClaimName": claim}),
        ClaimSource::Template(template) => {
            json!({"name": pod_claim, "resourceClaimTemplateName": template})
        }
    };
    let mut uses = json!({"name": pod_claim});
    if let Some(request) = request {
        uses["request"] = json!(request);
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            // No node lifecycle controller runs to lift the node's
            // not-ready taint.
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [pod_claim_entry],
            "containers": [{
                "name": container,
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!("{script} echo DONE; exec sleep 100000")],
                "resources": {"claims": [uses]},
            }],
        }
    }))?)
}

/// A pod whose container uses the claim `claim`, printing its NVIDIA
/// variable and which GPU device nodes it has.
fn claim_pod(name: &str, claim: &str) -> anyhow::Result<Pod> {
    busybox_pod(
        name,
        "main",
        ("gpu", ClaimSource::Claim(claim), None),
        "tr '\\0' '\\n' < /proc/1/environ | grep -E '^NVIDIA_VISIBLE_DEVICES=' ; \
         for d in /dev/nvidia*; do if [ -c $d ]; then echo CHAR-DEVICE $d; fi; done;",
    )
}

const VGPU_UUID: &str = "0b1c5e8a-1111-4d2e-9c3a-000000000001";

/// A VM-shaped pod: its container `compute` uses the claim from `source`
/// (the pod's name for it is `vm-gpu`, its request `request`) and prints
/// the device metadata file virt-launcher would read, where it would look
/// for it, then the VFIO nodes it has.
fn vm_pod(name: &str, source: ClaimSource<'_>, request: &str) -> anyhow::Result<Pod> {
    let dir = match source {
        ClaimSource::Claim(claim) => format!("resourceclaims/{claim}"),
        ClaimSource::Template(_) => "resourceclaimtemplates/vm-gpu".to_string(),
    };
    let file = format!(
        "/var/run/kubernetes.io/dra-device-attributes/{dir}/{request}/{DRIVER}-metadata.json"
    );
    busybox_pod(
        name,
        "compute",
        ("vm-gpu", source, Some(request)),
        &format!(
            "cat {file}; echo END-METADATA; \
             for d in /dev/vfio/*; do if [ -c $d ]; then echo CHAR-DEVICE $d; fi; done;"
        ),
    )
}

/// The metadata object a [`vm_pod`]'s log shows, and the rest of the log.
fn metadata_in_log(log: &str) -> anyhow::Result<(serde_json::Value, &str)> {
    let (file, rest) = log
        .split_once("END-METADATA\n")
        .ok_or_else(|| anyhow::anyhow!("no metadata in the log:\n{log}"))?;
    let mut stream = serde_json::Deserializer::from_str(file).into_iter::<serde_json::Value>();
    let first = stream
        .next()
        .ok_or_else(|| anyhow::anyhow!("an empty metadata file:\n{log}"))??;
    Ok((first, rest))
}

/// The string attribute `key` of the only device of a metadata object's
/// only request.
fn only_device_attribute(metadata: &serde_json::Value, key: &str) -> Option<String> {
    let requests = metadata["requests"].as_array()?;
    let devices = requests.first()?["devices"].as_array()?;
    if requests.len() != 1 || devices.len() != 1 {
        return None;
    }
    devices[0]["attributes"][key]["string"]
        .as_str()
        .map(str::to_string)
}

/// The devices of the node's gkm slices: name → productName, once `want`
/// holds.
async fn wait_slices(
    slices: &Api<ResourceSlice>,
    want: impl Fn(&BTreeMap<String, String>) -> bool,
) -> anyhow::Result<BTreeMap<String, String>> {
    let selector = format!("spec.nodeName={NODE},spec.driver={DRIVER}");
    let seen = RefCell::new(BTreeMap::new());
    eventually("the node's slices as wanted", TIMEOUT, || async {
        let mut devices = BTreeMap::new();
        for slice in slices
            .list(&ListParams::default().fields(&selector))
            .await?
            .items
        {
            for device in slice.spec.devices.unwrap_or_default() {
                let product = device
                    .attributes
                    .unwrap_or_default()
                    .get("productName")
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default();
                devices.insert(device.name, product);
            }
        }
        if want(&devices) {
            return Ok(Some(devices));
        }
        *seen.borrow_mut() = devices;
        Ok(None)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}: they hold {:?}", seen.borrow()))
}

/// The devices `claim`'s allocation names: (driver, pool, device).
async fn allocated(
    claims: &Api<ResourceClaim>,
    claim: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    Ok(gkm_testenv::allocated_devices(claims, claim)
        .await?
        .into_iter()
        .map(|d| (d.driver, d.pool, d.device))
        .collect())
}

/// The generation of the node's pool (`None` while it has no slices).
async fn pool_generation(slices: &Api<ResourceSlice>) -> anyhow::Result<Option<i64>> {
    let selector = format!("spec.nodeName={NODE},spec.driver={DRIVER}");
    Ok(slices
        .list(&ListParams::default().fields(&selector))
        .await?
        .items
        .iter()
        .map(|s| s.spec.pool.generation)
        .max())
}

fn gpu_claim(name: &str, class: &str) -> anyhow::Result<ResourceClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class}},
        ]}},
    }))?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_claims_a_gpu_of_a_named_model_and_keeps_it_across_plugin_and_kubelet_restarts()
-> anyhow::Result<()> {
    // kube-controller-manager's resource claim controller releases the
    // claims of pods that are gone; its resource quota controller keeps
    // ResourceQuota status, which quota admission needs.
    let plane = &ControlPlane::start_with(ControlPlaneOptions {
        controller_manager: true,
        extra_controllers: vec![
            "resourceclaim-controller".to_string(),
            "resourcequota-controller".to_string(),
        ],
        ..ControlPlaneOptions::default()
    })
    .await?;
    let mut node = RealNode::start(
        plane,
        RealNodeOptions {
            name: NODE.to_string(),
            ..RealNodeOptions::default()
        },
    )
    .await?;
    plane.ensure_pod_namespace(NS).await?;
    let client = plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let slices: Api<ResourceSlice> = Api::all(client.clone());

    // The plugin runs as its ServiceAccount with the chart's RBAC; the
    // chart's DeviceClasses (with a class for H100s).
    let work = gkm_testenv::temp_dir()?;
    let kubeconfig = support::install(
        plane,
        work.path(),
        &["rbac/dra-plugin.yaml", "manifests/dra-deviceclasses.yaml"],
    )
    .await?;
    let site = support::Site {
        node: node.name(),
        kubelet_dir: node.kubelet_dir(),
        cdi_dir: node.cdi_spec_dir(),
        state_dir: work.path().join("state"),
    };
    let pci_ids = [format!(
        "--pci-ids={}",
        work.path().join("pci.ids").display()
    )];

    let tree = NodeTree::new(&work.path().join("node"))?.with_char_devices()?;
    tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))?;
    tree.nvidia_gpu("0000:6e:00.0", H100_UUID, 0)?;
    tree.pci(&Pci::gpu("0000:7f:00.0", 0x10de, 0x20b5).driver("nvidia"))?;
    tree.nvidia_gpu("0000:7f:00.0", A100_UUID, 1)?;
    tree.dev_node("nvidia-uvm")?;
    std::fs::write(
        work.path().join("pci.ids"),
        "10de  NVIDIA Corporation\n\t20b5  GA100 [A100 PCIe 80GB]\n\t2330  GH100 [H100 SXM5 80GB]\n",
    )?;
    let mut plugin = support::start_plugin(
        &site,
        &tree,
        &kubeconfig,
        &pci_ids,
        &work.path().join("plugin.log"),
    )?;

    // The node's pool: both GPUs, named by model.
    let began = Instant::now();
    let devices = wait_slices(&slices, |d| d.len() == 2).await?;
    eprintln!(
        "slices published {:?} after start: {devices:?}",
        began.elapsed()
    );
    assert_eq!(devices["gpu-0000-6e-00-0"], H100);
    assert_eq!(devices["gpu-0000-7f-00-0"], "NVIDIA A100 PCIe 80GB");

    // A GPU's device node goes: the GPU leaves the pool; it comes back.
    let a100_node = tree.paths().dev_root.join("nvidia1");
    std::fs::remove_file(&a100_node)?;
    wait_slices(&slices, |d| {
        !d.contains_key("gpu-0000-7f-00-0") && d.len() == 1
    })
    .await?;
    tree.dev_node("nvidia1")?;
    let began = Instant::now();
    wait_slices(&slices, |d| d.len() == 2).await?;
    eprintln!(
        "the A100 published again {:?} after its node came back",
        began.elapsed()
    );

    // A claim of the chart's class for H100s.
    claims
        .create(&PostParams::default(), &gpu_claim("h100", H100_CLASS)?)
        .await?;
    let mut scheduler = Scheduler::start(
        plane,
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n",
    )?;
    pods.create(&PostParams::default(), &claim_pod("trainer", "h100")?)
        .await?;
    let log = running_pod_log(&pods, "trainer", "main", "DONE", TIMEOUT).await?;
    eprintln!("trainer:\n{log}");
    // What CDI injected: the H100's node, the shared nodes, its UUID; not
    // the A100's node.
    assert!(
        log.contains(&format!("NVIDIA_VISIBLE_DEVICES={H100_UUID}\n")),
        "{log}"
    );
    for node in ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"] {
        assert!(log.contains(&format!("CHAR-DEVICE {node}\n")), "{log}");
    }
    assert!(!log.contains("/dev/nvidia1"), "{log}");
    // The claim's allocation names the device the container got.
    let h100 = (
        DRIVER.to_string(),
        NODE.to_string(),
        "gpu-0000-6e-00-0".to_string(),
    );
    assert_eq!(
        allocated(&claims, "h100").await?,
        std::slice::from_ref(&h100)
    );
    let uid = claims.get("h100").await?.metadata.uid.unwrap_or_default();
    let spec = node.cdi_spec_dir().join(format!("gkm.io-gpu_{uid}.json"));
    assert!(spec.exists(), "{}", spec.display());
    let container = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.container_id.clone())
    };
    let first = container(&pods.get("trainer").await?);

    // The plugin restarts: its slices go and come back; the prepared claim
    // stays prepared (its spec stays), and the pod runs on.
    plugin.stop(Duration::from_secs(10));
    wait_slices(&slices, |d| d.is_empty()).await?;
    assert!(spec.exists(), "a stopping plugin keeps prepared claims");
    let mut plugin = support::start_plugin(
        &site,
        &tree,
        &kubeconfig,
        &pci_ids,
        &work.path().join("plugin-2.log"),
    )?;
    wait_slices(&slices, |d| d.len() == 2).await?;

    // The kubelet restarts: it wipes the node's slices when it starts; the
    // plugin writes them again (a newer generation of the pool) and
    // registers again.
    let before = pool_generation(&slices).await?;
    node.restart_kubelet().await?;
    let began = Instant::now();
    let generation = RefCell::new(None);
    eventually(
        &format!("the pool past generation {before:?} after the kubelet restart"),
        TIMEOUT,
        || async {
            let now = pool_generation(&slices).await?;
            *generation.borrow_mut() = now;
            Ok(now
                .is_some_and(|g| before.is_some_and(|b| g > b))
                .then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: it is at generation {:?}", generation.borrow()))?;
    wait_slices(&slices, |d| d.len() == 2).await?;
    eprintln!(
        "slices written again {:?} after the kubelet was Ready",
        began.elapsed()
    );
    plugin.check_running()?;
    let trainer = pods.get("trainer").await?;
    assert_eq!(
        trainer.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(container(&trainer), first, "the container was not replaced");
    assert_eq!(allocated(&claims, "h100").await?, [h100]);
    assert!(spec.exists());

    // A second claim for any gkm GPU, after both restarts: the H100 is
    // taken, so it gets the A100, through the restarted kubelet.
    claims
        .create(&PostParams::default(), &gpu_claim("any", "gkm-gpu")?)
        .await?;
    pods.create(&PostParams::default(), &claim_pod("second", "any")?)
        .await?;
    let log = running_pod_log(&pods, "second", "main", "DONE", TIMEOUT).await?;
    assert!(
        log.contains(&format!("NVIDIA_VISIBLE_DEVICES={A100_UUID}\n")),
        "{log}"
    );
    assert!(log.contains("CHAR-DEVICE /dev/nvidia1\n"), "{log}");
    assert!(!log.contains("/dev/nvidia0"), "{log}");
    assert_eq!(
        allocated(&claims, "any").await?,
        [(
            DRIVER.to_string(),
            NODE.to_string(),
            "gpu-0000-7f-00-0".to_string()
        )]
    );
    scheduler.check_running()?;

    // The first pod goes: the restarted plugin unprepares the claim it
    // prepared before its restart (from its checkpoint), removing the spec.
    pods.delete("trainer", &DeleteParams::default()).await?;
    let plugin_log = work.path().join("plugin-2.log");
    until(
        "the first claim unprepared (its CDI spec gone)",
        TIMEOUT,
        || {
            !spec.exists()
                && std::fs::read_to_string(&plugin_log)
                    .is_ok_and(|log| log.contains("unprepared") && log.contains(&uid))
        },
    )
    .await?;

    // Virtual machines: an H100 on vfio-pci (group 11), a T4 with a vGPU,
    // and an H100 on vfio-pci whose group 13 holds its audio function on a
    // host driver: that group is not viable, so it is never published.
    tree.dev_node("vfio/vfio")?;
    tree.pci(
        &Pci::gpu("0000:2a:00.0", 0x10de, 0x2330)
            .driver("vfio-pci")
            .group(11),
    )?;
    tree.group_node(11)?;
    tree.pci(
        &Pci::gpu("0000:4c:00.0", 0x10de, 0x2330)
            .driver("vfio-pci")
            .group(13),
    )?;
    tree.group_node(13)?;
    tree.pci(
        &Pci::audio("0000:4c:00.1", 0x10de, 0x22ba)
            .driver("snd_hda_intel")
            .group(13),
    )?;
    tree.pci(&Pci::gpu("0000:5d:00.0", 0x10de, 0x1eb8).driver("nvidia"))?;
    tree.mdev(VGPU_UUID, "0000:5d:00.0", "nvidia-222", "GRID T4-2Q", 30)?;
    // And a second H100 for containers, for the quota below.
    tree.pci(&Pci::gpu("0000:9b:00.0", 0x10de, 0x2330).driver("nvidia"))?;
    tree.nvidia_gpu("0000:9b:00.0", H100_B_UUID, 2)?;
    let devices = wait_slices(&slices, |d| d.len() == 5).await?;
    assert!(devices.contains_key("vfio-0000-2a-00-0"), "{devices:?}");
    assert!(
        devices.contains_key(&format!("vgpu-{VGPU_UUID}")),
        "{devices:?}"
    );
    assert!(
        !devices.contains_key("vfio-0000-4c-00-0"),
        "a group that is not viable is not published: {devices:?}"
    );
    // The passthrough GPU by a claim of its own; the vGPU by a template,
    // as KubeVirt's VMs ask (its file is under the pod's name for it).
    let mut pgpu = gpu_claim("pgpu", "gkm-passthrough")?;
    if let Some(requests) = pgpu.spec.devices.as_mut().and_then(|d| d.requests.as_mut()) {
        requests[0].name = "pgpu".to_string();
    }
    claims.create(&PostParams::default(), &pgpu).await?;
    pods.create(
        &PostParams::default(),
        &vm_pod("vm-pgpu", ClaimSource::Claim("pgpu"), "pgpu")?,
    )
    .await?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "vgpu", "namespace": NS},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "vgpu", "exactly": {"deviceClassName": "gkm-vgpu"}},
                ]}}},
            }))?,
        )
        .await?;
    pods.create(
        &PostParams::default(),
        &vm_pod("vm-vgpu", ClaimSource::Template("vgpu"), "vgpu")?,
    )
    .await?;
    let log = running_pod_log(&pods, "vm-pgpu", "compute", "DONE", TIMEOUT).await?;
    eprintln!("vm-pgpu:\n{log}");
    let (metadata, rest) = metadata_in_log(&log)?;
    assert_eq!(
        only_device_attribute(&metadata, "resource.kubernetes.io/pciBusID").as_deref(),
        Some("0000:2a:00.0"),
        "{metadata:#}"
    );
    assert_eq!(metadata["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(metadata["metadata"]["name"], "pgpu");
    assert!(rest.contains("CHAR-DEVICE /dev/vfio/11\n"), "{log}");
    assert!(rest.contains("CHAR-DEVICE /dev/vfio/vfio\n"), "{log}");
    let log = running_pod_log(&pods, "vm-vgpu", "compute", "DONE", TIMEOUT).await?;
    eprintln!("vm-vgpu:\n{log}");
    let (metadata, rest) = metadata_in_log(&log)?;
    assert_eq!(
        only_device_attribute(&metadata, "mdevUUID").as_deref(),
        Some(VGPU_UUID),
        "{metadata:#}"
    );
    assert_eq!(metadata["podClaimName"], "vm-gpu", "{metadata:#}");
    assert!(rest.contains("CHAR-DEVICE /dev/vfio/30\n"), "{log}");
    assert!(!rest.contains("/dev/vfio/11"), "{log}");
    // The files are the plugin's, under its state directory, until the
    // claim is unprepared.
    let host_file = work
        .path()
        .join("state/dra-device-metadata")
        .join(format!("{NS}_pgpu"))
        .join("pgpu/metadata.json");
    assert!(host_file.exists(), "{}", host_file.display());

    // The passthrough GPU's group node goes: the plugin's health stream
    // tells the kubelet, which shows it in the pod's status; it comes back.
    // The kubelet names a device by its first CDI device.
    let pgpu_uid = claims.get("pgpu").await?.metadata.uid.unwrap_or_default();
    let resource_id = format!("gkm.io/gpu={pgpu_uid}-vfio-0000-2a-00-0");
    let health_shown = |want: &'static str| {
        let (pods, resource_id) = (pods.clone(), resource_id.clone());
        move || {
            let (pods, resource_id) = (pods.clone(), resource_id.clone());
            async move {
                let pod = pods.get("vm-pgpu").await?;
                Ok((allocated_health(&pod, &resource_id).as_deref() == Some(want)).then_some(()))
            }
        }
    };
    eventually(
        "the pod's status showing the passthrough GPU healthy",
        TIMEOUT,
        health_shown("Healthy"),
    )
    .await?;
    tree.remove_group_node(11)?;
    let began = Instant::now();
    eventually(
        "the pod's status showing the passthrough GPU unhealthy",
        TIMEOUT,
        health_shown("Unhealthy"),
    )
    .await?;
    eprintln!(
        "the pod's status showed the GPU unhealthy {:?} after its group node went: {:?}",
        began.elapsed(),
        pods.get("vm-pgpu")
            .await?
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.allocated_resources_status)
    );
    tree.group_node(11)?;
    eventually(
        "the pod's status showing the passthrough GPU healthy again",
        TIMEOUT,
        health_shown("Healthy"),
    )
    .await?;
    pods.delete("vm-pgpu", &DeleteParams::default()).await?;
    until(
        "the passthrough claim's metadata file removed",
        TIMEOUT,
        || !host_file.exists(),
    )
    .await?;
    pods.delete("vm-vgpu", &DeleteParams::default()).await?;

    // Every claim so far goes (kube-controller-manager releases them once
    // their pods are gone), so all container GPUs are free.
    pods.delete("second", &DeleteParams::default()).await?;
    // (The vGPU's claim, made from its template, goes with its pod.)
    for claim in ["h100", "any", "pgpu"] {
        claims.delete(claim, &DeleteParams::default()).await?;
    }
    eventually("the story's claims gone", TIMEOUT, || async {
        Ok(claims
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;

    quota_of_two_h100s_per_namespace(plane, &client).await?;
    nvidia_gpu_pods_are_served_through_dra(&client).await?;
    claims_through_a_caches_class_land_on_the_gpus_it_fits(plane, &client).await?;

    // The plugin stops for good: its slices go with it.
    plugin.stop(Duration::from_secs(10));
    wait_slices(&slices, |d| d.is_empty()).await?;
    drop(scheduler);
    Ok(())
}

/// A namespace may hold at most 2 devices of the chart's H100 class, with
/// a plain ResourceQuota: of 5 claims created at once, quota admission
/// lets 2 in and refuses 3; both get an H100; when one goes, exactly one
/// more gets in, and gets the H100 it freed.
async fn quota_of_two_h100s_per_namespace(
    plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    const QNS: &str = "dra-quota";
    plane.ensure_pod_namespace(QNS).await?;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), QNS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), QNS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), QNS);
    let key = format!("{H100_CLASS}.deviceclass.resource.k8s.io/devices");
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "h100s", "namespace": QNS},
                "spec": {"hard": {key.clone(): "2"}},
            }))?,
        )
        .await?;
    let used = || async {
        let quota = quotas.get("h100s").await?;
        Ok::<_, anyhow::Error>(
            quota
                .status
                .and_then(|s| s.used)
                .and_then(|u| u.get(&key).map(|q| q.0.clone())),
        )
    };
    // Quota admission counts against the status the controller keeps.
    eventually("the quota's status", TIMEOUT, || async {
        Ok(used().await?.is_some().then_some(()))
    })
    .await?;
    let claim_in_quota = |name: &str| -> anyhow::Result<ResourceClaim> {
        let mut claim = gpu_claim(name, H100_CLASS)?;
        claim.metadata.namespace = Some(QNS.to_string());
        Ok(claim)
    };
    let pod_in_quota = |name: &str, claim: &str| -> anyhow::Result<Pod> {
        let mut pod = claim_pod(name, claim)?;
        pod.metadata.namespace = Some(QNS.to_string());
        Ok(pod)
    };

    let mut creating = tokio::task::JoinSet::new();
    for i in 0..5 {
        let (claims, claim) = (claims.clone(), claim_in_quota(&format!("h100-{i}"))?);
        creating.spawn(async move {
            let name = claim.metadata.name.clone().unwrap_or_default();
            (name, claims.create(&PostParams::default(), &claim).await)
        });
    }
    let (mut admitted, mut refused) = (Vec::new(), Vec::new());
    while let Some(done) = creating.join_next().await {
        match done? {
            (name, Ok(_)) => admitted.push(name),
            (name, Err(kube::Error::Api(e))) => refused.push((name, e.code, e.message)),
            (name, Err(e)) => anyhow::bail!("creating claim {name}: {e}"),
        }
    }
    admitted.sort();
    eprintln!("quota: admitted {admitted:?}, refused {refused:#?}");
    assert_eq!(admitted.len(), 2, "{admitted:?} {refused:?}");
    assert_eq!(refused.len(), 3, "{refused:?}");
    for (_, code, message) in &refused {
        assert_eq!(*code, 403, "{message}");
        assert!(
            message.contains("exceeded quota: h100s") && message.contains(&key),
            "{message}"
        );
    }
    let mut uuids = Vec::new();
    for (i, claim) in admitted.iter().enumerate() {
        let pod = format!("quota-{i}");
        pods.create(&PostParams::default(), &pod_in_quota(&pod, claim)?)
            .await?;
    }
    for i in 0..admitted.len() {
        let log = running_pod_log(&pods, &format!("quota-{i}"), "main", "DONE", TIMEOUT).await?;
        uuids.push(visible_devices(&log)?);
    }
    let freed = uuids[0].clone();
    uuids.sort();
    assert_eq!(uuids, [H100_UUID, H100_B_UUID]);

    // One goes: exactly one more claim gets in.
    pods.delete("quota-0", &DeleteParams::default()).await?;
    claims
        .delete(&admitted[0], &DeleteParams::default())
        .await?;
    eventually(
        "the quota not counting the deleted claim",
        TIMEOUT,
        || async { Ok((used().await?.as_deref() == Some("1")).then_some(())) },
    )
    .await?;
    claims
        .create(&PostParams::default(), &claim_in_quota("h100-5")?)
        .await?;
    let sixth = claims
        .create(&PostParams::default(), &claim_in_quota("h100-6")?)
        .await;
    assert!(
        matches!(&sixth, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("exceeded quota")),
        "{sixth:?}"
    );
    pods.create(&PostParams::default(), &pod_in_quota("quota-2", "h100-5")?)
        .await?;
    let log = running_pod_log(&pods, "quota-2", "main", "DONE", TIMEOUT).await?;
    assert_eq!(
        visible_devices(&log)?,
        freed,
        "it gets the H100 that was freed"
    );
    for pod in ["quota-1", "quota-2"] {
        pods.delete(pod, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The `NVIDIA_VISIBLE_DEVICES` a [`claim_pod`]'s log shows.
fn visible_devices(log: &str) -> anyhow::Result<String> {
    log.lines()
        .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no NVIDIA_VISIBLE_DEVICES in the log:\n{log}"))
}

/// A pod asking for `nvidia.com/gpu: 1`, with no claim, gets a GPU from
/// `gpu.gkm.io` through the chart's class `gkm-nvidia-gpu`
/// (`extendedResourceName`): kube-scheduler makes the claim, the plugin
/// prepares it, and the pod's status names it.
async fn nvidia_gpu_pods_are_served_through_dra(client: &kube::Client) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut pod = claim_pod("extended", "unused")?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.resource_claims = None;
        spec.containers[0].resources = Some(serde_json::from_value(json!({
            "limits": {"nvidia.com/gpu": "1"},
        }))?);
    }
    pods.create(&PostParams::default(), &pod).await?;
    let log = running_pod_log(&pods, "extended", "main", "DONE", TIMEOUT).await?;
    eprintln!("extended:\n{log}");
    // One of the node's NVIDIA GPUs, as allocated.
    let visible = visible_devices(&log)?;
    let device = [
        (H100_UUID, "gpu-0000-6e-00-0"),
        (H100_B_UUID, "gpu-0000-9b-00-0"),
        (A100_UUID, "gpu-0000-7f-00-0"),
    ]
    .into_iter()
    .find_map(|(uuid, device)| (uuid == visible).then_some(device))
    .ok_or_else(|| anyhow::anyhow!("{visible} is none of the node's NVIDIA GPUs"))?;
    let status = pods
        .get("extended")
        .await?
        .status
        .and_then(|s| s.extended_resource_claim_status)
        .ok_or_else(|| anyhow::anyhow!("the pod's status names no extended resource claim"))?;
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&status.resource_claim_name)
        .await?;
    let results = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default();
    assert_eq!(
        results
            .iter()
            .map(|r| (r.driver.as_str(), r.device.as_str()))
            .collect::<Vec<_>>(),
        [(DRIVER, device)]
    );
    pods.delete("extended", &DeleteParams::default()).await?;
    Ok(())
}

/// The health the pod's first container's `allocatedResourcesStatus`
/// shows for resource `resource_id` (the device's first CDI device name).
fn allocated_health(pod: &Pod, resource_id: &str) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .allocated_resources_status
        .as_ref()?
        .iter()
        .flat_map(|s| s.resources.iter().flatten())
        .find(|r| r.resource_id == resource_id)
        .and_then(|r| r.health.clone())
}

/// The operator (in this process, with `--dra-device-classes`) gives a
/// GKMCache of a real Triton image for sm_90 a DeviceClass: claims through
/// it get the node's two H100s, not its A100 (sm_80). The cache's tag moves
/// to the same kernels built for sm_80: the class follows, and the next
/// claim gets the A100. Deleting the cache deletes its class.
async fn claims_through_a_caches_class_land_on_the_gpus_it_fits(
    plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    use gkm_k8s_api::crd::GKMCache;
    use gkm_k8s_operator::cache::device_class::{DIGEST_ANNOTATION, class_name};
    use gkm_oci::sign::{SignFormat, SigningKey, sign};
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::resource::v1::DeviceClass;

    let registry = gkm_testenv::Registry::shared()?;
    let options = gkm_oci::RegistryOptions {
        insecure: true,
        ..gkm_oci::RegistryOptions::default()
    };
    let (key, _) = SigningKey::generate_p256()?;
    let image = format!("{}/dra-cache/vector-add:v1", registry.addr());
    // Builds the fixture compiled for `target` as the image's tag, signed.
    let publish = |target: &'static str| {
        let (image, options, key) = (image.clone(), options.clone(), &key);
        async move {
            let fixture = gkm_testenv::repo_root()
                .join("fixtures/triton")
                .join(target);
            let reference: gkm_oci::ImageRef = image.parse()?;
            let built = gkm_oci::build(
                &fixture,
                &reference,
                &gkm_oci::BuildOptions::default(),
                &options,
            )
            .await?;
            sign(&reference, &options, &built.digest, key, SignFormat::Bundle).await?;
            anyhow::Ok(built.digest.to_string())
        }
    };
    let sm90 = publish("cuda-90-32").await?;

    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    plane.ensure_namespace("gkm-system").await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "signer", "namespace": NS},
        "stringData": {"cosign.pub": key.public_key().to_pem()},
    }))?;
    let apply = kube::api::PatchParams::apply("gkm-test").force();
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch("signer", &apply, &kube::api::Patch::Apply(&secret))
        .await?;
    let operator = tokio::spawn(gkm_k8s_operator::run(
        client.clone(),
        gkm_k8s_operator::OperatorConfig {
            registry: options.clone(),
            resolve_interval: Duration::from_secs(1),
            tenant_signers: gkm_k8s_operator::TenantSigners::in_namespaces([NS]),
            device_classes: true,
            ..gkm_k8s_operator::OperatorConfig::default()
        },
        std::sync::Arc::new(gkm_k8s_operator::RegistryVerifier::new(
            client.clone(),
            options.clone(),
            "gkm-system",
        )),
        std::sync::Arc::new(gkm_k8s_operator::Metrics::default()),
    ));
    let caches: Api<GKMCache> = Api::namespaced(client.clone(), NS);
    let cache: GKMCache = serde_json::from_value(json!({
        "apiVersion": "gkm.io/v1alpha1", "kind": "GKMCache",
        "metadata": {"name": "vector-add", "namespace": NS},
        "spec": {"image": image, "signature": {"signers": [
            {"key": {"secretRef": {"name": "signer", "key": "cosign.pub"}}},
        ]}},
    }))?;
    caches
        .patch("vector-add", &apply, &kube::api::Patch::Apply(&cache))
        .await?;
    let class = class_name(&gkm_core::CacheKey::named(Some(NS), "vector-add"));
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let began = Instant::now();
    let selects = |digest: String| {
        let (classes, class) = (classes.clone(), class.clone());
        async move {
            eventually(
                &format!("the class {class} selecting {digest}'s GPUs"),
                TIMEOUT,
                || async {
                    let selected = classes.get_opt(&class).await?.is_some_and(|c| {
                        c.metadata
                            .annotations
                            .unwrap_or_default()
                            .get(DIGEST_ANNOTATION)
                            == Some(&digest)
                            && c.spec.selectors.is_some_and(|s| {
                                s.iter().all(|s| {
                                    s.cel.as_ref().is_some_and(|c| c.expression != "false")
                                })
                            })
                    });
                    Ok(selected.then_some(()))
                },
            )
            .await
        }
    };
    selects(sm90.clone()).await?;
    eprintln!(
        "the cache's class selected its GPUs {:?} after the cache was applied",
        began.elapsed()
    );

    // Two claims through the class: the two H100s, never the A100.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut got = BTreeMap::new();
    for name in ["fit-1", "fit-2"] {
        claims
            .create(&PostParams::default(), &gpu_claim(name, &class)?)
            .await?;
        pods.create(&PostParams::default(), &claim_pod(name, name)?)
            .await?;
        let log = running_pod_log(&pods, name, "main", "DONE", TIMEOUT).await?;
        got.insert(visible_devices(&log)?, allocated(&claims, name).await?);
    }
    let pool = |device: &str| (DRIVER.to_string(), NODE.to_string(), device.to_string());
    assert_eq!(
        got,
        BTreeMap::from([
            (H100_UUID.to_string(), vec![pool("gpu-0000-6e-00-0")]),
            (H100_B_UUID.to_string(), vec![pool("gpu-0000-9b-00-0")]),
        ])
    );

    // The tag moves to the kernels for sm_80: the class follows, and the
    // next claim gets the A100.
    let sm80 = publish("cuda-80-32").await?;
    let began = Instant::now();
    selects(sm80).await?;
    eprintln!(
        "the class followed the moved tag {:?} after the push",
        began.elapsed()
    );
    claims
        .create(&PostParams::default(), &gpu_claim("fit-3", &class)?)
        .await?;
    pods.create(&PostParams::default(), &claim_pod("fit-3", "fit-3")?)
        .await?;
    let log = running_pod_log(&pods, "fit-3", "main", "DONE", TIMEOUT).await?;
    assert_eq!(visible_devices(&log)?, A100_UUID);
    assert_eq!(
        allocated(&claims, "fit-3").await?,
        [pool("gpu-0000-7f-00-0")]
    );

    // The cache goes: its class with it (no agent reports it here).
    for name in ["fit-1", "fit-2", "fit-3"] {
        pods.delete(name, &DeleteParams::default()).await?;
        claims.delete(name, &DeleteParams::default()).await?;
    }
    caches
        .delete("vector-add", &DeleteParams::default())
        .await?;
    eventually("the cache's class deleted with it", TIMEOUT, || async {
        Ok(classes.get_opt(&class).await?.is_none().then_some(()))
    })
    .await?;
    operator.abort();
    Ok(())
}
