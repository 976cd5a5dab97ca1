//! The plugin's decisions over trees the tests make: which devices form which
//! resource, group viability, allocation answers and preferences.

use std::collections::BTreeMap;

use gkm_core::assignment::GpuDevice;
use gkm_gpu::pci_ids::PciIds;

use super::allocate::{AllocateOptions, allocate};
use super::node_gpus::node_gpus;
use super::node_tree::{NodeTree, Pci};
use super::preferred::{Request, preferred};
use super::resources::{Resource, ScanInputs, Snapshot, scan};
use crate::proto::ContainerAllocateResponse;

const NV: u16 = 0x10de;
const H100: &str = "nvidia.com/GH100_H100_SXM5_80GB";
const A100: &str = "nvidia.com/GA100_A100_PCIE_80GB";
const T4_2Q: &str = "nvidia.com/GRID_T4-2Q";

fn look(tree: &NodeTree) -> Snapshot {
    scan(tree.paths(), &PciIds::bundled(), &ScanInputs::default()).expect("scan")
}

fn counts(snapshot: &Snapshot) -> BTreeMap<&str, (usize, usize)> {
    snapshot
        .resources
        .iter()
        .map(|(name, r)| (name.as_str(), (r.devices.len(), r.healthy())))
        .collect()
}

fn options(tree: &NodeTree, nvidia_cdi: bool) -> AllocateOptions {
    AllocateOptions {
        dev_root: tree.paths().dev_root.clone(),
        nvidia_cdi,
    }
}

fn container_paths(answer: &ContainerAllocateResponse) -> Vec<&str> {
    answer
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect()
}

fn ids(resource: &Resource) -> Vec<&str> {
    resource.devices.iter().map(|d| d.id.as_str()).collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The example node: two H100s, an A100, an H100 in a group that is not
/// viable, and two T4-2Q vGPUs on a T4.
fn mixed_node(dir: &std::path::Path) -> NodeTree {
    let tree = NodeTree::new(dir).expect("tree");
    tree.example().expect("example node");
    tree
}

#[test]
fn a_mixed_node_offers_one_resource_per_model_and_vgpu_type() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    let snapshot = look(&tree);
    assert_eq!(
        counts(&snapshot),
        BTreeMap::from([(A100, (1, 1)), (H100, (2, 2)), (T4_2Q, (2, 2))])
    );
    assert_eq!(
        ids(&snapshot.resources[H100]),
        ["0000:18:00.0", "0000:2a:00.0"]
    );
    assert_eq!(
        ids(&snapshot.resources[T4_2Q]),
        [
            "0b1c5e8a-1111-4d2e-9c3a-000000000001",
            "0b1c5e8a-1111-4d2e-9c3a-000000000002"
        ]
    );
    // The H100 in the non-viable group and the T4 hosting vGPUs are not
    // offered, each with its reason.
    let excluded: BTreeMap<&str, &str> = snapshot
        .excluded
        .iter()
        .map(|e| (e.device.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(excluded.len(), 2, "{excluded:?}");
    assert_eq!(
        excluded["0000:4c:00.0"],
        "IOMMU group 13 is not viable: 0000:4c:00.1 (AD102 High Definition Audio Controller) on \
         snd_hda_intel must be bound to vfio-pci (or unbound) before 0000:4c:00.0 can be passed through"
    );
    assert!(excluded["0000:5d:00.0"].contains("hosts vGPUs"));
    assert!(!snapshot.resources.contains_key("nvidia.com/gpu"));
}

#[test]
fn the_gpus_own_audio_function_on_vfio_keeps_the_group_viable() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    tree.bind("0000:4c:00.1", Some("vfio-pci")).expect("bind");
    let snapshot = look(&tree);
    assert_eq!(counts(&snapshot)[H100], (3, 3));
    assert!(snapshot.excluded.iter().all(|e| e.device != "0000:4c:00.0"));
    // No driver at all is fine too (the kernel allows it)…
    tree.bind("0000:4c:00.1", None).expect("unbind");
    assert_eq!(counts(&look(&tree))[H100], (3, 3));
    // …and so is pci-stub; the audio function is never a resource itself.
    tree.bind("0000:4c:00.1", Some("pci-stub")).expect("stub");
    let snapshot = look(&tree);
    assert_eq!(counts(&snapshot)[H100], (3, 3));
    assert!(
        snapshot
            .resources
            .values()
            .all(|r| r.device("0000:4c:00.1").is_none())
    );
}

#[test]
fn a_missing_group_node_makes_the_device_unhealthy_until_it_returns() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    tree.remove_group_node(11).expect("rm");
    tree.remove_group_node(30).expect("rm");
    let snapshot = look(&tree);
    assert_eq!(counts(&snapshot)[H100], (2, 1));
    assert_eq!(counts(&snapshot)[T4_2Q], (2, 1));
    let dev = snapshot.resources[H100]
        .device("0000:2a:00.0")
        .expect("dev");
    assert!(
        dev.unhealthy
            .as_deref()
            .is_some_and(|r| r.ends_with("dev/vfio/11 is missing"))
    );
    tree.group_node(11).expect("back");
    assert_eq!(counts(&look(&tree))[H100], (2, 2));
}

