//! A cheap fingerprint of what reading a node's devices depends on, so a
//! plugin polling the node reads it again only when the fingerprint moves.
//!
//! Reading the node ([`crate::resources`] on a [`gkm_gpu::discover`]y) parses
//! the PCI ID database, reads every GPU's files and asks NVML. The
//! fingerprint only lists directories and reads links and a few small
//! files: the PCI functions with their class, driver and IOMMU group (the
//! group peers' drivers decide whether a group can be passed through), each
//! GPU's VFIO character devices, DRM nodes, vGPU types and its driver
//! module's version; the vGPUs and their types; the AMD KFD topology nodes;
//! the NVIDIA driver's GPUs in `/proc`; and the device nodes under `/dev`,
//! `/dev/vfio`, `/dev/vfio/devices` and `/dev/dri`.
//!
//! What it cannot see (NVML's answers) is for the caller to read now and
//! then anyway.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;

use crate::resources::NodePaths;

/// The fingerprint of a node's device trees: equal fingerprints, taken by
/// one process, mean the trees list the same devices the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint(u64);

/// PCI classes whose functions are GPUs or accelerators (display
/// controllers, processing accelerators): the base class byte.
const GPU_CLASSES: [&str; 2] = ["0x03", "0x12"];

/// The fingerprint of the trees under `paths` now. Unreadable parts count
/// as empty: a tree that cannot be read now and can be later changes it.
pub fn fingerprint(paths: &NodePaths) -> Fingerprint {
    let mut h = DefaultHasher::new();
    let sys = &paths.sysfs_root;
    let pci = sys.join("bus/pci/devices");
    let functions = names(&pci);
    functions.hash(&mut h);
    for function in &functions {
        let dir = pci.join(function);
        let class = contents(&dir.join("class"));
        let driver = link_name(&dir.join("driver"));
        (&class, &driver, link_name(&dir.join("iommu_group"))).hash(&mut h);
        if class
            .as_deref()
            .is_some_and(|c| GPU_CLASSES.iter().any(|g| c.starts_with(g)))
        {
            names(&dir.join("vfio-dev")).hash(&mut h);
            names(&dir.join("drm")).hash(&mut h);
            names(&dir.join("mdev_supported_types")).hash(&mut h);
            if let Some(driver) = &driver {
                contents(
                    &sys.join("module")
                        .join(driver.replace('-', "_"))
                        .join("version"),
                )
                .hash(&mut h);
            }
        }
    }
    let mdevs = sys.join("bus/mdev/devices");
    for mdev in names(&mdevs) {
        (&mdev, link_name(&mdevs.join(&mdev).join("mdev_type"))).hash(&mut h);
    }
    names(&sys.join("class/kfd/kfd/topology/nodes")).hash(&mut h);
    names(&paths.proc_root.join("driver/nvidia/gpus")).hash(&mut h);
    for dev in ["", "vfio", "vfio/devices", "dri"] {
        names(&paths.dev_root.join(dev)).hash(&mut h);
    }
    Fingerprint(h.finish())
}

/// The names in `dir`, sorted; none when it cannot be read.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort_unstable();
    names
}

/// The last component of where a link points (`driver` → `nvidia`).
fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// A small file's contents, trimmed.
fn contents(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_tree::{NodeTree, Pci};

    const H100: &str = "0000:6e:00.0";

    /// A node with an H100 on `nvidia`, and its fingerprint.
    fn node(dir: &Path) -> (NodeTree, Fingerprint) {
        let tree = NodeTree::new(dir).unwrap();
        tree.pci(&Pci::gpu(H100, 0x10de, 0x2330).driver("nvidia").group(7))
            .unwrap();
        tree.nvidia_gpu(H100, "GPU-6e", 0).unwrap();
        let before = fingerprint(tree.paths());
        (tree, before)
    }

    #[test]
    fn an_unchanged_node_keeps_its_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, before) = node(dir.path());
        assert_eq!(fingerprint(tree.paths()), before);
    }

    #[test]
    fn a_device_node_going_and_coming_back_moves_it_and_back() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, before) = node(dir.path());
        let nvidia0 = tree.paths().dev_root.join("nvidia0");
        std::fs::remove_file(&nvidia0).unwrap();
        assert_ne!(fingerprint(tree.paths()), before);
        tree.dev_node("nvidia0").unwrap();
        assert_eq!(fingerprint(tree.paths()), before);
    }

    #[test]
    fn a_gpu_rebound_to_vfio_moves_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, before) = node(dir.path());
        tree.bind(H100, Some("vfio-pci")).unwrap();
        assert_ne!(fingerprint(tree.paths()), before);
    }

    #[test]
    fn a_group_peer_bound_to_another_driver_moves_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, before) = node(dir.path());
        tree.pci(
            &Pci::audio("0000:6e:00.1", 0x10de, 0x22ba)
                .driver("snd_hda_intel")
                .group(7),
        )
        .unwrap();
        let with_peer = fingerprint(tree.paths());
        assert_ne!(with_peer, before);
        tree.bind("0000:6e:00.1", Some("vfio-pci")).unwrap();
        assert_ne!(fingerprint(tree.paths()), with_peer);
    }

    #[test]
    fn a_new_gpu_a_vgpu_and_its_removal_move_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, before) = node(dir.path());
        tree.pci(&Pci::gpu("0000:5d:00.0", 0x10de, 0x1eb8).driver("nvidia"))
            .unwrap();
        let with_t4 = fingerprint(tree.paths());
        assert_ne!(with_t4, before);
        let uuid = "0b1c5e8a-1111-4d2e-9c3a-000000000001";
        tree.mdev(uuid, "0000:5d:00.0", "nvidia-222", "GRID T4-2Q", 30)
            .unwrap();
        let with_vgpu = fingerprint(tree.paths());
        assert_ne!(with_vgpu, with_t4);
        tree.remove_mdev(uuid).unwrap();
        assert_ne!(fingerprint(tree.paths()), with_vgpu);
    }

    #[test]
    fn a_driver_upgrade_moves_it() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, _) = node(dir.path());
        let module = tree.paths().sysfs_root.join("module/nvidia");
        std::fs::create_dir_all(&module).unwrap();
        std::fs::write(module.join("version"), "550.54.15\n").unwrap();
        let before = fingerprint(tree.paths());
        std::fs::write(module.join("version"), "570.86.10\n").unwrap();
        assert_ne!(fingerprint(tree.paths()), before);
    }
}
