//! Discovery on captured sysfs trees (testdata/sysfs), written in the kernel's
//! file formats: hex ids with `0x`, `driver` and `iommu_group` as symlinks,
//! KFD topology `properties` files.

use std::path::{Path, PathBuf};

use gkm_core::{Backend, Vendor};
use gkm_gpu::labels::{LabelOptions, node_labels};
use gkm_gpu::{DiscoveryOptions, Inventory, NvmlStatus, PciIdsSource};

fn tree(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/sysfs")
        .join(name)
}

/// Discovers a captured tree without NVML and with the bundled PCI names, so
/// the result is the same on every machine; paths in warnings are made
/// relative to the tree.
fn discover(name: &str) -> Inventory {
    let root = tree(name);
    let mut inventory = gkm_gpu::discover(&DiscoveryOptions {
        sysfs_root: root.clone(),
        nvml: false,
        simulate: None,
        pci_ids: PciIdsSource::Bundled,
    })
    .unwrap_or_else(|e| panic!("discovery on {name} failed: {e}"));
    let prefix = root.display().to_string();
    for w in &mut inventory.warnings {
        *w = w.replace(&prefix, "<sysfs>");
    }
    inventory
}

fn labels(inventory: &Inventory) -> std::collections::BTreeMap<String, String> {
    node_labels(
        inventory,
        &LabelOptions {
            vendor_labels: true,
        },
    )
}

#[test]
fn nvidia_datacenter_gpus_on_the_nvidia_driver() {
    let inv = discover("nvidia-h100");
    assert_eq!(inv.gpus.len(), 2, "the ASPEED BMC display is not a GPU");
    for (i, (gpu, (addr, numa))) in inv
        .gpus
        .iter()
        .zip([("0000:18:00.0", 0), ("0000:bd:00.0", 1)])
        .enumerate()
    {
        assert_eq!(gpu.index as usize, i);
        assert_eq!(gpu.vendor, Vendor::Nvidia);
        assert_eq!(gpu.product, "NVIDIA H100 SXM5 80GB");
        assert_eq!(gpu.backend, Some(Backend::Cuda));
        assert_eq!(
            gpu.arch.as_ref().and_then(|a| a.sm_name()).as_deref(),
            Some("sm_90")
        );
        assert_eq!(gpu.warp_size, Some(32));
        assert_eq!(gpu.pci_address.as_deref(), Some(addr));
        assert_eq!(gpu.pci_id.as_deref(), Some("10de:2330"));
        assert_eq!(gpu.kernel_driver.as_deref(), Some("nvidia"));
        assert_eq!(gpu.driver_version.as_deref(), Some("550.54.15"));
        assert_eq!(gpu.numa_node, Some(numa));
    }
    assert!(inv.vfio.is_empty() && inv.mdevs.is_empty());
    assert_eq!(inv.nvml, NvmlStatus::NotChecked);
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    insta::assert_yaml_snapshot!("nvidia-h100-labels", labels(&inv));
    insta::assert_json_snapshot!("nvidia-h100-inventory", inv);
}

#[test]
fn vfio_bound_gpus_with_their_audio_functions() {
    let inv = discover("nvidia-vfio");
    assert!(
        inv.gpus.is_empty(),
        "VFIO-bound GPUs are not host GPUs: {:?}",
        inv.gpus
    );
    let addrs: Vec<&str> = inv.vfio.iter().map(|v| v.pci_address.as_str()).collect();
    assert_eq!(
        addrs,
        [
            "0000:18:00.0",
            "0000:4b:00.0",
            "0000:bd:00.0",
            "0000:cb:00.0"
        ]
    );
    let h100 = &inv.vfio[0];
    assert_eq!(h100.driver, "vfio-pci");
    assert_eq!(h100.product, "NVIDIA H100 SXM5 80GB");
    assert_eq!(h100.iommu_group, Some(31));
    assert!(h100.group_members.is_empty());
    assert!(h100.group_viable);

    let l40 = &inv.vfio[1];
    assert_eq!(l40.iommu_group, Some(41));
    assert_eq!(l40.group_members.len(), 1);
    let audio = &l40.group_members[0];
    assert_eq!(audio.pci_address, "0000:4b:00.1");
    assert_eq!(audio.class, "0x040300");
    assert_eq!(audio.driver.as_deref(), Some("vfio-pci"));
    assert_eq!(audio.name, "AD102 High Definition Audio Controller");
    assert!(l40.group_viable);

    // The second L40's audio function is still on the host's sound driver.
    let stuck = &inv.vfio[3];
    assert_eq!(
        stuck.group_members[0].driver.as_deref(),
        Some("snd_hda_intel")
    );
    assert!(!stuck.group_viable);
    assert_eq!(inv.warnings.len(), 1, "{:?}", inv.warnings);
    assert!(inv.warnings[0].contains("0000:cb:00.0") && inv.warnings[0].contains("IOMMU group 91"));

    let l = labels(&inv);
    assert_eq!(l["gkm.io/gpu.count"], "0");
    assert_eq!(l["gkm.io/vfio.count"], "4");
    insta::assert_yaml_snapshot!("nvidia-vfio-labels", l);
    insta::assert_json_snapshot!("nvidia-vfio-inventory", inv);
}

