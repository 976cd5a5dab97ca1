//! Passthrough inventory: GPUs bound to VFIO drivers with their IOMMU groups,
//! and mediated devices (vGPUs) from `/sys/bus/mdev/devices`.

use std::path::{Component, Path, PathBuf};

use gkm_core::Vendor;

use crate::inventory::{MdevDevice, PciFunction, VfioDevice};
use crate::pci::{PciDevice, is_pci_address, link_name, read_trimmed, sorted_entries};
use crate::pci_ids::PciIds;

/// Describes a VFIO-bound GPU with the other members of its IOMMU group.
pub(crate) fn vfio_device(dev: &PciDevice, all: &[PciDevice], ids: &PciIds) -> VfioDevice {
    let members: Vec<&PciDevice> = match dev.iommu_group {
        Some(group) => all
            .iter()
            .filter(|d| d.iommu_group == Some(group) && d.address != dev.address)
            .collect(),
        None => Vec::new(),
    };
    let group_members: Vec<PciFunction> = members
        .into_iter()
        .map(|m| PciFunction {
            pci_address: m.address.clone(),
            pci_id: m.pci_id(),
            class: m.class_code(),
            name: ids
                .device(m.vendor_id, m.device_id)
                .map_or_else(|| format!("device {}", m.pci_id()), str::to_string),
            driver: m.driver.clone(),
        })
        .collect();
    let group_viable = group_members.iter().all(PciFunction::allows_passthrough);
    VfioDevice {
        pci_address: dev.address.clone(),
        vendor: Vendor::from_pci_id(dev.vendor_id),
        pci_id: dev.pci_id(),
        product: ids.product(dev.vendor_id, dev.device_id),
        driver: dev.driver.clone().unwrap_or_default(),
        numa_node: dev.numa_node,
        iommu_group: dev.iommu_group,
        group_members,
        group_viable,
    }
}

/// Reads `ROOT/bus/mdev/devices/*`: each entry links to a directory under
/// its parent PCI function, which names the parent.
pub(crate) fn read_mdevs(
    root: &Path,
    devices: &[PciDevice],
    ids: &PciIds,
    warnings: &mut Vec<String>,
) -> Vec<MdevDevice> {
    let dir = root.join("bus/mdev/devices");
    let Ok(entries) = sorted_entries(&dir) else {
        return Vec::new();
    };
    let mut mdevs = Vec::new();
    for entry in entries {
        let uuid = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let Some(parent_address) = mdev_parent(&path) else {
            warnings.push(format!(
                "mdev {uuid} skipped: {} does not link to a directory under a PCI device",
                path.display()
            ));
            continue;
        };
        let Some(type_id) = link_name(&path.join("mdev_type")) else {
            warnings.push(format!(
                "mdev {uuid} skipped: {} is not a link to its type",
                path.join("mdev_type").display()
            ));
            continue;
        };
        let type_name = read_trimmed(&path.join("mdev_type/name")).ok().flatten();
        let parent_product = devices
            .iter()
            .find(|d| d.address == parent_address)
            .map(|d| ids.product(d.vendor_id, d.device_id));
        if parent_product.is_none() {
            warnings.push(format!(
                "mdev {uuid}: parent {parent_address} is not among the PCI devices"
            ));
        }
        mdevs.push(MdevDevice {
            uuid,
            parent_address,
            type_id,
            type_name,
            parent_product,
            iommu_group: link_name(&path.join("iommu_group")).and_then(|g| g.parse().ok()),
        });
    }
    mdevs.sort_by(|a, b| (&a.parent_address, &a.uuid).cmp(&(&b.parent_address, &b.uuid)));
    mdevs
}

/// The VFIO character device of a device bound to VFIO, `vfio3`, read from
/// `<device dir>/vfio-dev/`: where the kernel offers iommufd, this is the
/// `/dev/vfio/devices/<name>` node a VMM opens instead of the group.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// assert_eq!(gkm_gpu::vfio::iommufd_cdev(dir.path()), None);
/// std::fs::create_dir_all(dir.path().join("vfio-dev/vfio3")).unwrap();
/// assert_eq!(gkm_gpu::vfio::iommufd_cdev(dir.path()).as_deref(), Some("vfio3"));
/// ```
pub fn iommufd_cdev(device_dir: &Path) -> Option<String> {
    sorted_entries(&device_dir.join("vfio-dev"))
        .ok()?
        .into_iter()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| name.starts_with("vfio"))
}

/// The parent PCI address of an mdev link, read from where the link points
/// (without requiring the target to exist).
fn mdev_parent(link: &Path) -> Option<String> {
    let target = std::fs::read_link(link).ok()?;
    let base = link.parent()?;
    let resolved = normalise(&base.join(target));
    let parent = resolved
        .parent()?
        .file_name()?
        .to_string_lossy()
        .into_owned();
    is_pci_address(&parent).then(|| parent.to_ascii_lowercase())
}

/// Removes `.` and `..` components lexically.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
