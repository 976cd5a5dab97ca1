//! The pure decisions against a simulated node (`gkm_k8s_devices::node_tree`): what is
//! published, what a claim's container gets, and what survives a restart.

use std::path::Path;
use std::time::Duration;

use gkm_gpu::PciIdsSource;
use gkm_gpu::pci_ids::PciIds;
use gkm_k8s_devices::node_tree::{EXAMPLE_VGPUS, NodeTree, Pci};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;

use crate::cdi::{self, CdiSpec};
use crate::checkpoint::ClaimStore;
use crate::devices::NodeDevices;
use crate::prepare::{PrepareContext, PrepareError, prepare};
use crate::slices::{MAX_DEVICES_PER_SLICE, PoolOwner, pool_slices, still_published};
use crate::{DRIVER, DraConfig, look};

const NODE: &str = "node-a";
const H100_UUID: &str = "GPU-6e000000-1111-2222-3333-444444444444";

/// The simulated example node (two H100s and an A100 on vfio-pci, an
/// H100 in a group that is not viable, two T4 vGPUs) plus an H100 on
/// `nvidia` and an MI300X on `amdgpu`.
fn example_node(root: &Path) -> (NodeTree, NodeDevices) {
    let tree = NodeTree::new(&root.join("node")).unwrap();
    tree.example().unwrap();
    tree.pci(
        &Pci::gpu("0000:6e:00.0", 0x10de, 0x2330)
            .driver("nvidia")
            .numa(0),
    )
    .unwrap();
    tree.nvidia_gpu("0000:6e:00.0", H100_UUID, 0).unwrap();
    tree.dev_node("nvidia-uvm").unwrap();
    tree.pci(&Pci::gpu("0000:8a:00.0", 0x1002, 0x74a1).driver("amdgpu"))
        .unwrap();
    let drm = tree
        .paths()
        .sysfs_root
        .join("devices/pci0000:00/0000:8a:00.0/drm/renderD128");
    std::fs::create_dir_all(drm).unwrap();
    tree.dev_node("kfd").unwrap();
    tree.dev_node("dri/renderD128").unwrap();
    let config = config(&tree, root);
    let ids = PciIds::open(&config.pci_ids).unwrap();
    let devices = look(&config, &ids).unwrap();
    (tree, devices)
}

fn config(tree: &NodeTree, root: &Path) -> DraConfig {
    DraConfig {
        paths: tree.paths().clone(),
        kubelet_dir: root.join("kubelet"),
        cdi_dir: root.join("cdi"),
        state_dir: root.join("state"),
        pci_ids: PciIdsSource::Bundled,
        poll: Duration::from_secs(1),
        nvml: false,
        node_name: NODE.to_string(),
    }
}

fn slice_yaml(devices: &NodeDevices) -> serde_json::Value {
    let owner = PoolOwner {
        node: NODE,
        node_uid: "6f0c6a3e-0000-4000-8000-000000000001",
    };
    serde_json::to_value(pool_slices(DRIVER, &owner, 1, &devices.devices)).unwrap()
}

#[test]
fn the_example_node_publishes_its_gpus_vfio_devices_and_vgpus() {
    let dir = tempfile::tempdir().unwrap();
    let (_tree, devices) = example_node(dir.path());
    let names: Vec<&str> = devices.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0000-6e-00-0",
            "gpu-0000-8a-00-0",
            "vfio-0000-18-00-0",
            "vfio-0000-2a-00-0",
            "vfio-0000-3b-00-0",
            "vgpu-0b1c5e8a-1111-4d2e-9c3a-000000000001",
            "vgpu-0b1c5e8a-1111-4d2e-9c3a-000000000002",
        ]
    );
    // The H100 in the group that is not viable is left out, with why.
    let reason = devices
        .excluded
        .iter()
        .find(|e| e.device == "0000:4c:00.0")
        .map(|e| e.reason.as_str())
        .unwrap_or_default();
    assert!(reason.contains("IOMMU group 13 is not viable"), "{reason}");
    // Paths under the temporary directory are not in the slice.
    let slices = slice_yaml(&devices);
    insta::assert_yaml_snapshot!("example_node_slice", slices);
}

