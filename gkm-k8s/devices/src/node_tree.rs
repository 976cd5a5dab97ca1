//! Builds the sysfs, `/dev` and `/proc` trees of a GPU node in a directory,
//! laid out as the kernel lays them out, so the plugin can be run and tested
//! on a machine without those GPUs.
//!
//! Device nodes are empty files by default. With
//! [`NodeTree::with_char_devices`] they are character devices with the
//! numbers of `/dev/null` (1:3): a container runtime can then create them in
//! a container (it copies a device's type and numbers), and they are
//! harmless there.
//!
//! ```
//! use gkm_k8s_devices::node_tree::{NodeTree, Pci};
//! let dir = tempfile::tempdir().unwrap();
//! let tree = NodeTree::new(dir.path()).unwrap();
//! tree.pci(&Pci::gpu("0000:3b:00.0", 0x10de, 0x2330).driver("vfio-pci").group(12)).unwrap();
//! tree.group_node(12).unwrap();
//! assert!(dir.path().join("sys/bus/pci/devices/0000:3b:00.0/vendor").exists());
//! assert!(dir.path().join("dev/vfio/12").exists());
//! ```

use std::io;
use std::path::{Path, PathBuf};

use super::resources::NodePaths;

/// A node's trees under one directory: `sys/`, `dev/`, `proc/`.
#[derive(Debug, Clone)]
pub struct NodeTree {
    paths: NodePaths,
    char_devices: bool,
}

/// One PCI function to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pci {
    address: String,
    vendor: u16,
    device: u16,
    class: u32,
    driver: Option<String>,
    group: Option<u32>,
    numa: Option<u32>,
}

impl Pci {
    /// A 3D controller (class 0x030200) with no driver and no group.
    pub fn gpu(address: &str, vendor: u16, device: u16) -> Pci {
        Pci {
            address: address.to_string(),
            vendor,
            device,
            class: 0x030200,
            driver: None,
            group: None,
            numa: None,
        }
    }

    /// An HD audio function (class 0x040300), as GPUs carry for HDMI.
    pub fn audio(address: &str, vendor: u16, device: u16) -> Pci {
        Pci {
            class: 0x040300,
            ..Pci::gpu(address, vendor, device)
        }
    }

    /// Bound to `driver`.
    pub fn driver(mut self, driver: &str) -> Pci {
        self.driver = Some(driver.to_string());
        self
    }

    /// In IOMMU group `group`.
    pub fn group(mut self, group: u32) -> Pci {
        self.group = Some(group);
        self
    }

    /// On NUMA node `node`.
    pub fn numa(mut self, node: u32) -> Pci {
        self.numa = Some(node);
        self
    }
}

impl NodeTree {
    /// Creates `root/sys`, `root/dev` and `root/proc`, with an empty PCI bus.
    pub fn new(root: &Path) -> io::Result<NodeTree> {
        let paths = NodePaths {
            sysfs_root: root.join("sys"),
            dev_root: root.join("dev"),
            proc_root: root.join("proc"),
        };
        std::fs::create_dir_all(paths.sysfs_root.join("bus/pci/devices"))?;
        std::fs::create_dir_all(paths.sysfs_root.join("devices/pci0000:00"))?;
        std::fs::create_dir_all(paths.dev_root.join("vfio"))?;
        std::fs::create_dir_all(&paths.proc_root)?;
        Ok(NodeTree {
            paths,
            char_devices: false,
        })
    }

    /// Makes device nodes character devices 1:3 (needs `CAP_MKNOD`), and
    /// creates `/dev/vfio/vfio`.
    pub fn with_char_devices(mut self) -> io::Result<NodeTree> {
        self.char_devices = true;
        self.dev_node("vfio/vfio")?;
        Ok(self)
    }

    /// The paths the plugin should look at.
    pub fn paths(&self) -> &NodePaths {
        &self.paths
    }

    fn device_dir(&self, address: &str) -> PathBuf {
        self.paths
            .sysfs_root
            .join("devices/pci0000:00")
            .join(address)
    }