#[test]
fn vgpus_created_and_removed_later_are_seen_on_the_next_look() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    tree.mdev(
        "0b1c5e8a-1111-4d2e-9c3a-000000000003",
        "0000:5d:00.0",
        "nvidia-223",
        "GRID T4-4Q",
        32,
    )
    .expect("mdev");
    tree.remove_mdev("0b1c5e8a-1111-4d2e-9c3a-000000000001")
        .expect("rm");
    let snapshot = look(&tree);
    assert_eq!(counts(&snapshot)[T4_2Q], (1, 1));
    assert_eq!(counts(&snapshot)["nvidia.com/GRID_T4-4Q"], (1, 1));
}

#[test]
fn gpus_sharing_a_group_go_together_and_mixed_model_groups_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = NodeTree::new(dir.path()).expect("tree");
    for addr in ["0000:18:00.0", "0000:19:00.0"] {
        tree.pci(&Pci::gpu(addr, NV, 0x2330).driver("vfio-pci").group(7))
            .expect("pci");
    }
    tree.pci(
        &Pci::gpu("0000:20:00.0", NV, 0x2330)
            .driver("vfio-pci")
            .group(8),
    )
    .expect("pci");
    tree.pci(
        &Pci::gpu("0000:30:00.0", NV, 0x2330)
            .driver("vfio-pci")
            .group(9),
    )
    .expect("pci");
    tree.pci(
        &Pci::gpu("0000:31:00.0", NV, 0x20b5)
            .driver("vfio-pci")
            .group(9),
    )
    .expect("pci");
    for g in [7, 8, 9] {
        tree.group_node(g).expect("node");
    }
    let snapshot = look(&tree);
    let h100 = &snapshot.resources[H100];
    assert_eq!(ids(h100), ["0000:18:00.0", "0000:19:00.0", "0000:20:00.0"]);
    assert!(!snapshot.resources.contains_key(A100));
    assert_eq!(snapshot.excluded.len(), 2);
    assert!(
        snapshot.excluded[0]
            .reason
            .contains("holds GPUs of different models")
    );

    let opts = options(&tree, false);
    let refused = allocate(h100, &strings(&["0000:18:00.0"]), &opts).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused
            .message()
            .contains("shares IOMMU group 7 with 0000:19:00.0"),
        "{}",
        refused.message()
    );
    let both = allocate(h100, &strings(&["0000:18:00.0", "0000:19:00.0"]), &opts).expect("ok");
    let paths = container_paths(&both);
    assert_eq!(paths, ["/dev/vfio/vfio", "/dev/vfio/7"]);

    // Preferences keep groups whole: one device asked, the lone group; two
    // asked, the shared group rather than a split.
    let available = strings(&["0000:18:00.0", "0000:19:00.0", "0000:20:00.0"]);
    let ask = |size| Request {
        available: &available,
        must_include: &[],
        size,
    };
    assert_eq!(preferred(h100, ask(1), None), ["0000:20:00.0"]);
    assert_eq!(
        preferred(h100, ask(2), None),
        ["0000:18:00.0", "0000:19:00.0"]
    );
    let must = strings(&["0000:19:00.0"]);
    let with_must = Request {
        available: &available,
        must_include: &must,
        size: 2,
    };
    assert_eq!(
        preferred(h100, with_must, None),
        ["0000:18:00.0", "0000:19:00.0"]
    );
}