#[test]
fn a_gpu_publishes_its_uuid_once_and_none_when_no_uuid_is_known() {
    let dir = tempfile::tempdir().unwrap();
    let (_tree, devices) = example_node(dir.path());
    let h100 = devices.device("gpu-0000-6e-00-0").expect("the H100");
    assert_eq!(
        h100.attributes["uuid"].string.as_deref(),
        Some(H100_UUID),
        "{:?}",
        h100.attributes
    );
    // An NVIDIA GPU the driver says nothing about: named by its PCI
    // address, with no UUID attribute rather than the address as one.
    let tree = NodeTree::new(&dir.path().join("bare")).unwrap();
    tree.pci(&Pci::gpu("0000:6e:00.0", 0x10de, 0x2330).driver("nvidia"))
        .unwrap();
    let config = config(&tree, &dir.path().join("bare"));
    let devices = look(&config, &PciIds::open(&config.pci_ids).unwrap()).unwrap();
    let gpu = devices.device("gpu-0000-6e-00-0").expect("the GPU");
    assert_eq!(gpu.id, "0000:6e:00.0");
    assert!(!gpu.attributes.contains_key("uuid"), "{:?}", gpu.attributes);
}

#[test]
fn a_missing_group_node_unpublishes_the_device_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, _) = example_node(dir.path());
    tree.remove_group_node(10).unwrap();
    let config = config(&tree, dir.path());
    let devices = look(&config, &PciIds::open(&config.pci_ids).unwrap()).unwrap();
    assert!(devices.device("vfio-0000-18-00-0").is_none());
    assert!(
        devices
            .excluded
            .iter()
            .any(|e| e.device == "0000:18:00.0" && e.reason.contains("vfio/10 is missing")),
        "{:?}",
        devices.excluded
    );
}

#[test]
fn a_published_device_that_goes_is_reported_unhealthy_with_the_reason() {
    use crate::health::Known;
    let dir = tempfile::tempdir().unwrap();
    let (tree, before) = example_node(dir.path());
    let mut known = Known::default();
    known.learn(&before);
    assert!(known.health(&before).iter().all(|h| h.healthy));
    tree.remove_group_node(10).unwrap();
    tree.remove_mdev(EXAMPLE_VGPUS[1].0).unwrap();
    let config = config(&tree, dir.path());
    let after = look(&config, &PciIds::open(&config.pci_ids).unwrap()).unwrap();
    known.learn(&after);
    let unhealthy: Vec<(String, String)> = known
        .health(&after)
        .into_iter()
        .filter(|h| !h.healthy)
        .map(|h| (h.device, h.message))
        .collect();
    assert_eq!(unhealthy.len(), 2, "{unhealthy:?}");
    assert_eq!(unhealthy[0].0, "vfio-0000-18-00-0");
    assert!(
        unhealthy[0].1.contains("vfio/10 is missing"),
        "{unhealthy:?}"
    );
    assert_eq!(unhealthy[1].0, format!("vgpu-{}", EXAMPLE_VGPUS[1].0));
    assert_eq!(
        unhealthy[1].1,
        format!("{} is no longer on the node", EXAMPLE_VGPUS[1].0)
    );
    // A critical XID on the H100 (as NVML reports it): unhealthy too.
    let mut inputs = gkm_k8s_devices::resources::ScanInputs::default();
    let xid = gkm_gpu::nvidia::XidEvent {
        pci_address: Some("0000:6e:00.0".to_string()),
        xid: Some(79),
    };
    assert!(inputs.record_xid(&xid, []));
    let ignored = gkm_gpu::nvidia::XidEvent {
        pci_address: Some("0000:6e:00.0".to_string()),
        xid: Some(43),
    };
    assert!(!inputs.record_xid(&ignored, []), "an application's fault");
    let xid_seen =
        crate::look_with(&config, &PciIds::open(&config.pci_ids).unwrap(), &inputs).unwrap();
    assert!(xid_seen.device("gpu-0000-6e-00-0").is_none());
    let h100 = known
        .health(&xid_seen)
        .into_iter()
        .find(|h| h.device == "gpu-0000-6e-00-0")
        .unwrap();
    assert!(!h100.healthy);
    assert!(h100.message.contains("XID 79"), "{}", h100.message);

    // It comes back: healthy again.
    tree.group_node(10).unwrap();
    let back = look(&config, &PciIds::open(&config.pci_ids).unwrap()).unwrap();
    assert!(
        known
            .health(&back)
            .iter()
            .any(|h| h.device == "vfio-0000-18-00-0" && h.healthy)
    );
}

