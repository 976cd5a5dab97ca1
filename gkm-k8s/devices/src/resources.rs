//! Which devices form which resource: a node's sysfs, `/dev` and `/proc`
//! trees read into the resources the plugin serves, with a reason for every
//! GPU left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use gkm_core::Backend;
use gkm_gpu::pci_ids::PciIds;
use gkm_gpu::{DiscoveryOptions, Inventory, PciIdsSource, VfioDevice};
use serde::Serialize;

use super::naming;

/// Where the plugin looks: the node's sysfs, `/dev` and `/proc` (the real
/// ones on a node; trees a test made in tests). Device nodes are handed to
/// the runtime under `dev_root`, so the plugin must see the host's `/dev` at
/// the same path the host does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePaths {
    /// The sysfs root, `/sys`.
    pub sysfs_root: PathBuf,
    /// The `/dev` root.
    pub dev_root: PathBuf,
    /// The procfs root, `/proc` (for `driver/nvidia/gpus/*/information`).
    pub proc_root: PathBuf,
}

impl Default for NodePaths {
    fn default() -> Self {
        NodePaths {
            sysfs_root: "/sys".into(),
            dev_root: "/dev".into(),
            proc_root: "/proc".into(),
        }
    }
}

/// How a resource's devices reach a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ResourceKind {
    /// GPUs bound to a VFIO driver, for KubeVirt passthrough.
    Passthrough,
    /// Mediated devices (vGPUs) of one type, for KubeVirt.
    Mdev,
    /// `nvidia.com/gpu`: NVIDIA GPUs on the `nvidia` driver, for containers.
    NvidiaGpu,
    /// `amd.com/gpu`: AMD GPUs on `amdgpu`, for containers.
    AmdGpu,
    /// `gkm.io/gpu-cores`: compute shares of container GPUs.
    GpuCores,
    /// `gkm.io/gpu-memory`: memory shares (MiB) of container GPUs.
    GpuMemory,
}

/// What a device needs in a container besides its ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Access {
    /// A VFIO device: its IOMMU group's node, and where the kernel offers
    /// iommufd, the VFIO character devices of the group's VFIO-bound
    /// functions (`vfio3`).
    Vfio {
        /// The IOMMU group.
        iommu_group: u32,
        /// `/dev/vfio/devices/<name>` names.
        cdevs: Vec<String>,
        /// The other devices of the same resource in the same group, which
        /// must be allocated with this one.
        group_peers: Vec<String>,
    },
    /// An NVIDIA GPU for containers.
    Nvidia {
        /// What `NVIDIA_VISIBLE_DEVICES` names it by: its UUID, or its PCI
        /// address when no UUID is known.
        visible_as: String,
        /// Its `/dev/nvidia<minor>`, when known.
        minor: Option<u32>,
    },
    /// An AMD GPU for containers.
    Amd {
        /// Its `/dev/dri/renderD<minor>`, when known.
        render_minor: Option<u32>,
    },
    /// One unit of a container GPU's compute or memory.
    Share {
        /// The GPU's own ID (UUID or PCI address).
        gpu: String,
        /// What the whole GPU needs in a container.
        whole: Box<Access>,
    },
}

/// The peers of a VFIO device's IOMMU group an allocation leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingPeers<'a> {
    /// The IOMMU group.
    pub group: u32,
    /// The peers left out (their IDs).
    pub missing: Vec<&'a str>,
    /// How many devices the group has: what must be allocated together.
    pub group_size: usize,
}

impl Access {
    /// For a VFIO device sharing its IOMMU group with other devices: the
    /// peers `taken` does not hold, when any. A group goes to one VM whole,
    /// so an allocation missing some is refused.
    pub fn missing_group_peers(&self, taken: impl Fn(&str) -> bool) -> Option<MissingPeers<'_>> {
        let Access::Vfio {
            iommu_group,
            group_peers,
            ..
        } = self
        else {
            return None;
        };
        let missing: Vec<&str> = group_peers
            .iter()
            .map(String::as_str)
            .filter(|peer| !taken(peer))
            .collect();
        (!missing.is_empty()).then(|| MissingPeers {
            group: *iommu_group,
            missing,
            group_size: group_peers.len() + 1,
        })
    }
}

/// One device the plugin offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginDevice {
    /// The device ID the kubelet sees: a PCI address, an mdev UUID or a GPU
    /// UUID.
    pub id: String,
    /// The PCI address of the GPU (the parent GPU, for a vGPU).
    pub pci_address: String,
    /// NUMA node, when the platform reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Why it is unhealthy; `None` when healthy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhealthy: Option<String>,
    /// What a container needs to use it.
    pub access: Access,
}