#[test]
fn mdev_vgpus_on_a_t4() {
    let inv = discover("nvidia-mdev");
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].product, "NVIDIA Tesla T4");
    assert_eq!(inv.gpus[0].arch.as_ref().map(|a| a.as_str()), Some("75"));
    assert_eq!(inv.mdevs.len(), 2);
    let m = &inv.mdevs[0];
    assert_eq!(m.uuid, "aa618089-8b16-4d01-a136-25a0f3c73123");
    assert_eq!(m.parent_address, "0000:3b:00.0");
    assert_eq!(m.type_id, "nvidia-222");
    assert_eq!(m.type_name.as_deref(), Some("GRID T4-1B"));
    assert_eq!(m.parent_product.as_deref(), Some("NVIDIA Tesla T4"));
    assert_eq!(m.iommu_group, Some(120));
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let l = labels(&inv);
    assert_eq!(l["gkm.io/vgpu.count"], "2");
    insta::assert_yaml_snapshot!("nvidia-mdev-labels", l);
    insta::assert_json_snapshot!("nvidia-mdev-inventory", inv);
}

#[test]
fn amd_mi210_from_kfd_topology() {
    let inv = discover("amd-mi210");
    assert_eq!(inv.gpus.len(), 1);
    let gpu = &inv.gpus[0];
    assert_eq!(gpu.vendor, Vendor::Amd);
    assert_eq!(gpu.product, "AMD Instinct MI210");
    assert_eq!(gpu.backend, Some(Backend::Hip));
    assert_eq!(gpu.arch.as_ref().map(|a| a.as_str()), Some("gfx90a"));
    assert_eq!(gpu.warp_size, Some(64));
    assert_eq!(gpu.memory_bytes, Some(68702699520));
    assert_eq!(gpu.driver_version.as_deref(), Some("6.8.5"));
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let l = labels(&inv);
    assert_eq!(l["amd.com/gpu.family"], "AI");
    assert_eq!(l["amd.com/gpu.vram"], "64G");
    insta::assert_yaml_snapshot!("amd-mi210-labels", l);
    insta::assert_json_snapshot!("amd-mi210-inventory", inv);
}

#[test]
fn amd_mi300x_processing_accelerators_from_kfd_topology() {
    let inv = discover("amd-mi300x");
    assert_eq!(inv.gpus.len(), 2);
    for gpu in &inv.gpus {
        // The board's FRU name, from amdgpu's product_name.
        assert_eq!(gpu.product, "AMD Instinct MI300X OAM");
        assert_eq!(gpu.arch.as_ref().map(|a| a.as_str()), Some("gfx942"));
        assert_eq!(gpu.warp_size, Some(64));
        assert_eq!(gpu.memory_bytes, Some(192 << 30));
        assert_eq!(
            gpu.driver_version, None,
            "in-tree amdgpu has no module version"
        );
    }
    assert_eq!(inv.gpus[1].numa_node, Some(1));
    let l = labels(&inv);
    assert_eq!(l["gkm.io/gpu.arch"], "gfx942");
    assert_eq!(l["amd.com/gpu.product-name"], "AMD_Instinct_MI300X_OAM");
    assert_eq!(l["amd.com/gpu.device-id"], "74a1");
    insta::assert_yaml_snapshot!("amd-mi300x-labels", l);
    insta::assert_json_snapshot!("amd-mi300x-inventory", inv);
}

#[test]
fn intel_gaudi_and_data_center_gpu_by_pci_id() {
    let inv = discover("intel");
    let kinds: Vec<(Vendor, Option<Backend>, &str)> = inv
        .gpus
        .iter()
        .map(|g| (g.vendor, g.backend, g.product.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (
                Vendor::Intel,
                Some(Backend::Hpu),
                "Intel Gaudi2 AI Training Accelerator"
            ),
            (
                Vendor::Intel,
                Some(Backend::Xpu),
                "Intel Data Center GPU Max 1550"
            ),
        ]
    );
    assert!(inv.gpus.iter().all(|g| g.arch.is_none()));
    let l = labels(&inv);
    assert_eq!(l["gkm.io/gpu.mixed"], "true");
    insta::assert_yaml_snapshot!("intel-labels", l);
}

