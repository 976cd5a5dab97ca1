//! What discovery found on a node.

use gkm_core::{Gpu, Vendor};
use serde::{Deserialize, Serialize};

/// A node's GPUs, passthrough devices and vGPUs, with anything that looked
/// wrong while finding them.
///
/// This is what [`crate::discover`] returns, what `gkm gpus --json` prints
/// and, read back, what a simulated inventory file may contain.
///
/// ```
/// let inventory: gkm_gpu::Inventory = serde_json::from_str(
///     r#"{"gpus":[{"index":0,"vendor":"nvidia","product":"Tesla T4","backend":"cuda","arch":"75","warpSize":32}]}"#,
/// ).unwrap();
/// assert_eq!(inventory.gpus[0].describe(), "0 Tesla T4 (cuda/75/32)");
/// assert!(inventory.warnings.is_empty());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// GPUs and accelerators the host drives, in PCI address order. A device
    /// with no compute driver bound is listed with no backend.
    pub gpus: Vec<Gpu>,
    /// GPUs bound to a VFIO driver for passthrough into virtual machines.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vfio: Vec<VfioDevice>,
    /// Mediated devices (vGPUs) created on the node's GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mdevs: Vec<MdevDevice>,
    /// The vector ISA PyTorch Inductor picks on the node's CPU (`avx2`,
    /// `avx512`, `asimd`…), what CPU-only PyTorch caches are judged by;
    /// `None` when unknown. A simulated inventory file's `cpuIsa`; discovery
    /// over sysfs leaves it to the caller, which reads this host's
    /// (`gkm_core::compat::host_cpu_isa`, as the node agent does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_isa: Option<String>,
    /// Whether this inventory came from a simulated inventory file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    /// What NVML said, if it was asked.
    #[serde(default)]
    pub nvml: NvmlStatus,
    /// Problems that did not stop discovery: unreadable or malformed sysfs
    /// entries, devices NVML and sysfs disagree on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Inventory {
    /// The GPUs that can run kernels (those with a backend).
    pub fn usable_gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(|g| g.backend.is_some())
    }
}

/// The outcome of asking NVML for NVIDIA GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum NvmlStatus {
    /// NVML was not asked (disabled, or the inventory is simulated).
    #[default]
    NotChecked,
    /// No NVIDIA driver here: the library is missing or the kernel driver is
    /// not loaded. Not an error.
    NoDriver {
        /// What NVML reported.
        reason: String,
    },
    /// NVML loaded and answered.
    #[serde(rename_all = "camelCase")]
    Loaded {
        /// The kernel driver version, `550.54.15`.
        driver_version: String,
        /// The highest CUDA version the driver supports, `12.4`.
        cuda_driver_version: Option<String>,
        /// How many devices NVML reported.
        device_count: u32,
    },
    /// NVML loaded but failed (no permission, a lost GPU…).
    Failed {
        /// What NVML reported.
        reason: String,
    },
}

/// A GPU bound to a VFIO driver (`vfio-pci`, `nvgrace_gpu_vfio_pci`) for
/// passthrough, with the IOMMU group that must be passed through with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioDevice {
    /// PCI address, `dddd:bb:dd.f`.
    pub pci_address: String,
    /// Who made it.
    pub vendor: Vendor,
    /// PCI vendor and device id, `10de:2330`.
    pub pci_id: String,
    /// Name from the PCI IDs database.
    pub product: String,
    /// The VFIO driver it is bound to.
    pub driver: String,
    /// NUMA node, when the platform reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// IOMMU group number, `None` when the IOMMU is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    /// The other PCI functions in the same IOMMU group (often the GPU's audio
    /// function); all of them go to the same virtual machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_members: Vec<PciFunction>,
    /// Whether the group can be passed through as it is: every other member
    /// is bound to a VFIO driver, to `pci-stub`, to no driver, or is a bridge.
    pub group_viable: bool,
}

/// A PCI function sharing an IOMMU group with a [`VfioDevice`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciFunction {
    /// PCI address, `dddd:bb:dd.f`.
    pub pci_address: String,
    /// PCI vendor and device id, `10de:22e8`.
    pub pci_id: String,
    /// PCI class code, `0x040300`.
    pub class: String,
    /// Name from the PCI IDs database.
    pub name: String,
    /// The driver bound to it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
}

impl PciFunction {
    /// Whether this function lets its IOMMU group be passed through: bound
    /// to a VFIO driver, to `pci-stub` or to no driver, or a PCI bridge.
    /// A function on any other host driver (`snd_hda_intel`, `nvidia`…)
    /// makes the kernel refuse the group ("group not viable").
    pub fn allows_passthrough(&self) -> bool {
        match self.driver.as_deref() {
            None | Some("pci-stub") => true,
            Some(driver) => crate::pci::is_vfio_driver(driver) || self.class.starts_with("0x0604"),
        }
    }
}

/// A mediated device (vGPU) from `/sys/bus/mdev/devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MdevDevice {
    /// The mdev's UUID (its directory name).
    pub uuid: String,
    /// PCI address of the parent GPU.
    pub parent_address: String,
    /// The mdev type id, `nvidia-222`.
    pub type_id: String,
    /// The type's human name from `mdev_type/name`, `GRID T4-2Q`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// The parent GPU's product name, when the parent was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_product: Option<String>,
    /// IOMMU group of the mdev.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
}