/// One extended resource and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    /// `nvidia.com/GH100_H100_SXM5_80GB`, `nvidia.com/gpu`…
    pub name: String,
    /// How its devices are handed over.
    pub kind: ResourceKind,
    /// Its devices, in ID order.
    pub devices: Vec<PluginDevice>,
}

impl Resource {
    /// Whether its devices are units of GPUs (`gkm.io/gpu-cores`,
    /// `gkm.io/gpu-memory`) rather than whole devices.
    pub fn is_units(&self) -> bool {
        matches!(self.kind, ResourceKind::GpuCores | ResourceKind::GpuMemory)
    }

    /// The device with this ID (devices are kept in ID order).
    pub fn device(&self, id: &str) -> Option<&PluginDevice> {
        self.devices
            .binary_search_by(|d| d.id.as_str().cmp(id))
            .ok()
            .and_then(|i| self.devices.get(i))
    }

    /// How many devices are healthy.
    pub fn healthy(&self) -> usize {
        self.devices
            .iter()
            .filter(|d| d.unhealthy.is_none())
            .count()
    }
}

/// A GPU the plugin does not offer, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Excluded {
    /// The PCI address (or mdev UUID).
    pub device: String,
    /// Why, in words an operator can act on.
    pub reason: String,
}

/// Everything one look at the node found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The resources, by name.
    pub resources: BTreeMap<String, Resource>,
    /// GPUs not offered, with reasons.
    pub excluded: Vec<Excluded>,
    /// Problems discovery met that did not stop it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Snapshot {
    /// Records that `device` is not offered, and why.
    fn exclude(&mut self, device: impl Into<String>, reason: String) {
        self.excluded.push(Excluded {
            device: device.into(),
            reason,
        });
    }
}

/// What the plugin knows and wants besides the trees: what NVML reported,
/// and whether container GPUs are offered in shares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanInputs {
    /// PCI address → UUID, from NVML.
    pub nvml_uuids: BTreeMap<String, String>,
    /// PCI address → device memory in bytes, from NVML.
    pub nvml_memory: BTreeMap<String, u64>,
    /// PCI address → the XID that made it unhealthy.
    pub xids: BTreeMap<String, String>,
    /// Offer container GPUs as [`GPU_CORES`] and [`GPU_MEMORY`] units
    /// instead of whole (`nvidia.com/gpu`, `amd.com/gpu`).
    pub gpu_shares: bool,
}

impl ScanInputs {
    /// Records a critical XID NVML reported: its GPU (every GPU of
    /// `all_gpus`, PCI addresses, when NVML could not say which) is
    /// unhealthy from now on. Returns whether it was recorded (an XID that
    /// is an application's fault is not).
    pub fn record_xid(
        &mut self,
        event: &gkm_gpu::nvidia::XidEvent,
        all_gpus: impl IntoIterator<Item = String>,
    ) -> bool {
        let xid = event
            .xid
            .map_or_else(|| "unknown".to_string(), |x| x.to_string());
        if !event.is_critical() {
            return false;
        }
        match &event.pci_address {
            Some(address) => {
                self.xids.insert(address.clone(), xid);
            }
            None => {
                for address in all_gpus {
                    self.xids.insert(address, xid.clone());
                }
            }
        }
        true
    }
}

/// Shares of a GPU's compute: 100 units per GPU, IDs `<gpu>-<n>`.
pub const GPU_CORES: &str = "gkm.io/gpu-cores";
/// Shares of a GPU's memory: one unit per MiB, IDs `<gpu>-<n>`.
pub const GPU_MEMORY: &str = "gkm.io/gpu-memory";
/// The most units one resource may list: the kubelet reads `ListAndWatch`
/// messages of at most 4 MiB, about 60 bytes a device.
pub const MAX_UNITS: u64 = 60_000;

/// Reads the node into resources. Only a sysfs root with no PCI bus is an
/// error; anything odd about one device leaves it out with a reason.
///
/// `ids` names passthrough models (the PCI ID database, read once).
pub fn scan(
    paths: &NodePaths,
    ids: &PciIds,
    inputs: &ScanInputs,
) -> Result<Snapshot, gkm_gpu::Error> {
    let inventory = gkm_gpu::discover(&DiscoveryOptions {
        sysfs_root: paths.sysfs_root.clone(),
        nvml: false,
        simulate: None,
        pci_ids: PciIdsSource::Bundled,
    })?;
    Ok(from_inventory(paths, ids, inputs, inventory))
}