#[test]
fn a_node_without_gpus() {
    let inv = discover("no-gpu");
    assert!(inv.gpus.is_empty() && inv.vfio.is_empty() && inv.mdevs.is_empty());
    assert!(inv.warnings.is_empty(), "{:?}", inv.warnings);
    let l = labels(&inv);
    assert_eq!(l.len(), 1);
    insta::assert_yaml_snapshot!("no-gpu-labels", l);
}

#[test]
fn a_malformed_tree_gives_a_partial_result_with_warnings() {
    let inv = discover("malformed");
    let addrs: Vec<&str> = inv
        .gpus
        .iter()
        .filter_map(|g| g.pci_address.as_deref())
        .collect();
    // 18:00.0 (bad vendor) and 19:00.0 (no class) are skipped.
    assert_eq!(addrs, ["0000:1a:00.0", "0000:83:00.0", "0000:84:00.0"]);
    let t4 = &inv.gpus[0];
    assert_eq!(t4.backend, None, "no driver bound");
    assert_eq!(t4.numa_node, None, "numa_node -1 means none");
    assert_eq!(inv.gpus[1].arch, None, "no KFD node");
    assert_eq!(
        inv.gpus[2].arch, None,
        "gfx_target_version 91600 names no target"
    );
    let expect = [
        "<sysfs>/bus/pci/devices/junk: not a PCI address",
        "PCI device 0000:18:00.0 skipped: <sysfs>/bus/pci/devices/0000:18:00.0/vendor: expected a hex number like 0x10de, found \"nvidia\"",
        "PCI device 0000:19:00.0 skipped: <sysfs>/bus/pci/devices/0000:19:00.0/class is missing",
        "PCI device 0000:99:00.0 skipped: <sysfs>/bus/pci/devices/0000:99:00.0 leads to no directory",
        "line 39: expected `name number`, found \"garbage line here\"",
        "gfx_target_version 91600 does not name a gfx target",
        "KFD node 2 skipped:",
        "0000:1a:00.0 NVIDIA Tesla T4 has no driver bound",
        "0000:83:00.0 AMD Instinct MI210 is on amdgpu but has no KFD topology node",
        "mdev 0bad0bad-0000-0000-0000-000000000000 skipped",
    ];
    for e in expect {
        assert!(
            inv.warnings.iter().any(|w| w.contains(e)),
            "no warning containing {e:?} in {:#?}",
            inv.warnings
        );
    }
    assert_eq!(inv.warnings.len(), expect.len(), "{:#?}", inv.warnings);
    insta::assert_yaml_snapshot!("malformed-labels", labels(&inv));
    insta::assert_json_snapshot!("malformed-inventory", inv);
}

#[test]
fn a_directory_that_is_not_sysfs_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = gkm_gpu::discover(&DiscoveryOptions {
        sysfs_root: dir.path().into(),
        nvml: false,
        ..Default::default()
    })
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    assert!(msg.contains("no bus/pci/devices"), "{msg}");
}

#[test]
fn inventory_json_reads_back_as_a_simulated_inventory() {
    let inv = discover("amd-mi300x");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.json");
    std::fs::write(&file, serde_json::to_string(&inv).unwrap()).unwrap();
    let back = gkm_gpu::simulate::load(&file).unwrap();
    assert!(back.simulated);
    // Every simulated GPU has a UUID; sysfs gives none for these, so the
    // simulation makes them up and keeps everything else.
    assert!(inv.gpus.iter().all(|g| g.uuid.is_none()));
    assert!(back.gpus.iter().all(|g| g.uuid.is_some()));
    let without_uuid = |gpus: &[gkm_core::Gpu]| -> Vec<gkm_core::Gpu> {
        gpus.iter()
            .map(|g| gkm_core::Gpu {
                uuid: None,
                ..g.clone()
            })
            .collect()
    };
    assert_eq!(without_uuid(&back.gpus), inv.gpus);
}

/// Links in the trees never point at one of their own ancestors, so tools that
/// walk the package following links (cargo among them) terminate.
#[test]
fn captured_trees_have_no_link_loops() {
    fn walk(dir: &Path, links: &mut usize) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                *links += 1;
                if let Ok(target) = std::fs::canonicalize(&path) {
                    let here = std::fs::canonicalize(path.parent().unwrap()).unwrap();
                    assert!(
                        !here.starts_with(&target),
                        "{} points to its ancestor {}",
                        path.display(),
                        target.display()
                    );
                }
            } else if meta.is_dir() {
                walk(&path, links);
            }
        }
    }
    let mut links = 0;
    walk(&tree(""), &mut links);
    assert!(
        links > 50,
        "the trees use symlinks as sysfs does ({links} found)"
    );
}