#[test]
fn large_pools_are_split_into_slices_of_at_most_128_devices() {
    let dir = tempfile::tempdir().unwrap();
    let (_tree, devices) = example_node(dir.path());
    let many: Vec<_> = (0..300)
        .map(|i| {
            let mut d = devices.devices[0].clone();
            d.name = format!("gpu-{i}");
            d
        })
        .collect();
    let owner = PoolOwner {
        node: NODE,
        node_uid: "uid",
    };
    let slices = pool_slices(DRIVER, &owner, 7, &many);
    assert_eq!(slices.len(), 3);
    for slice in &slices {
        assert_eq!(slice.spec.pool.resource_slice_count, 3);
        assert_eq!(slice.spec.pool.generation, 7);
        assert_eq!(slice.spec.pool.name, NODE);
        assert!(slice.spec.devices.as_ref().unwrap().len() <= MAX_DEVICES_PER_SLICE);
    }
    assert!(still_published(&slices, &slices, 7));
    assert!(!still_published(&slices, &slices, 8));
    assert!(!still_published(&slices[..2], &slices, 7));
    // No devices: one empty slice says the pool is empty.
    let empty = pool_slices(DRIVER, &owner, 1, &[]);
    assert_eq!(empty.len(), 1);
    assert_eq!(empty[0].spec.devices.as_deref(), Some(&[][..]));
}

#[test]
fn slices_of_very_long_node_names_still_have_valid_distinct_names() {
    use crate::slices::slice_name;
    assert_eq!(slice_name("node-a", DRIVER, 0), "node-a-gpu.gkm.io-0");
    let long_a = format!("{}.a", "n".repeat(250));
    let long_b = format!("{}.b", "n".repeat(250));
    let (a, b) = (
        slice_name(&long_a, DRIVER, 1),
        slice_name(&long_b, DRIVER, 1),
    );
    assert!(a.len() <= 253 && b.len() <= 253, "{a} {b}");
    assert_ne!(a, b);
    assert!(a.ends_with("-gpu.gkm.io-1"), "{a}");
    assert_eq!(a, slice_name(&long_a, DRIVER, 1), "stable");
}

/// A claim allocated `results` (request, driver, pool, device).
fn claim(uid: &str, results: &[(&str, &str, &str, &str)]) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(request, driver, pool, device)| {
            json!({"request": request, "driver": driver, "pool": pool, "device": device})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": "gpu", "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gkm-gpu"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .unwrap()
}

fn prepare_in(
    devices: &NodeDevices,
    dev_root: &Path,
    uid: &str,
    claim: &ResourceClaim,
) -> Result<crate::prepare::PreparedClaim, PrepareError> {
    let present = |rel: &str| dev_root.join(rel).exists();
    prepare(
        uid,
        claim,
        &PrepareContext {
            driver: DRIVER,
            pool: NODE,
            devices,
            dev_root,
            present: &present,
            metadata_dir: &metadata_dir(dev_root),
        },
    )
}

/// Where [`prepare_in`] puts metadata files: the example tree's
/// `state/dra-device-metadata`, as the plugin's state directory would.
fn metadata_dir(dev_root: &Path) -> std::path::PathBuf {
    dev_root
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("state")
        .join(crate::metadata::HOST_SUBDIR)
}