/// [`scan`] on an inventory already discovered, for callers that need the
/// inventory too (the DRA plugin describes devices with it).
pub fn from_inventory(
    paths: &NodePaths,
    ids: &PciIds,
    inputs: &ScanInputs,
    inventory: Inventory,
) -> Snapshot {
    let mut snapshot = Snapshot {
        warnings: inventory.warnings.clone(),
        ..Snapshot::default()
    };
    let iommufd = paths.dev_root.join("iommu").exists();
    passthrough(paths, ids, iommufd, &inventory, &mut snapshot);
    vgpus(paths, iommufd, inputs, &inventory, &mut snapshot);
    container_gpus(paths, inputs, &inventory, &mut snapshot);
    for resource in snapshot.resources.values_mut() {
        resource.devices.sort_by(|a, b| a.id.cmp(&b.id));
    }
    snapshot
}

fn pci_dir(paths: &NodePaths, address: &str) -> PathBuf {
    paths.sysfs_root.join("bus/pci/devices").join(address)
}

/// Unhealthy when the group's `/dev/vfio/<group>` is missing.
fn group_node_health(paths: &NodePaths, group: u32) -> Option<String> {
    let node = paths.dev_root.join("vfio").join(group.to_string());
    (!node.exists()).then(|| format!("{} is missing", node.display()))
}

fn passthrough(
    paths: &NodePaths,
    ids: &PciIds,
    iommufd: bool,
    inventory: &Inventory,
    snapshot: &mut Snapshot,
) {
    // Resource name and device per offered GPU, keyed by group.
    let mut by_group: BTreeMap<u32, Vec<(String, PluginDevice)>> = BTreeMap::new();
    for v in &inventory.vfio {
        let Some(domain) = naming::vendor_domain(v.vendor) else {
            snapshot.exclude(
                v.pci_address.clone(),
                format!(
                    "{} {} is from a vendor gkm names no resources for",
                    v.pci_id, v.product
                ),
            );
            continue;
        };
        let Some(group) = v.iommu_group else {
            snapshot.exclude(
                v.pci_address.clone(),
                format!(
                    "{} is bound to {} but has no IOMMU group (is the IOMMU on?)",
                    v.pci_address, v.driver
                ),
            );
            continue;
        };
        if !v.group_viable {
            snapshot.exclude(v.pci_address.clone(), not_viable_reason(v, group));
            continue;
        }
        let (vendor_id, device_id) = split_pci_id(&v.pci_id);
        let model = naming::model_name(ids.device(vendor_id, device_id), device_id);
        let mut cdevs = Vec::new();
        if iommufd {
            let vfio_members = v.group_members.iter().filter(|m| {
                m.driver
                    .as_deref()
                    .is_some_and(gkm_gpu::pci::is_vfio_driver)
            });
            let addresses = std::iter::once(v.pci_address.as_str())
                .chain(vfio_members.map(|m| m.pci_address.as_str()));
            cdevs = addresses
                .filter_map(|a| gkm_gpu::vfio::iommufd_cdev(&pci_dir(paths, a)))
                .collect();
        }
        by_group.entry(group).or_default().push((
            format!("{domain}/{model}"),
            PluginDevice {
                id: v.pci_address.clone(),
                pci_address: v.pci_address.clone(),
                numa_node: v.numa_node,
                unhealthy: group_node_health(paths, group),
                access: Access::Vfio {
                    iommu_group: group,
                    cdevs,
                    group_peers: Vec::new(),
                },
            },
        ));
    }
    for (group, gpus) in by_group {
        let names: BTreeSet<&str> = gpus.iter().map(|(n, _)| n.as_str()).collect();
        if names.len() > 1 {
            let models = names.into_iter().collect::<Vec<_>>().join(", ");
            for (_, dev) in &gpus {
                snapshot.exclude(dev.id.clone(), format!(
                        "IOMMU group {group} holds GPUs of different models ({models}); one VM must take the whole group"
                    ));
            }
            continue;
        }
        let peers: Vec<String> = gpus.iter().map(|(_, d)| d.id.clone()).collect();
        for (name, mut dev) in gpus {
            if let Access::Vfio { group_peers, .. } = &mut dev.access {
                *group_peers = peers.iter().filter(|p| **p != dev.id).cloned().collect();
            }
            add(snapshot, &name, ResourceKind::Passthrough, dev);
        }
    }
}

