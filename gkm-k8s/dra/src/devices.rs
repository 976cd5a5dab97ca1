//! Which of a node's devices the driver publishes, under which names and
//! with which attributes: a pure function of what discovery found
//! ([`gkm_gpu::Inventory`]) and how each device reaches a container
//! ([`Snapshot`], as the device plugin hands it too), so both paths agree on
//! what a device is.

use std::collections::BTreeMap;

use gkm_core::Gpu;
use gkm_gpu::Inventory;
use gkm_k8s_devices::Snapshot;
use gkm_k8s_devices::resources::{Access, Excluded, PluginDevice, ResourceKind};
use k8s_openapi::api::resource::v1::DeviceAttribute;
use serde::Serialize;

use crate::version::semver;

pub use gkm_k8s_api::dra::{
    ARCHITECTURE, BACKEND, COMPUTE_CAPABILITY, PCI_BUS_ID, PCIE_ROOT, TOOLKIT_VERSION, WARP_SIZE,
};

/// What kind of device a published device is (attribute `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum DeviceType {
    /// A GPU on its vendor's driver, for containers.
    Gpu,
    /// A GPU bound to a VFIO driver, for a virtual machine.
    Vfio,
    /// A mediated device (vGPU), for a virtual machine.
    Vgpu,
}

impl DeviceType {
    /// The attribute value and the device name prefix: `gpu`, `vfio`, `vgpu`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Vfio => "vfio",
            DeviceType::Vgpu => "vgpu",
        }
    }
}

/// One device the driver publishes in the node's pool.
#[derive(Debug, Clone, PartialEq)]
pub struct DraDevice {
    /// Its name in the pool, a DNS label: `gpu-0000-6e-00-0`,
    /// `vfio-0000-2a-00-0`, `vgpu-<mdev UUID>`.
    pub name: String,
    /// What kind of device it is.
    pub kind: DeviceType,
    /// Its attributes, by key (unqualified keys are in the driver's domain).
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Its memory in bytes, when known (capacity `memory`).
    pub memory_bytes: Option<u64>,
    /// What a container needs to use it.
    pub access: Access,
    /// Its ID on the node: the PCI address of a VFIO device, a vGPU's UUID,
    /// the UUID (or PCI address) `NVIDIA_VISIBLE_DEVICES` names a GPU by.
    pub id: String,
}

/// What the driver publishes for a node, with every device it leaves out
/// and why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeDevices {
    /// The devices, in name order.
    pub devices: Vec<DraDevice>,
    /// Devices left out, with reasons an operator can act on.
    pub excluded: Vec<Excluded>,
}

impl NodeDevices {
    /// The device named `name`.
    pub fn device(&self, name: &str) -> Option<&DraDevice> {
        self.devices.iter().find(|d| d.name == name)
    }
}

/// The devices of a node: every healthy GPU, VFIO-bound GPU and vGPU of
/// `snapshot` (its GPU units are not devices here), described with what
/// `inventory` knows about it. `pcie_roots` maps PCI addresses to their
/// root complex (`pci0000:00`), read from sysfs by the caller.
///
/// Left out, with the reason: what the snapshot leaves out (a VFIO group
/// that is not viable, a GPU hosting vGPUs…) and unhealthy devices (a
/// missing device node).
pub fn node_devices(
    inventory: &Inventory,
    snapshot: &Snapshot,
    pcie_roots: &BTreeMap<String, String>,
) -> NodeDevices {
    let mut out = NodeDevices {
        excluded: snapshot.excluded.clone(),
        ..NodeDevices::default()
    };
    for resource in snapshot.resources.values() {
        let kind = match resource.kind {
            ResourceKind::NvidiaGpu | ResourceKind::AmdGpu => DeviceType::Gpu,
            ResourceKind::Passthrough => DeviceType::Vfio,
            ResourceKind::Mdev => DeviceType::Vgpu,
            ResourceKind::GpuCores | ResourceKind::GpuMemory => continue,
        };
        for device in &resource.devices {
            if let Some(reason) = &device.unhealthy {
                out.excluded.push(Excluded {
                    device: device.id.clone(),
                    reason: format!("{} is unhealthy: {reason}", device.id),
                });
                continue;
            }
            out.devices
                .push(describe(kind, device, inventory, pcie_roots));
        }
    }
    out.devices.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn describe(
    kind: DeviceType,
    device: &PluginDevice,
    inventory: &Inventory,
    pcie_roots: &BTreeMap<String, String>,
) -> DraDevice {
    let mut attrs = Attributes::default();
    attrs.string("type", kind.as_str());
    let address = device.pci_address.as_str();
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.pci_address.as_deref() == Some(address));
    let mut memory_bytes = None;
    let name = match kind {
        DeviceType::Gpu => {
            attrs.string(PCI_BUS_ID, address);
            if let Some(gpu) = gpu {
                // The UUID `NVIDIA_VISIBLE_DEVICES` names it by (NVML's when
                // NVML answered); it is its PCI address when none is known.
                let uuid = match &device.access {
                    Access::Nvidia { visible_as, .. } if visible_as != address => {
                        Some(visible_as.as_str())
                    }
                    _ => gpu.uuid.as_deref(),
                };
                describe_gpu(gpu, uuid, &mut attrs);
                memory_bytes = gpu.memory_bytes;
            }
            format!("gpu-{}", label(address))
        }
        DeviceType::Vfio => {
            attrs.string(PCI_BUS_ID, address);
            if let Some(v) = inventory.vfio.iter().find(|v| v.pci_address == address) {
                attrs.string("vendor", v.vendor.as_str());
                attrs.string("productName", &v.product);
                attrs.string("pciId", &v.pci_id);
                attrs.string("vfioDriver", &v.driver);
            }
            if let Access::Vfio { iommu_group, .. } = &device.access {
                attrs.int("iommuGroup", i64::from(*iommu_group));
            }
            format!("vfio-{}", label(address))
        }
        DeviceType::Vgpu => {
            attrs.string("mdevUUID", &device.id);
            attrs.string("parentPciBusID", address);
            if let Some(m) = inventory.mdevs.iter().find(|m| m.uuid == device.id) {
                attrs.string("mdevType", &m.type_id);
                if let Some(name) = &m.type_name {
                    attrs.string("mdevTypeName", name);
                }
                if let Some(product) = &m.parent_product {
                    attrs.string("parentProductName", product);
                }
            }
            if let Some(gpu) = gpu {
                attrs.string("vendor", gpu.vendor.as_str());
            }
            if let Access::Vfio { iommu_group, .. } = &device.access {
                attrs.int("iommuGroup", i64::from(*iommu_group));
            }
            format!("vgpu-{}", label(&device.id))
        }
    };
    if let Some(root) = pcie_roots.get(address) {
        attrs.string(PCIE_ROOT, root);
    }
    if let Some(numa) = device.numa_node {
        attrs.int("numaNode", i64::from(numa));
    }
    DraDevice {
        name,
        kind,
        attributes: attrs.0,
        memory_bytes,
        access: device.access.clone(),
        id: device.id.clone(),
    }
}