/// The spec with the node's `/dev` root shown as `/host/dev`, and the
/// metadata directory as `/host/meta`.
fn spec_json(spec: &CdiSpec, dev_root: &Path) -> serde_json::Value {
    let text = serde_json::to_string(spec)
        .unwrap()
        .replace(&dev_root.display().to_string(), "/host/dev")
        .replace(&metadata_dir(dev_root).display().to_string(), "/host/meta");
    serde_json::from_str(&text).unwrap()
}

#[test]
fn an_nvidia_gpu_claim_gets_its_device_node_the_shared_nodes_and_its_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    let uid = "c1a1m000-0000-4000-8000-000000000001";
    let prepared = prepare_in(
        &devices,
        dev_root,
        uid,
        &claim(
            uid,
            &[
                ("gpu", DRIVER, NODE, "gpu-0000-6e-00-0"),
                ("nic", "nic.example.com", NODE, "eth0"),
            ],
        ),
    )
    .unwrap();
    assert_eq!(
        prepared.devices.len(),
        1,
        "other drivers' devices are theirs"
    );
    assert_eq!(
        prepared.devices[0].cdi_device_ids,
        [
            format!("gkm.io/gpu={uid}-gpu-0000-6e-00-0"),
            format!("gkm.io/gpu={uid}-metadata-gpu")
        ]
    );
    assert_eq!(
        spec_json(&prepared.spec, dev_root),
        json!({
            "cdiVersion": "0.5.0",
            "kind": "gkm.io/gpu",
            "devices": [{
                "name": format!("{uid}-gpu-0000-6e-00-0"),
                "containerEdits": {"deviceNodes": [
                    {"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0", "permissions": "rw"},
                ]},
            }, {
                "name": format!("{uid}-metadata-gpu"),
                "containerEdits": {"mounts": [{
                    "hostPath": "/host/meta/ml_gpu/gpu/metadata.json",
                    "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu/gpu/gpu.gkm.io-metadata.json",
                    "options": ["ro", "bind"],
                }]},
            }],
            "containerEdits": {
                "env": [format!("NVIDIA_VISIBLE_DEVICES={H100_UUID}")],
                // nvidia-uvm-tools does not exist on this node: left out.
                "deviceNodes": [
                    {"path": "/dev/nvidiactl", "hostPath": "/host/dev/nvidiactl", "permissions": "rw"},
                    {"path": "/dev/nvidia-uvm", "hostPath": "/host/dev/nvidia-uvm", "permissions": "rw"},
                ],
            },
        })
    );
}

