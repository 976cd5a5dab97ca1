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
//! virt-launcher does, and the slices going when the plugin stops.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gkm_k8s_devices::node_tree::{NodeTree, Pci};
use gkm_testenv::{
    BUSYBOX_IMAGE, ControlPlane, RealNode, RealNodeOptions, Scheduler, running_pod_log,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(90);
const NODE: &str = "real-dra";
const NS: &str = "dra";
const DRIVER: &str = "gpu.gkm.io";
const H100_UUID: &str = "GPU-6e000000-1111-2222-3333-444444444444";
const A100_UUID: &str = "GPU-7f000000-1111-2222-3333-444444444444";
const H100: &str = "NVIDIA H100 SXM5 80GB";

/// A busybox pod (scheduled by kube-scheduler) whose container uses the
/// claim `claim`, printing its NVIDIA variable and which GPU device nodes it
/// has, then waiting.
fn claim_pod(name: &str, claim: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            // No node lifecycle controller runs to lift the node's
            // not-ready taint.
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c",
                    "tr '\\0' '\\n' < /proc/1/environ | grep -E '^NVIDIA_VISIBLE_DEVICES=' ; \
                     for d in /dev/nvidia*; do if [ -c $d ]; then echo CHAR-DEVICE $d; fi; done; \
                     echo DONE; exec sleep 100000"],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        }
    }))?)
}

const VGPU_UUID: &str = "0b1c5e8a-1111-4d2e-9c3a-000000000001";

/// A VM-shaped pod: its container uses claim `claim` (the pod's name for it
/// is `vm-gpu`, its request `request`) and prints the device metadata file
/// virt-launcher would read, then the VFIO nodes it has.
fn vm_pod(name: &str, claim: &str, request: &str) -> anyhow::Result<Pod> {
    let file = format!(
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/{claim}/{request}/{DRIVER}-metadata.json"
    );
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "vm-gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "compute",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", format!(
                    "cat {file}; echo END-METADATA; \
                     for d in /dev/vfio/*; do if [ -c $d ]; then echo CHAR-DEVICE $d; fi; done; \
                     echo DONE; exec sleep 100000")],
                "resources": {"claims": [{"name": "vm-gpu", "request": request}]},
            }],
        }
    }))?)
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
    let began = Instant::now();
    let selector = format!("spec.nodeName={NODE},spec.driver={DRIVER}");
    loop {
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
            return Ok(devices);
        }
        if began.elapsed() > TIMEOUT {
            anyhow::bail!("the node's slices hold {devices:?} after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The devices `claim`'s allocation names: (driver, pool, device).
async fn allocated(
    claims: &Api<ResourceClaim>,
    claim: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let claim = claims.get(claim).await?;
    Ok(claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.driver, r.pool, r.device))
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

fn device_class(name: &str, expression: &str) -> anyhow::Result<DeviceClass> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }))?)
}

/// Waits until `check` holds, or fails naming `what`.
async fn eventually<F: Fn() -> bool>(what: &str, check: F) -> anyhow::Result<()> {
    let began = Instant::now();
    while !check() {
        if began.elapsed() > TIMEOUT {
            anyhow::bail!("{what} after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_claims_a_gpu_of_a_named_model_and_keeps_it_across_plugin_and_kubelet_restarts()
-> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
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
    let classes: Api<DeviceClass> = Api::all(client.clone());

    // The plugin runs as its ServiceAccount with the chart's RBAC.
    let work = gkm_testenv::temp_dir()?;
    let kubeconfig = support::install(plane, work.path(), &["rbac/dra-plugin.yaml"]).await?;
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

    // A DeviceClass for H100s, one for any gkm GPU.
    let h100_class = format!(
        "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].productName == '{H100}'"
    );
    for (name, expression) in [
        ("gkm-h100", h100_class.as_str()),
        (
            "gkm-gpu",
            "device.driver == 'gpu.gkm.io' && device.attributes['gpu.gkm.io'].type == 'gpu'",
        ),
    ] {
        if classes.get_opt(name).await?.is_none() {
            classes
                .create(&PostParams::default(), &device_class(name, expression)?)
                .await?;
        }
    }
    claims
        .create(&PostParams::default(), &gpu_claim("h100", "gkm-h100")?)
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
    loop {
        let now = pool_generation(&slices).await?;
        if now.is_some_and(|g| before.is_some_and(|b| g > b)) {
            break;
        }
        if began.elapsed() > TIMEOUT {
            anyhow::bail!(
                "the pool is at generation {now:?}, not past {before:?}, after the kubelet restart"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
    eventually(
        "the first claim is not unprepared (its CDI spec is still there)",
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
    let devices = wait_slices(&slices, |d| d.len() == 4).await?;
    assert!(devices.contains_key("vfio-0000-2a-00-0"), "{devices:?}");
    assert!(
        devices.contains_key(&format!("vgpu-{VGPU_UUID}")),
        "{devices:?}"
    );
    assert!(
        !devices.contains_key("vfio-0000-4c-00-0"),
        "a group that is not viable is not published: {devices:?}"
    );
    for (class, kind) in [("gkm-passthrough", "vfio"), ("gkm-vgpu", "vgpu")] {
        let expression = format!(
            "device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        );
        if classes.get_opt(class).await?.is_none() {
            classes
                .create(&PostParams::default(), &device_class(class, &expression)?)
                .await?;
        }
    }
    for (claim, request, class, pod) in [
        ("pgpu", "pgpu", "gkm-passthrough", "vm-pgpu"),
        ("vgpu", "vgpu", "gkm-vgpu", "vm-vgpu"),
    ] {
        let mut object = gpu_claim(claim, class)?;
        if let Some(requests) = object
            .spec
            .devices
            .as_mut()
            .and_then(|d| d.requests.as_mut())
        {
            requests[0].name = request.to_string();
        }
        claims.create(&PostParams::default(), &object).await?;
        pods.create(&PostParams::default(), &vm_pod(pod, claim, request)?)
            .await?;
    }
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
    pods.delete("vm-pgpu", &DeleteParams::default()).await?;
    eventually(
        "the passthrough claim's metadata file is not removed",
        || !host_file.exists(),
    )
    .await?;
    pods.delete("vm-vgpu", &DeleteParams::default()).await?;

    // The plugin stops for good: its slices go with it.
    plugin.stop(Duration::from_secs(10));
    wait_slices(&slices, |d| d.is_empty()).await?;
    pods.delete("second", &DeleteParams::default()).await?;
    drop(scheduler);
    Ok(())
}