/// A container GPU's own attributes, as its device publishes them: who
/// made it, what it is, which compiler targets it and which driver runs it.
pub fn gpu_attributes(gpu: &Gpu) -> BTreeMap<String, DeviceAttribute> {
    let mut attrs = Attributes::default();
    describe_gpu(gpu, gpu.uuid.as_deref(), &mut attrs);
    attrs.0
}

/// [`gpu_attributes`], into `attrs`, with `uuid` as the GPU's UUID.
fn describe_gpu(gpu: &Gpu, uuid: Option<&str>, attrs: &mut Attributes) {
    attrs.string("vendor", gpu.vendor.as_str());
    attrs.string("productName", &gpu.product);
    if let Some(backend) = gpu.backend {
        attrs.string(BACKEND, backend.as_str());
    }
    if let Some(arch) = &gpu.arch {
        attrs.string(
            ARCHITECTURE,
            &arch.sm_name().unwrap_or_else(|| arch.to_string()),
        );
        if let Some((major, minor)) = arch.compute_capability() {
            attrs.version(COMPUTE_CAPABILITY, &format!("{major}.{minor}"));
        }
    }
    if let Some(warp) = gpu.warp_size {
        attrs.int(WARP_SIZE, i64::from(warp));
    }
    if let Some(driver) = &gpu.driver_version {
        attrs.version("driverVersion", driver);
    }
    if let Some(toolkit) = &gpu.toolkit_version {
        attrs.version(TOOLKIT_VERSION, toolkit);
    }
    if let Some(uuid) = uuid {
        attrs.string("uuid", uuid);
    }
}

/// `0000:6e:00.0` → `0000-6e-00-0`: a DNS label part (lowercase letters,
/// digits and dashes).
fn label(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// Attributes being collected.
#[derive(Default)]
struct Attributes(BTreeMap<String, DeviceAttribute>);

impl Attributes {
    fn string(&mut self, key: &str, value: &str) {
        if !value.is_empty() {
            self.put(
                key,
                DeviceAttribute {
                    string: Some(value.to_string()),
                    ..DeviceAttribute::default()
                },
            );
        }
    }

    fn int(&mut self, key: &str, value: i64) {
        self.put(
            key,
            DeviceAttribute {
                int: Some(value),
                ..DeviceAttribute::default()
            },
        );
    }

    /// A version attribute, when `value` reads as one (else left out:
    /// a version the apiserver would refuse must not hide the device).
    fn version(&mut self, key: &str, value: &str) {
        if let Some(version) = semver(value) {
            self.put(
                key,
                DeviceAttribute {
                    version: Some(version),
                    ..DeviceAttribute::default()
                },
            );
        }
    }

    fn put(&mut self, key: &str, value: DeviceAttribute) {
        self.0.insert(key.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_dns_label_parts() {
        assert_eq!(label("0000:6E:00.0"), "0000-6e-00-0");
        assert_eq!(
            label("0b1c5e8a-1111-4d2e-9c3a-000000000001"),
            "0b1c5e8a-1111-4d2e-9c3a-000000000001"
        );
    }
}
