//! What a container gets for the devices the kubelet allocated: device
//! nodes, environment variables and CDI device names.

use std::path::Path;

use tonic::Status;

use super::naming;
use super::resources::{Access, NVIDIA_GPU, PluginDevice, Resource, ResourceKind};
use crate::proto::{CdiDevice, ContainerAllocateResponse, DeviceSpec};

/// How allocations are answered beyond what the devices say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocateOptions {
    /// The `/dev` root device nodes are looked up and handed over under.
    pub dev_root: std::path::PathBuf,
    /// Name `nvidia.com/gpu` devices as CDI devices (`nvidia.com/gpu=<UUID>`)
    /// too, for runtimes configured with NVIDIA's CDI specs.
    pub nvidia_cdi: bool,
}

/// The environment variable prefix KubeVirt reads passthrough addresses from.
pub const PCI_RESOURCE: &str = "PCI_RESOURCE";
/// The environment variable prefix KubeVirt reads vGPU UUIDs from.
pub const MDEV_PCI_RESOURCE: &str = "MDEV_PCI_RESOURCE";
/// The environment variable the NVIDIA container runtime reads.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Compute units given per GPU, `<gpu>=<units>,…` (100 units are a GPU).
pub const GKM_GPU_CORES: &str = "GKM_GPU_CORES";
/// Memory given per GPU in MiB, `<gpu>=<MiB>,…`.
pub const GKM_GPU_MEMORY_MIB: &str = "GKM_GPU_MEMORY_MIB";

/// The answer for one container given `ids` of `resource`.
///
/// Refused (the kubelet then fails the pod's admission with this message):
/// an ID the resource does not have (`INVALID_ARGUMENT`), and a passthrough
/// request that takes some but not all GPUs of one IOMMU group
/// (`FAILED_PRECONDITION`), since the group goes to one VM whole.
pub fn allocate(
    resource: &Resource,
    ids: &[String],
    opts: &AllocateOptions,
) -> Result<ContainerAllocateResponse, Status> {
    let mut devices = Vec::with_capacity(ids.len());
    for id in ids {
        let device = resource.device(id).ok_or_else(|| {
            Status::invalid_argument(format!("{}: unknown device {id}", resource.name))
        })?;
        devices.push(device);
    }
    let mut response = ContainerAllocateResponse::default();
    let mut specs = Specs {
        dev_root: &opts.dev_root,
        specs: Vec::new(),
    };
    match resource.kind {
        ResourceKind::Passthrough | ResourceKind::Mdev => {
            check_whole_groups(resource, ids, &devices)?;
            if !devices.is_empty() {
                specs.add("vfio/vfio");
            }
            let iommufd = opts.dev_root.join("iommu").exists();
            if iommufd && !devices.is_empty() {
                specs.add("iommu");
            }
            for device in &devices {
                if let Access::Vfio {
                    iommu_group, cdevs, ..
                } = &device.access
                {
                    specs.add(&format!("vfio/{iommu_group}"));
                    if iommufd {
                        for cdev in cdevs {
                            specs.add(&format!("vfio/devices/{cdev}"));
                        }
                    }
                }
            }
            let prefix = if resource.kind == ResourceKind::Mdev {
                MDEV_PCI_RESOURCE
            } else {
                PCI_RESOURCE
            };
            response
                .envs
                .insert(naming::env_var(prefix, &resource.name), ids.join(","));
        }
        ResourceKind::NvidiaGpu | ResourceKind::AmdGpu => {
            let whole: Vec<&Access> = devices.iter().map(|d| &d.access).collect();
            container_gpus(&whole, opts, &mut response, &mut specs);
        }
        ResourceKind::GpuCores | ResourceKind::GpuMemory => {
            // Units per GPU, GPUs in the order first asked for.
            let mut per_gpu: Vec<(&str, &Access, usize)> = Vec::new();
            for device in &devices {
                if let Access::Share { gpu, whole } = &device.access {
                    match per_gpu.iter_mut().find(|(g, _, _)| g == gpu) {
                        Some(entry) => entry.2 += 1,
                        None => per_gpu.push((gpu, whole, 1)),
                    }
                }
            }
            let whole: Vec<&Access> = per_gpu.iter().map(|(_, a, _)| *a).collect();
            container_gpus(&whole, opts, &mut response, &mut specs);
            let variable = if resource.kind == ResourceKind::GpuCores {
                GKM_GPU_CORES
            } else {
                GKM_GPU_MEMORY_MIB
            };
            let shares: Vec<String> = per_gpu
                .iter()
                .map(|(gpu, _, n)| format!("{gpu}={n}"))
                .collect();
            response.envs.insert(variable.to_string(), shares.join(","));
        }
    }
    response.devices = specs.specs;
    Ok(response)
}

/// What whole container GPUs need: `NVIDIA_VISIBLE_DEVICES`, the NVIDIA
/// device nodes that exist and CDI names; `/dev/kfd` and render nodes.
fn container_gpus(
    gpus: &[&Access],
    opts: &AllocateOptions,
    response: &mut ContainerAllocateResponse,
    specs: &mut Specs<'_>,
) {
    let mut visible = Vec::new();
    for access in gpus {
        match access {
            Access::Nvidia { visible_as, minor } => {
                visible.push(visible_as.clone());
                if let Some(minor) = minor {
                    specs.add_present(&format!("nvidia{minor}"));
                }
                if opts.nvidia_cdi {
                    response.cdi_devices.push(CdiDevice {
                        name: format!("{NVIDIA_GPU}={visible_as}"),
                    });
                }
            }
            Access::Amd { render_minor } => {
                specs.add("kfd");
                if let Some(minor) = render_minor {
                    specs.add(&format!("dri/renderD{minor}"));
                }
            }
            Access::Vfio { .. } | Access::Share { .. } => {}
        }
    }
    if !visible.is_empty() {
        for shared in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
            specs.add_present(shared);
        }
        response
            .envs
            .insert(NVIDIA_VISIBLE_DEVICES.to_string(), visible.join(","));
    }
}

/// Refuses taking part of a group: every GPU of the resource that shares an
/// IOMMU group with a requested one must be requested too.
fn check_whole_groups(
    resource: &Resource,
    ids: &[String],
    devices: &[&PluginDevice],
) -> Result<(), Status> {
    for device in devices {
        if let Some(short) = device
            .access
            .missing_group_peers(|peer| ids.iter().any(|id| id == peer))
        {
            return Err(Status::failed_precondition(format!(
                "{}: {} shares IOMMU group {} with {}; a group goes to one VM whole, so request {} devices that include all of them",
                resource.name,
                device.id,
                short.group,
                short.missing.join(", "),
                short.group_size
            )));
        }
    }
    Ok(())
}

/// Device specs under a `/dev` root, each once, in order.
struct Specs<'a> {
    dev_root: &'a Path,
    specs: Vec<DeviceSpec>,
}

impl Specs<'_> {
    /// Adds `<dev_root>/<rel>` as `/dev/<rel>` in the container.
    fn add(&mut self, rel: &str) {
        let host_path = self.dev_root.join(rel).display().to_string();
        if self.specs.iter().any(|s| s.host_path == host_path) {
            return;
        }
        self.specs.push(DeviceSpec {
            container_path: format!("/dev/{rel}"),
            host_path,
            permissions: "rw".to_string(),
        });
    }

    /// Adds the node only when it exists (optional driver nodes).
    fn add_present(&mut self, rel: &str) {
        if self.dev_root.join(rel).exists() {
            self.add(rel);
        }
    }
}