#[test]
fn passthrough_allocation_names_the_addresses_and_group_nodes() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    let snapshot = look(&tree);
    let dev_root = tree.paths().dev_root.clone();
    let opts = options(&tree, false);
    let answer = allocate(
        &snapshot.resources[H100],
        &strings(&["0000:2a:00.0", "0000:18:00.0"]),
        &opts,
    )
    .expect("allocate");
    assert_eq!(
        answer.envs,
        std::collections::HashMap::from([(
            "PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB".to_string(),
            "0000:2a:00.0,0000:18:00.0".to_string()
        )])
    );
    let specs: Vec<(String, String)> = answer
        .devices
        .iter()
        .map(|d| (d.container_path.clone(), d.host_path.clone()))
        .collect();
    let host = |rel: &str| dev_root.join(rel).display().to_string();
    assert_eq!(
        specs,
        [
            ("/dev/vfio/vfio".to_string(), host("vfio/vfio")),
            ("/dev/vfio/11".to_string(), host("vfio/11")),
            ("/dev/vfio/10".to_string(), host("vfio/10")),
        ]
    );
    assert!(answer.devices.iter().all(|d| d.permissions == "rw"));

    let vgpu = allocate(
        &snapshot.resources[T4_2Q],
        &strings(&["0b1c5e8a-1111-4d2e-9c3a-000000000002"]),
        &opts,
    )
    .expect("vgpu");
    assert_eq!(
        vgpu.envs["MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q"],
        "0b1c5e8a-1111-4d2e-9c3a-000000000002"
    );
    let paths = container_paths(&vgpu);
    assert_eq!(paths, ["/dev/vfio/vfio", "/dev/vfio/31"]);

    let unknown = allocate(
        &snapshot.resources[H100],
        &strings(&["0000:3b:00.0"]),
        &opts,
    )
    .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        unknown.message(),
        format!("{H100}: unknown device 0000:3b:00.0")
    );
}

#[test]
fn with_iommufd_the_cdevs_and_dev_iommu_are_handed_over() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    tree.bind("0000:4c:00.1", Some("vfio-pci")).expect("bind");
    tree.iommufd_cdev("0000:4c:00.0", 4).expect("cdev");
    tree.iommufd_cdev("0000:4c:00.1", 5).expect("cdev");
    let snapshot = look(&tree);
    let opts = options(&tree, false);
    let answer = allocate(
        &snapshot.resources[H100],
        &strings(&["0000:4c:00.0"]),
        &opts,
    )
    .expect("ok");
    let paths = container_paths(&answer);
    assert_eq!(
        paths,
        [
            "/dev/vfio/vfio",
            "/dev/iommu",
            "/dev/vfio/13",
            "/dev/vfio/devices/vfio4",
            "/dev/vfio/devices/vfio5"
        ]
    );
}