/// Why a VFIO-bound GPU's group cannot be passed through: the members on
/// host drivers.
fn not_viable_reason(v: &VfioDevice, group: u32) -> String {
    let blocking: Vec<String> = v
        .group_members
        .iter()
        .filter(|m| !m.allows_passthrough())
        .map(|m| {
            format!(
                "{} ({}) on {}",
                m.pci_address,
                m.name,
                m.driver.as_deref().unwrap_or("no driver")
            )
        })
        .collect();
    format!(
        "IOMMU group {group} is not viable: {} must be bound to vfio-pci (or unbound) before {} can be passed through",
        blocking.join(", "),
        v.pci_address
    )
}

/// `10de:2330` → (0x10de, 0x2330); zeros when malformed.
fn split_pci_id(pci_id: &str) -> (u16, u16) {
    let (v, d) = pci_id.split_once(':').unwrap_or(("0", "0"));
    (
        u16::from_str_radix(v, 16).unwrap_or(0),
        u16::from_str_radix(d, 16).unwrap_or(0),
    )
}

fn vgpus(
    paths: &NodePaths,
    iommufd: bool,
    inputs: &ScanInputs,
    inventory: &Inventory,
    snapshot: &mut Snapshot,
) {
    for m in &inventory.mdevs {
        let parent = inventory
            .gpus
            .iter()
            .find(|g| g.pci_address.as_deref() == Some(&m.parent_address));
        let Some(domain) = parent.and_then(|g| naming::vendor_domain(g.vendor)) else {
            snapshot.exclude(
                m.uuid.clone(),
                format!(
                    "vGPU {}: its parent {} is not a GPU gkm knows",
                    m.uuid, m.parent_address
                ),
            );
            continue;
        };
        let Some(group) = m.iommu_group else {
            snapshot.exclude(
                m.uuid.clone(),
                format!("vGPU {} has no IOMMU group", m.uuid),
            );
            continue;
        };
        let name = format!(
            "{domain}/{}",
            naming::mdev_name(m.type_name.as_deref(), &m.type_id)
        );
        let cdevs = if iommufd {
            let dir = paths.sysfs_root.join("bus/mdev/devices").join(&m.uuid);
            gkm_gpu::vfio::iommufd_cdev(&dir).into_iter().collect()
        } else {
            Vec::new()
        };
        let unhealthy = group_node_health(paths, group).or_else(|| {
            inputs
                .xids
                .get(&m.parent_address)
                .map(|xid| format!("its GPU {} reported XID {xid}", m.parent_address))
        });
        let numa_node = parent.and_then(|g| g.numa_node);
        add(
            snapshot,
            &name,
            ResourceKind::Mdev,
            PluginDevice {
                id: m.uuid.clone(),
                pci_address: m.parent_address.clone(),
                numa_node,
                unhealthy,
                access: Access::Vfio {
                    iommu_group: group,
                    cdevs,
                    group_peers: Vec::new(),
                },
            },
        );
    }
}

/// The resource name of NVIDIA GPUs for containers.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// The resource name of AMD GPUs for containers.
pub const AMD_GPU: &str = "amd.com/gpu";

