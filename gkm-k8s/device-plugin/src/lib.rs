//! gkm's kubelet device plugin: VFIO-passthrough GPUs and mediated vGPUs
//! for KubeVirt virtual machines, and GPUs for containers.
//!
//! # Resources
//!
//! The plugin reads the node's sysfs, `/dev` and `/proc` (each root a
//! parameter, see [`NodePaths`]) and offers:
//!
//! | devices | resource | device IDs | a container gets |
//! | --- | --- | --- | --- |
//! | GPUs bound to `vfio-pci` (or another VFIO driver such as `nvgrace_gpu_vfio_pci`) | one per model: `nvidia.com/` or `amd.com/` + the PCI ID database name, as KubeVirt users know it ([`naming`]) | PCI addresses | `/dev/vfio/vfio`, `/dev/vfio/<group>`, and where the kernel has iommufd `/dev/iommu` and `/dev/vfio/devices/vfioN`; `PCI_RESOURCE_<RESOURCE>` = the addresses |
//! | mdev vGPUs | one per mdev type name (`nvidia.com/GRID_T4-2Q`) | mdev UUIDs | the same VFIO nodes; `MDEV_PCI_RESOURCE_<RESOURCE>` = the UUIDs |
//! | NVIDIA GPUs on `nvidia` | `nvidia.com/gpu` | GPU UUIDs (PCI address when no UUID is known) | `NVIDIA_VISIBLE_DEVICES`, the GPU's `/dev/nvidia*` nodes that exist, CDI names `nvidia.com/gpu=<UUID>` when configured |
//! | AMD GPUs on `amdgpu` | `amd.com/gpu` | PCI addresses | `/dev/kfd` and the GPU's `/dev/dri/renderD*` |
//!
//! With `gpu_shares` ([`PluginConfig::gpu_shares`], `--gpu-shares`),
//! container GPUs are offered in units instead of whole, for gkm's scheduler
//! extender to share them: `gkm.io/gpu-cores` (100 per GPU) and
//! `gkm.io/gpu-memory` (one per MiB, when the memory size is known: NVML on
//! NVIDIA, sysfs on AMD), device IDs `<gpu>-<n>`; a container gets the GPU's
//! devices and variables as above, plus `GKM_GPU_CORES` or
//! `GKM_GPU_MEMORY_MIB` (`<gpu>=<units>`). The kubelet reads at most 4 MiB
//! per `ListAndWatch` message, so memory units stop at 60 000 per node
//! (about 58 GiB); a GPU beyond that gets none, with the reason reported.
//!
//! A GPU is offered under one resource only (or, with shares, one pair): a
//! GPU hosting vGPUs is offered through its vGPU types, not to containers.
//!
//! # IOMMU groups
//!
//! The kernel hands an IOMMU group to one user whole, and refuses a group
//! with a member on a host driver ("group not viable"). So a VFIO-bound GPU
//! whose group holds a function on a host driver (other than VFIO drivers,
//! `pci-stub`, no driver, or a bridge) is not offered, and the reason is
//! logged and written to the status file. The GPU's own audio function in
//! its group is fine once it is on `vfio-pci` too. GPUs sharing a group are
//! allocated together: `preferred` completes groups, and `allocate`
//! refuses a request that would split one.
//!
//! # Health and changes
//!
//! The plugin polls (every `--poll`, 2 s by default) rather than using
//! inotify, because sysfs does not report mdevs being created or removed
//! through inotify. A poll takes the node's cheap fingerprint (device
//! nodes, driver bindings, vGPUs; see [`gkm_k8s_devices::rescan`]) and reads the devices in
//! full only when it moved, a critical XID was recorded, or a minute passed
//! since the last full read. A device whose `/dev/vfio/<group>` (or other device
//! node) is missing is `Unhealthy` until the node returns; vGPUs created or
//! removed appear or disappear in `ListAndWatch`. Where NVML is present, a
//! critical XID (other than 31, 43 and 45, an application's faults) marks the
//! GPU and its vGPUs unhealthy for the life of the plugin; without NVML there
//! are no XID checks and nothing else changes.
//!
//! # The kubelet
//!
//! Each resource is served on its own socket in the kubelet's device-plugins
//! directory (`gkm-<resource>.sock`) and registered through the kubelet's
//! `kubelet.sock` ([`run`]). When the kubelet restarts it removes the
//! plugins' sockets and recreates `kubelet.sock`; the plugin notices either,
//! serves again and registers again.
//!
//! # Placement
//!
//! With `gpu_shares` and a node name, the plugin publishes the GPUs it
//! offers units of in the node annotation `gkm.io/gpu-devices`
//! ([`node_gpus`]), under the IDs its units carry (`<gpu>-<n>`), so the
//! scheduler extender places shares on GPUs the plugin knows.
//!
//! `GetPreferredAllocation` answers with the devices gkm's scheduler
//! extender assigned to the pod the kubelet allocates for (the
//! [`gkm_core::assignment`] annotation, found through [`assignments`]) when
//! it has one and they are available; otherwise it prefers whole IOMMU
//! groups on one NUMA node. For GPU units the assignment names GPUs: the
//! preference is that many free units of each. `Allocate` hands the
//! container exactly the devices the kubelet allocated, never others: an
//! assignment steers the choice among free devices and cannot reach a
//! device another pod holds.
//!
//! Resource names, socket names and the variables KubeVirt reads are
//! decided in [`naming`]:
//!
//! ```
//! use gkm_k8s_device_plugin::naming::{env_var, socket_name};
//! let resource = "nvidia.com/GH100_H100_SXM5_80GB";
//! assert_eq!(socket_name(resource), "gkm-nvidia.com_GH100_H100_SXM5_80GB.sock");
//! assert_eq!(env_var("PCI_RESOURCE", resource), "PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB");
//! ```

mod allocate;
pub mod assignments;
mod error;
pub use gkm_k8s_devices::naming;
pub mod node_gpus;
#[cfg(feature = "testing")]
pub use gkm_k8s_devices::node_tree;
mod plugin;
mod preferred;
pub use gkm_k8s_devices::resources;
mod service;

pub use plugin::{PluginConfig, run};
pub use resources::{NodePaths, Resource, ResourceKind, Snapshot, scan};

pub use error::{Error, Result};
pub use gkm_k8s_kubelet::proto::deviceplugin as proto;

#[cfg(test)]
mod tests;