#[test]
fn container_gpus_get_uuids_device_nodes_and_cdi_names() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = NodeTree::new(dir.path()).expect("tree");
    tree.pci(
        &Pci::gpu("0000:18:00.0", NV, 0x2330)
            .driver("nvidia")
            .numa(0),
    )
    .expect("pci");
    tree.pci(
        &Pci::gpu("0000:2a:00.0", NV, 0x2330)
            .driver("nvidia")
            .numa(1),
    )
    .expect("pci");
    tree.nvidia_gpu(
        "0000:18:00.0",
        "GPU-11111111-2222-3333-4444-555555555555",
        0,
    )
    .expect("proc");
    // The second GPU's driver information is missing: its PCI address names it.
    tree.pci(&Pci::gpu("0000:40:00.0", 0x1002, 0x74a1).driver("amdgpu"))
        .expect("amd");
    tree.dev_node("kfd").expect("kfd");
    let snapshot = look(&tree);
    let nvidia = &snapshot.resources["nvidia.com/gpu"];
    assert_eq!(
        ids(nvidia),
        ["0000:2a:00.0", "GPU-11111111-2222-3333-4444-555555555555"]
    );
    let opts = options(&tree, true);
    let answer = allocate(
        nvidia,
        &strings(&["GPU-11111111-2222-3333-4444-555555555555", "0000:2a:00.0"]),
        &opts,
    )
    .expect("ok");
    assert_eq!(
        answer.envs["NVIDIA_VISIBLE_DEVICES"],
        "GPU-11111111-2222-3333-4444-555555555555,0000:2a:00.0"
    );
    let paths = container_paths(&answer);
    assert_eq!(paths, ["/dev/nvidia0", "/dev/nvidiactl"]);
    let cdi: Vec<&str> = answer.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        cdi,
        [
            "nvidia.com/gpu=GPU-11111111-2222-3333-4444-555555555555",
            "nvidia.com/gpu=0000:2a:00.0"
        ]
    );

    let amd = &snapshot.resources["amd.com/gpu"];
    assert_eq!(ids(amd), ["0000:40:00.0"]);
    let answer = allocate(amd, &strings(&["0000:40:00.0"]), &opts).expect("amd");
    assert!(answer.envs.is_empty());
    let paths = container_paths(&answer);
    assert_eq!(paths, ["/dev/kfd"]);
    // With its render node in sysfs (drm/renderD129), that node too.
    std::fs::create_dir_all(
        tree.paths()
            .sysfs_root
            .join("bus/pci/devices/0000:40:00.0/drm/renderD129"),
    )
    .expect("drm");
    tree.dev_node("dri/renderD129").expect("render node");
    let snapshot = look(&tree);
    let amd = &snapshot.resources["amd.com/gpu"];
    let answer = allocate(amd, &strings(&["0000:40:00.0"]), &opts).expect("amd");
    assert_eq!(
        container_paths(&answer),
        ["/dev/kfd", "/dev/dri/renderD129"]
    );
    // No /dev/kfd: the AMD GPU is unhealthy.
    std::fs::remove_file(tree.paths().dev_root.join("kfd")).expect("rm");
    assert_eq!(look(&tree).resources["amd.com/gpu"].healthy(), 0);
}

#[test]
fn xids_mark_a_gpu_and_its_vgpus_unhealthy() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = mixed_node(dir.path());
    let health = ScanInputs {
        xids: BTreeMap::from([("0000:5d:00.0".to_string(), "79".to_string())]),
        ..ScanInputs::default()
    };
    let snapshot = scan(tree.paths(), &PciIds::bundled(), &health).expect("scan");
    let vgpus = &snapshot.resources[T4_2Q];
    assert_eq!(vgpus.healthy(), 0);
    assert_eq!(
        vgpus.devices[0].unhealthy.as_deref(),
        Some("its GPU 0000:5d:00.0 reported XID 79")
    );
    assert_eq!(snapshot.resources[H100].healthy(), 2);
}