    /// Creates a PCI function: its directory with `vendor`, `device`,
    /// `class`, `numa_node`, and `driver` and `iommu_group` links.
    pub fn pci(&self, pci: &Pci) -> io::Result<()> {
        let dir = self.device_dir(&pci.address);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("vendor"), format!("0x{:04x}\n", pci.vendor))?;
        std::fs::write(dir.join("device"), format!("0x{:04x}\n", pci.device))?;
        std::fs::write(dir.join("class"), format!("0x{:06x}\n", pci.class))?;
        let numa = pci.numa.map_or_else(|| "-1".to_string(), |n| n.to_string());
        std::fs::write(dir.join("numa_node"), format!("{numa}\n"))?;
        replace_link(
            &format!("../../../devices/pci0000:00/{}", pci.address),
            &self
                .paths
                .sysfs_root
                .join("bus/pci/devices")
                .join(&pci.address),
        )?;
        let _ = std::fs::remove_file(dir.join("driver"));
        if let Some(driver) = &pci.driver {
            replace_link(
                &format!("../../../bus/pci/drivers/{driver}"),
                &dir.join("driver"),
            )?;
        }
        let _ = std::fs::remove_file(dir.join("iommu_group"));
        if let Some(group) = pci.group {
            replace_link(
                &format!("../../../kernel/iommu_groups/{group}"),
                &dir.join("iommu_group"),
            )?;
        }
        Ok(())
    }

    /// Rebinds an existing function to `driver` (`None`: unbinds it).
    pub fn bind(&self, address: &str, driver: Option<&str>) -> io::Result<()> {
        let link = self.device_dir(address).join("driver");
        let _ = std::fs::remove_file(&link);
        match driver {
            Some(driver) => replace_link(&format!("../../../bus/pci/drivers/{driver}"), &link),
            None => Ok(()),
        }
    }

    /// Creates `/dev/vfio/<group>`.
    pub fn group_node(&self, group: u32) -> io::Result<()> {
        self.dev_node(&format!("vfio/{group}"))
    }

    /// Removes `/dev/vfio/<group>` (as when the group's devices leave VFIO).
    pub fn remove_group_node(&self, group: u32) -> io::Result<()> {
        std::fs::remove_file(self.paths.dev_root.join(format!("vfio/{group}")))
    }

    /// Creates a device node under the `/dev` root (`nvidia0`, `kfd`,
    /// `dri/renderD128`).
    pub fn dev_node(&self, rel: &str) -> io::Result<()> {
        let path = self.paths.dev_root.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            return Ok(());
        }
        if self.char_devices {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &path,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                rustix::fs::makedev(1, 3),
            )
            .map_err(io::Error::from)
        } else {
            std::fs::write(&path, b"")
        }
    }

    /// Creates the vGPU `uuid` of type `type_id` (named `type_name`) on the
    /// GPU `parent`, in IOMMU group `group`, as `/sys/bus/mdev/devices` shows
    /// it, and its group's device node.
    pub fn mdev(
        &self,
        uuid: &str,
        parent: &str,
        type_id: &str,
        type_name: &str,
        group: u32,
    ) -> io::Result<()> {
        let parent_dir = self.device_dir(parent);
        let type_dir = parent_dir.join("mdev_supported_types").join(type_id);
        std::fs::create_dir_all(&type_dir)?;
        std::fs::write(type_dir.join("name"), format!("{type_name}\n"))?;
        let dir = parent_dir.join(uuid);
        std::fs::create_dir_all(&dir)?;
        replace_link(
            &format!("../mdev_supported_types/{type_id}"),
            &dir.join("mdev_type"),
        )?;
        replace_link(
            &format!("../../../../kernel/iommu_groups/{group}"),
            &dir.join("iommu_group"),
        )?;
        let bus = self.paths.sysfs_root.join("bus/mdev/devices");
        std::fs::create_dir_all(&bus)?;
        replace_link(
            &format!("../../../devices/pci0000:00/{parent}/{uuid}"),
            &bus.join(uuid),
        )?;
        self.group_node(group)
    }

    /// Removes the vGPU `uuid` (as `echo 1 > remove` does).
    pub fn remove_mdev(&self, uuid: &str) -> io::Result<()> {
        std::fs::remove_file(self.paths.sysfs_root.join("bus/mdev/devices").join(uuid))
    }

    /// Writes what the NVIDIA driver tells about a GPU in
    /// `/proc/driver/nvidia/gpus/<address>/information`, and creates its
    /// `/dev/nvidia<minor>` and `/dev/nvidiactl`.
    pub fn nvidia_gpu(&self, address: &str, uuid: &str, minor: u32) -> io::Result<()> {
        let dir = self
            .paths
            .proc_root
            .join("driver/nvidia/gpus")
            .join(address);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("information"),
            format!(
                "Model: \t\t NVIDIA GPU\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nDevice Minor: \t {minor}\nBus Location: \t {address}\n"
            ),
        )?;
        self.dev_node(&format!("nvidia{minor}"))?;
        self.dev_node("nvidiactl")
    }

    /// Gives a VFIO-bound function its VFIO character device `vfio<n>`
    /// (sysfs `vfio-dev/` and `/dev/vfio/devices/`), and creates `/dev/iommu`:
    /// a kernel with iommufd.
    pub fn iommufd_cdev(&self, address: &str, n: u32) -> io::Result<()> {
        std::fs::create_dir_all(self.device_dir(address).join(format!("vfio-dev/vfio{n}")))?;
        self.dev_node(&format!("vfio/devices/vfio{n}"))?;
        self.dev_node("iommu")
    }
}