fn container_gpus(
    paths: &NodePaths,
    inputs: &ScanInputs,
    inventory: &Inventory,
    snapshot: &mut Snapshot,
) {
    let vgpu_parents: BTreeSet<&str> = inventory
        .mdevs
        .iter()
        .map(|m| m.parent_address.as_str())
        .collect();
    let mut kfd = None;
    for gpu in &inventory.gpus {
        let (Some(backend), Some(address)) = (gpu.backend, gpu.pci_address.as_deref()) else {
            continue;
        };
        if matches!(backend, Backend::Cuda | Backend::Hip)
            && (vgpu_parents.contains(address)
                || pci_dir(paths, address)
                    .join("mdev_supported_types")
                    .exists())
        {
            snapshot.exclude(address.to_string(), format!(
                    "{address} hosts vGPUs (it has mdev types); it is offered through its vGPU types, not to containers"
                ));
            continue;
        }
        match backend {
            Backend::Cuda => {
                let proc_info = gkm_gpu::nvidia::proc_info(&paths.proc_root, address);
                let uuid = inputs
                    .nvml_uuids
                    .get(address)
                    .cloned()
                    .or(gpu.uuid.clone())
                    .or_else(|| proc_info.as_ref().and_then(|p| p.uuid.clone()));
                let minor = proc_info.and_then(|p| p.minor);
                let mut unhealthy = inputs
                    .xids
                    .get(address)
                    .map(|xid| format!("NVML reported XID {xid}"));
                if let Some(minor) = minor {
                    let node = paths.dev_root.join(format!("nvidia{minor}"));
                    if unhealthy.is_none() && !node.exists() {
                        unhealthy = Some(format!("{} is missing", node.display()));
                    }
                }
                let id = uuid.clone().unwrap_or_else(|| address.to_string());
                let memory = inputs
                    .nvml_memory
                    .get(address)
                    .copied()
                    .or(gpu.memory_bytes);
                offer(
                    snapshot,
                    inputs,
                    (NVIDIA_GPU, ResourceKind::NvidiaGpu),
                    memory,
                    PluginDevice {
                        id: id.clone(),
                        pci_address: address.to_string(),
                        numa_node: gpu.numa_node,
                        unhealthy,
                        access: Access::Nvidia {
                            visible_as: id,
                            minor,
                        },
                    },
                );
            }
            Backend::Hip => {
                let topology = kfd.get_or_insert_with(|| {
                    gkm_gpu::amd::read_topology(&paths.sysfs_root, &mut Vec::new())
                });
                let render_minor = topology
                    .iter()
                    .find(|n| n.pci_address == address)
                    .and_then(|n| n.drm_render_minor)
                    .or_else(|| render_minor_in_sysfs(&pci_dir(paths, address)));
                let kfd_node = paths.dev_root.join("kfd");
                let render = render_minor.map(|m| paths.dev_root.join(format!("dri/renderD{m}")));
                let unhealthy = [Some(kfd_node), render]
                    .into_iter()
                    .flatten()
                    .find(|p| !p.exists())
                    .map(|p| format!("{} is missing", p.display()));
                offer(
                    snapshot,
                    inputs,
                    (AMD_GPU, ResourceKind::AmdGpu),
                    gpu.memory_bytes,
                    PluginDevice {
                        id: address.to_string(),
                        pci_address: address.to_string(),
                        numa_node: gpu.numa_node,
                        unhealthy,
                        access: Access::Amd { render_minor },
                    },
                );
            }
            Backend::Xpu | Backend::Hpu => {}
        }
    }
}

/// The render node minor from `<device>/drm/renderD<minor>`, for when KFD
/// does not say.
fn render_minor_in_sysfs(device_dir: &std::path::Path) -> Option<u32> {
    std::fs::read_dir(device_dir.join("drm"))
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("renderD")?
                .parse()
                .ok()
        })
}

/// Offers a container GPU whole, or with `gpu_shares` as 100 compute units
/// and one memory unit per MiB (when its memory size is known and the units
/// fit in a kubelet message).
fn offer(
    snapshot: &mut Snapshot,
    inputs: &ScanInputs,
    (whole_name, whole_kind): (&str, ResourceKind),
    memory_bytes: Option<u64>,
    device: PluginDevice,
) {
    if !inputs.gpu_shares {
        add(snapshot, whole_name, whole_kind, device);
        return;
    }
    let memory_mib = memory_bytes.map(|b| b >> 20);
    let already = snapshot
        .resources
        .get(GPU_MEMORY)
        .map_or(0, |r| r.devices.len() as u64);
    let memory_units = match memory_mib {
        Some(mib) if already + mib <= MAX_UNITS => mib,
        Some(mib) => {
            snapshot.exclude(
                device.id.clone(),
                format!(
                    "{}: {mib} MiB would make {GPU_MEMORY} list more than {MAX_UNITS} units, more than the kubelet reads in one message; no memory units for it",
                    device.id
                ),
            );
            0
        }
        None => {
            snapshot.exclude(
                device.id.clone(),
                format!(
                    "{}: its memory size is unknown (NVIDIA GPUs need NVML for it); no {GPU_MEMORY} units for it",
                    device.id
                ),
            );
            0
        }
    };
    for (name, kind, units) in [
        (GPU_CORES, ResourceKind::GpuCores, 100),
        (GPU_MEMORY, ResourceKind::GpuMemory, memory_units),
    ] {
        for n in 0..units {
            add(
                snapshot,
                name,
                kind,
                PluginDevice {
                    id: gkm_core::assignment::unit_id(&device.id, n),
                    access: Access::Share {
                        gpu: device.id.clone(),
                        whole: Box::new(device.access.clone()),
                    },
                    ..device.clone()
                },
            );
        }
    }
}

fn add(snapshot: &mut Snapshot, name: &str, kind: ResourceKind, device: PluginDevice) {
    snapshot
        .resources
        .entry(name.to_string())
        .or_insert_with(|| Resource {
            name: name.to_string(),
            kind,
            devices: Vec::new(),
        })
        .devices
        .push(device);
}