#[test]
fn preferences_follow_the_assignment_then_numa() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = NodeTree::new(dir.path()).expect("tree");
    let gpus = [
        ("0000:18:00.0", 0, 1),
        ("0000:19:00.0", 1, 2),
        ("0000:1a:00.0", 1, 3),
        ("0000:1b:00.0", 0, 4),
        ("0000:1c:00.0", 1, 5),
    ];
    for (addr, numa, group) in gpus {
        tree.pci(
            &Pci::gpu(addr, NV, 0x2330)
                .driver("vfio-pci")
                .group(group)
                .numa(numa),
        )
        .expect("pci");
        tree.group_node(group).expect("node");
    }
    let snapshot = look(&tree);
    let h100 = &snapshot.resources[H100];
    let available: Vec<String> = gpus.iter().map(|g| g.0.to_string()).collect();
    let ask = |size| Request {
        available: &available,
        must_include: &[],
        size,
    };
    // Two fit on either node: the fuller one (node 0: two free) is used whole.
    assert_eq!(
        preferred(h100, ask(2), None),
        ["0000:18:00.0", "0000:1b:00.0"]
    );
    // Three fit only on node 1.
    assert_eq!(
        preferred(h100, ask(3), None),
        ["0000:19:00.0", "0000:1a:00.0", "0000:1c:00.0"]
    );
    // A scheduler's assignment wins when the request can be served from it.
    let assigned = strings(&["0000:1c:00.0", "0000:18:00.0"]);
    assert_eq!(
        preferred(h100, ask(2), Some(&assigned)),
        ["0000:1c:00.0", "0000:18:00.0"]
    );
    // An assignment of devices no longer available is passed over.
    let gone = strings(&["0000:1d:00.0", "0000:18:00.0"]);
    assert_eq!(
        preferred(h100, ask(2), Some(&gone)),
        ["0000:18:00.0", "0000:1b:00.0"]
    );
}