/// The PCI address, group and NUMA node of each GPU [`NodeTree::example`]
/// creates, with its PCI device id: two H100s, an A100, and an H100 whose
/// group 13 also holds its audio function `0000:4c:00.1` on `snd_hda_intel`.
pub const EXAMPLE_PASSTHROUGH: [(&str, u16, u32, u32); 4] = [
    ("0000:18:00.0", 0x2330, 10, 0),
    ("0000:2a:00.0", 0x2330, 11, 0),
    ("0000:3b:00.0", 0x20b5, 12, 1),
    ("0000:4c:00.0", 0x2330, 13, 1),
];

/// The T4 on `nvidia` that [`NodeTree::example`]'s vGPUs live on.
pub const EXAMPLE_VGPU_PARENT: &str = "0000:5d:00.0";

/// The UUID and group of each `GRID T4-2Q` vGPU [`NodeTree::example`] creates.
pub const EXAMPLE_VGPUS: [(&str, u32); 2] = [
    ("0b1c5e8a-1111-4d2e-9c3a-000000000001", 30),
    ("0b1c5e8a-1111-4d2e-9c3a-000000000002", 31),
];

impl NodeTree {
    /// Fills the tree with the example node: the GPUs of
    /// [`EXAMPLE_PASSTHROUGH`] on `vfio-pci` with their group nodes, the
    /// audio function of group 13 on `snd_hda_intel` (so that group is not
    /// viable), and the [`EXAMPLE_VGPUS`] (`nvidia-222`, `GRID T4-2Q`) on the
    /// T4 [`EXAMPLE_VGPU_PARENT`]. Named with the bundled PCI IDs, it offers
    /// `nvidia.com/GH100_H100_SXM5_80GB` ×2, `nvidia.com/GA100_A100_PCIE_80GB`
    /// ×1 and `nvidia.com/GRID_T4-2Q` ×2.
    pub fn example(&self) -> io::Result<()> {
        const NVIDIA: u16 = 0x10de;
        for (address, device, group, numa) in EXAMPLE_PASSTHROUGH {
            self.pci(
                &Pci::gpu(address, NVIDIA, device)
                    .driver("vfio-pci")
                    .group(group)
                    .numa(numa),
            )?;
            self.group_node(group)?;
        }
        self.pci(
            &Pci::audio("0000:4c:00.1", NVIDIA, 0x22ba)
                .driver("snd_hda_intel")
                .group(13),
        )?;
        self.pci(
            &Pci::gpu(EXAMPLE_VGPU_PARENT, NVIDIA, 0x1eb8)
                .driver("nvidia")
                .numa(1),
        )?;
        for (uuid, group) in EXAMPLE_VGPUS {
            self.mdev(uuid, EXAMPLE_VGPU_PARENT, "nvidia-222", "GRID T4-2Q", group)?;
        }
        Ok(())
    }
}

fn replace_link(target: &str, link: &Path) -> io::Result<()> {
    if let Some(dir) = link.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(target, link)
}