#[test]
fn amd_vfio_and_vgpu_claims_get_their_nodes_and_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    let uid = "c1a1m000-0000-4000-8000-000000000002";
    let prepared = prepare_in(
        &devices,
        dev_root,
        uid,
        &claim(
            uid,
            &[
                ("amd", DRIVER, NODE, "gpu-0000-8a-00-0"),
                ("vm", DRIVER, NODE, "vfio-0000-2a-00-0"),
                (
                    "vgpu",
                    DRIVER,
                    NODE,
                    &format!("vgpu-{}", EXAMPLE_VGPUS[1].0),
                ),
            ],
        ),
    )
    .unwrap();
    let spec = spec_json(&prepared.spec, dev_root);
    let nodes = |v: &serde_json::Value| -> Vec<String> {
        v["containerEdits"]["deviceNodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| {
                format!(
                    "{} <- {}",
                    n["path"].as_str().unwrap(),
                    n["hostPath"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        nodes(&spec["devices"][0]),
        ["/dev/dri/renderD128 <- /host/dev/dri/renderD128"]
    );
    assert_eq!(
        nodes(&spec["devices"][1]),
        ["/dev/vfio/11 <- /host/dev/vfio/11"]
    );
    assert_eq!(
        nodes(&spec["devices"][2]),
        ["/dev/vfio/31 <- /host/dev/vfio/31"]
    );
    assert_eq!(
        nodes(&spec),
        [
            "/dev/kfd <- /host/dev/kfd",
            "/dev/vfio/vfio <- /host/dev/vfio/vfio"
        ]
    );
    assert_eq!(
        spec["containerEdits"]["env"],
        json!([
            "GKM_VFIO_DEVICES=0000:2a:00.0",
            format!("GKM_MDEV_UUIDS={}", EXAMPLE_VGPUS[1].0)
        ])
    );
}

/// The metadata file of `request` a prepared claim lists, as a JSON value.
fn metadata_of(prepared: &crate::prepare::PreparedClaim, request: &str) -> serde_json::Value {
    let file = prepared
        .metadata
        .iter()
        .find(|f| f.request == request)
        .unwrap_or_else(|| panic!("no metadata for request {request}"));
    serde_json::from_slice(&file.bytes().unwrap()).unwrap()
}

#[test]
fn vm_claims_get_metadata_with_the_pci_address_or_the_mdev_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    let uid = "c1a1m000-0000-4000-8000-000000000005";
    let vgpu = format!("vgpu-{}", EXAMPLE_VGPUS[0].0);
    let mut vm = claim(
        uid,
        &[
            ("pgpu", DRIVER, NODE, "vfio-0000-2a-00-0"),
            ("vgpu/t4", DRIVER, NODE, &vgpu),
        ],
    );
    // Made from a template: the pod's name for it names the file.
    vm.metadata.annotations = Some(
        [(
            crate::metadata::POD_CLAIM_NAME_ANNOTATION.to_string(),
            "vm-gpus".to_string(),
        )]
        .into(),
    );
    let prepared = prepare_in(&devices, dev_root, uid, &vm).unwrap();
    let pgpu = metadata_of(&prepared, "pgpu");
    assert_eq!(pgpu["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(pgpu["kind"], "DeviceMetadata");
    assert_eq!(
        pgpu["metadata"],
        json!({"name": "gpu", "namespace": "ml", "uid": uid, "generation": 1})
    );
    assert_eq!(pgpu["podClaimName"], "vm-gpus");
    let device = &pgpu["requests"][0]["devices"][0];
    assert_eq!(pgpu["requests"][0]["name"], "pgpu");
    assert_eq!(
        (&device["driver"], &device["pool"], &device["name"]),
        (&json!(DRIVER), &json!(NODE), &json!("vfio-0000-2a-00-0"))
    );
    assert_eq!(
        device["attributes"]["resource.kubernetes.io/pciBusID"],
        json!({"string": "0000:2a:00.0"})
    );
    let vgpu_meta = metadata_of(&prepared, "vgpu");
    assert_eq!(vgpu_meta["requests"][0]["name"], "vgpu/t4");
    assert_eq!(
        vgpu_meta["requests"][0]["devices"][0]["attributes"]["mdevUUID"],
        json!({"string": EXAMPLE_VGPUS[0].0})
    );
    let paths: Vec<&str> = prepared
        .metadata
        .iter()
        .map(|f| f.container_path.as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/vm-gpus/pgpu/gpu.gkm.io-metadata.json",
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/vm-gpus/vgpu/gpu.gkm.io-metadata.json",
        ]
    );
    // Each request's file comes with its own device.
    assert_eq!(
        prepared.devices[1].cdi_device_ids[1],
        format!("gkm.io/gpu={uid}-metadata-vgpu")
    );

    // The store writes the files, keeps them across a restart, and removes
    // them with the claim.
    let (state, cdi_dir) = (dir.path().join("state"), dir.path().join("cdi"));
    let mut store = ClaimStore::open(&state, &cdi_dir).unwrap();
    store.insert(uid, prepared.clone()).unwrap();
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&prepared.metadata[0].host_path).unwrap()).unwrap();
    assert_eq!(on_disk, pgpu);
    drop(store);
    std::fs::remove_file(&prepared.metadata[1].host_path).unwrap();
    let stray = metadata_dir(dev_root).join("ml_gone");
    std::fs::create_dir_all(&stray).unwrap();
    let mut store = ClaimStore::open(&state, &cdi_dir).unwrap();
    assert!(prepared.metadata[1].host_path.exists(), "rewritten");
    assert!(!stray.exists(), "a claim not prepared keeps no metadata");
    store.remove(uid).unwrap();
    assert!(!prepared.metadata[0].host_path.exists());
    assert_eq!(
        std::fs::read_dir(metadata_dir(dev_root)).unwrap().count(),
        0
    );
}