#[test]
fn shared_gpus_are_offered_in_compute_and_memory_units() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = NodeTree::new(dir.path()).expect("tree");
    let uuid = "GPU-11111111-2222-3333-4444-555555555555";
    tree.pci(&Pci::gpu("0000:18:00.0", NV, 0x2330).driver("nvidia"))
        .expect("pci");
    tree.nvidia_gpu("0000:18:00.0", uuid, 0).expect("proc");
    tree.pci(&Pci::gpu("0000:40:00.0", 0x1002, 0x74a1).driver("amdgpu"))
        .expect("amd");
    std::fs::write(
        tree.paths()
            .sysfs_root
            .join("bus/pci/devices/0000:40:00.0/mem_info_vram_total"),
        format!("{}\n", 64u64 << 20),
    )
    .expect("vram");
    tree.dev_node("kfd").expect("kfd");
    let mut inputs = ScanInputs {
        gpu_shares: true,
        ..ScanInputs::default()
    };
    // Without NVML the NVIDIA GPU's memory is unknown: compute units only.
    let snapshot = scan(tree.paths(), &PciIds::bundled(), &inputs).expect("scan");
    assert_eq!(
        counts(&snapshot),
        BTreeMap::from([
            ("gkm.io/gpu-cores", (200, 200)),
            ("gkm.io/gpu-memory", (64, 64))
        ])
    );
    assert!(
        snapshot.excluded[0]
            .reason
            .contains("memory size is unknown")
    );
    // The node's GPUs as the scheduler extender reads them: the IDs the
    // units carry, with their unit counts.
    let gpu = |id: &str, memory| GpuDevice {
        id: id.to_string(),
        cores: 100,
        memory,
    };
    assert_eq!(
        node_gpus(&snapshot),
        [gpu("0000:40:00.0", 64), gpu(uuid, 0)]
    );
    inputs
        .nvml_memory
        .insert("0000:18:00.0".to_string(), 32 << 20);
    let snapshot = scan(tree.paths(), &PciIds::bundled(), &inputs).expect("scan");
    assert_eq!(counts(&snapshot)["gkm.io/gpu-memory"], (96, 96));
    let cores = &snapshot.resources["gkm.io/gpu-cores"];
    assert!(cores.device(&format!("{uuid}-99")).is_some());
    assert!(cores.device(&format!("{uuid}-100")).is_none());

    let asked: Vec<String> = (0..30).map(|n| format!("{uuid}-{n}")).collect();
    let answer = allocate(cores, &asked, &options(&tree, false)).expect("cores");
    assert_eq!(answer.envs["GKM_GPU_CORES"], format!("{uuid}=30"));
    assert_eq!(answer.envs["NVIDIA_VISIBLE_DEVICES"], uuid);
    let paths = container_paths(&answer);
    assert_eq!(paths, ["/dev/nvidia0", "/dev/nvidiactl"]);
    let memory = &snapshot.resources["gkm.io/gpu-memory"];
    let asked: Vec<String> = (0..16).map(|n| format!("0000:40:00.0-{n}")).collect();
    let answer = allocate(memory, &asked, &options(&tree, false)).expect("memory");
    assert_eq!(answer.envs["GKM_GPU_MEMORY_MIB"], "0000:40:00.0=16");
    let paths = container_paths(&answer);
    assert_eq!(paths, ["/dev/kfd"]);

    // Preferences keep a share on one GPU, the fullest that can hold it:
    // 40 units free on the NVIDIA GPU, 100 on the AMD one.
    let available: Vec<String> = (60..100)
        .map(|n| format!("{uuid}-{n}"))
        .chain((0..100).map(|n| format!("0000:40:00.0-{n}")))
        .collect();
    let ask = |size| Request {
        available: &available,
        must_include: &[],
        size,
    };
    let on_gpus = |ids: Vec<String>| -> BTreeMap<String, usize> {
        let mut per = BTreeMap::new();
        for id in ids {
            let gpu = id
                .rsplit_once('-')
                .map(|(g, _)| g.to_string())
                .unwrap_or_default();
            *per.entry(gpu).or_default() += 1;
        }
        per
    };
    assert_eq!(
        on_gpus(preferred(cores, ask(30), None)),
        BTreeMap::from([(uuid.to_string(), 30)])
    );
    assert_eq!(
        on_gpus(preferred(cores, ask(50), None)),
        BTreeMap::from([("0000:40:00.0".to_string(), 50)])
    );
}

#[test]
fn an_assignment_of_gpu_units_is_served_with_free_units_of_the_same_gpus() {
    let dir = tempfile::tempdir().expect("tmp");
    let tree = NodeTree::new(dir.path()).expect("tree");
    for (addr, uuid) in [("0000:18:00.0", "GPU-a"), ("0000:19:00.0", "GPU-b")] {
        tree.pci(&Pci::gpu(addr, NV, 0x2330).driver("nvidia"))
            .expect("pci");
        tree.nvidia_gpu(addr, uuid, 0).expect("proc");
    }
    let inputs = ScanInputs {
        gpu_shares: true,
        ..ScanInputs::default()
    };
    let snapshot = scan(tree.paths(), &PciIds::bundled(), &inputs).expect("scan");
    let cores = &snapshot.resources["gkm.io/gpu-cores"];
    // Units 0-9 of GPU-b are taken; the assignment names them anyway.
    let available: Vec<String> = (0..100)
        .map(|n| format!("GPU-a-{n}"))
        .chain((10..100).map(|n| format!("GPU-b-{n}")))
        .collect();
    let request = Request {
        available: &available,
        must_include: &[],
        size: 3,
    };
    let assigned = strings(&["GPU-b-0", "GPU-b-1", "GPU-b-2"]);
    assert_eq!(
        preferred(cores, request, Some(&assigned)),
        ["GPU-b-10", "GPU-b-11", "GPU-b-12"]
    );
    // An assignment of another size is for another container or pod.
    let other = strings(&["GPU-b-0"]);
    let ids = preferred(cores, request, Some(&other));
    assert_eq!(ids.len(), 3);
}