#[test]
fn a_claim_taking_part_of_an_iommu_group_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, mut devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    // Two GPUs sharing IOMMU group 11.
    for (name, peer) in [
        ("vfio-0000-2a-00-0", "0000:18:00.0"),
        ("vfio-0000-18-00-0", "0000:2a:00.0"),
    ] {
        let device = devices.devices.iter_mut().find(|d| d.name == name).unwrap();
        if let gkm_k8s_devices::resources::Access::Vfio {
            iommu_group,
            group_peers,
            ..
        } = &mut device.access
        {
            *iommu_group = 11;
            *group_peers = vec![peer.to_string()];
        }
    }
    let uid = "c1a1m000-0000-4000-8000-000000000006";
    let half = claim(uid, &[("pgpu", DRIVER, NODE, "vfio-0000-2a-00-0")]);
    assert_eq!(
        prepare_in(&devices, dev_root, uid, &half)
            .unwrap_err()
            .to_string(),
        "ResourceClaim ml/gpu was allocated 0000:2a:00.0, which shares IOMMU group 11 with 0000:18:00.0; a group goes to one VM whole, so the claim must ask for all of them (for example with a matchAttribute constraint on gpu.gkm.io/iommuGroup)"
    );
    let whole = claim(
        uid,
        &[
            ("pgpu", DRIVER, NODE, "vfio-0000-2a-00-0"),
            ("pgpu", DRIVER, NODE, "vfio-0000-18-00-0"),
        ],
    );
    let prepared = prepare_in(&devices, dev_root, uid, &whole).unwrap();
    assert_eq!(
        metadata_of(&prepared, "pgpu")["requests"][0]["devices"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_claim_the_node_cannot_prepare_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    let uid = "c1a1m000-0000-4000-8000-000000000003";
    let gone = claim(uid, &[("gpu", DRIVER, NODE, "vfio-0000-4c-00-0")]);
    let err = prepare_in(&devices, dev_root, uid, &gone).unwrap_err();
    assert_eq!(
        err.to_string(),
        "ResourceClaim ml/gpu was allocated node-a/vfio-0000-4c-00-0, which this node does not have (or no longer has healthy)"
    );
    let other_pool = claim(uid, &[("gpu", DRIVER, "node-b", "gpu-0000-6e-00-0")]);
    assert!(matches!(
        prepare_in(&devices, dev_root, uid, &other_pool),
        Err(PrepareError::UnknownDevice { .. })
    ));
    let recreated = claim("another-uid", &[("gpu", DRIVER, NODE, "gpu-0000-6e-00-0")]);
    assert!(matches!(
        prepare_in(&devices, dev_root, uid, &recreated),
        Err(PrepareError::OtherClaim { .. })
    ));
    let mut pending = claim(uid, &[]);
    pending.status = None;
    assert_eq!(
        prepare_in(&devices, dev_root, uid, &pending)
            .unwrap_err()
            .to_string(),
        "ResourceClaim ml/gpu is not allocated"
    );
}

#[test]
fn prepared_claims_and_their_specs_survive_a_restart_and_strays_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (tree, devices) = example_node(dir.path());
    let dev_root = &tree.paths().dev_root;
    let (state, cdi_dir) = (dir.path().join("state"), dir.path().join("cdi"));
    let uid = "c1a1m000-0000-4000-8000-000000000004";
    let prepared = prepare_in(
        &devices,
        dev_root,
        uid,
        &claim(uid, &[("gpu", DRIVER, NODE, "gpu-0000-6e-00-0")]),
    )
    .unwrap();
    let mut store = ClaimStore::open(&state, &cdi_dir).unwrap();
    store.insert(uid, prepared.clone()).unwrap();
    let spec_file = cdi_dir.join(cdi::spec_file_name(uid));
    let written: CdiSpec = serde_json::from_slice(&std::fs::read(&spec_file).unwrap()).unwrap();
    assert_eq!(written, prepared.spec);
    drop(store);

    // A restart: the claim is still prepared. A lost spec is written again;
    // a spec of a claim not prepared (a crash between the two writes) goes.
    std::fs::remove_file(&spec_file).unwrap();
    let stray = cdi_dir.join(cdi::spec_file_name("stray-uid"));
    std::fs::write(&stray, "{}").unwrap();
    let other = cdi_dir.join("nvidia.com-gpu.json");
    std::fs::write(&other, "{}").unwrap();
    let mut store = ClaimStore::open(&state, &cdi_dir).unwrap();
    assert_eq!(store.get(uid), Some(&prepared));
    assert!(spec_file.exists());
    assert!(!stray.exists());
    assert!(
        other.exists(),
        "other drivers' specs are not ours to remove"
    );

    store.remove(uid).unwrap();
    store.remove(uid).unwrap();
    assert!(!spec_file.exists());
    let store = ClaimStore::open(&state, &cdi_dir).unwrap();
    assert_eq!(store.uids().count(), 0);
    // No temporary files are left behind.
    let left: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut left: Vec<_> = left.into_iter().map(|n| n.into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["dra-device-metadata", "prepared-claims.json"]);
}

#[test]
fn a_damaged_checkpoint_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("prepared-claims.json"), "{not json").unwrap();
    let err = ClaimStore::open(&state, &dir.path().join("cdi")).unwrap_err();
    assert!(
        err.to_string()
            .contains("prepared-claims.json: not a prepared-claims checkpoint"),
        "{err}"
    );
}

#[test]
fn driver_versions_memory_and_compute_capability_are_typed_attributes() {
    use gkm_k8s_devices::resources::{ScanInputs, from_inventory};
    let dir = tempfile::tempdir().unwrap();
    let (tree, _) = example_node(dir.path());
    let mut inventory = gkm_gpu::discover(&gkm_gpu::DiscoveryOptions {
        sysfs_root: tree.paths().sysfs_root.clone(),
        nvml: false,
        simulate: None,
        pci_ids: PciIdsSource::Bundled,
    })
    .unwrap();
    // What NVML reports on a real node.
    let gpu = inventory
        .gpus
        .iter_mut()
        .find(|g| g.pci_address.as_deref() == Some("0000:6e:00.0"))
        .unwrap();
    gpu.driver_version = Some("580.65.06".into());
    gpu.toolkit_version = Some("13.0".into());
    gpu.memory_bytes = Some(85_520_809_984);
    let ids = PciIds::open(&PciIdsSource::Bundled).unwrap();
    let snapshot = from_inventory(
        tree.paths(),
        &ids,
        &ScanInputs::default(),
        inventory.clone(),
    );
    let devices = crate::devices::node_devices(&inventory, &snapshot, &Default::default());
    let h100 = devices.device("gpu-0000-6e-00-0").unwrap();
    let version = |k: &str| h100.attributes[k].version.clone();
    assert_eq!(version("driverVersion").as_deref(), Some("580.65.6"));
    assert_eq!(version("toolkitVersion").as_deref(), Some("13.0.0"));
    assert_eq!(version("computeCapability").as_deref(), Some("9.0.0"));
    let owner = PoolOwner {
        node: NODE,
        node_uid: "uid",
    };
    let slice = &pool_slices(DRIVER, &owner, 1, &devices.devices)[0];
    let device = &slice.spec.devices.as_ref().unwrap()[0];
    assert_eq!(
        device.capacity.as_ref().unwrap()["memory"].value.0,
        "85520809984"
    );
}
