//! What a container gets for a prepared claim, as a CDI spec: one spec file
//! per claim (kind [`CDI_KIND`]), one CDI device per allocated device,
//! named `<claim UID>-<device name>`. The runtime (containerd with CDI on)
//! applies the edits when the kubelet names the devices.
//!
//! Per device: its own device nodes (`/dev/nvidia<N>`,
//! `/dev/dri/renderD<N>`, `/dev/vfio/<group>` and its iommufd nodes).
//! Per claim (the spec's own edits, applied with any of its devices): the
//! nodes the devices share (`/dev/nvidiactl`, `/dev/nvidia-uvm*`,
//! `/dev/kfd`, `/dev/vfio/vfio`, `/dev/iommu`) and the variables naming
//! every device of the claim: `NVIDIA_VISIBLE_DEVICES` (UUIDs),
//! [`GKM_VFIO_DEVICES`] (PCI addresses), [`GKM_MDEV_UUIDS`].
//!
//! Two claims in one container each set their own variables; the runtime
//! keeps the last, so a container that needs several NVIDIA GPUs asks for
//! them in one claim.

use std::path::{Path, PathBuf};

use gkm_k8s_devices::resources::Access;
use serde::{Deserialize, Serialize};

use crate::devices::DraDevice;

/// The CDI kind (`vendor/class`) of gkm's devices.
pub const CDI_KIND: &str = "gkm.io/gpu";
/// The CDI spec version written: the first with `hostPath` on device nodes.
pub const CDI_VERSION: &str = "0.5.0";
/// The variable listing a claim's VFIO devices by PCI address.
pub const GKM_VFIO_DEVICES: &str = "GKM_VFIO_DEVICES";
/// The variable listing a claim's vGPUs by mdev UUID.
pub const GKM_MDEV_UUIDS: &str = "GKM_MDEV_UUIDS";
/// The variable the NVIDIA container stack reads.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// A CDI spec (the fields gkm writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    /// The spec version, [`CDI_VERSION`].
    pub cdi_version: String,
    /// [`CDI_KIND`].
    pub kind: String,
    /// The devices.
    pub devices: Vec<CdiDevice>,
    /// Edits applied whenever any of the devices is.
    pub container_edits: ContainerEdits,
}

/// A CDI device: its name within the kind, and its edits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    /// The name, `<claim UID>-<device name>`.
    pub name: String,
    /// What it adds to a container.
    pub container_edits: ContainerEdits,
}

/// Edits to a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `NAME=value` variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

/// A bind mount of a host file into the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// On the host.
    pub host_path: PathBuf,
    /// In the container.
    pub container_path: String,
    /// `ro`, `bind`.
    pub options: Vec<String>,
}

/// A device node: where it is in the container and on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// In the container, `/dev/nvidia0`.
    pub path: String,
    /// On the host (under the plugin's `/dev` root).
    pub host_path: PathBuf,
    /// `rw`.
    pub permissions: String,
}

/// The fully qualified CDI device name the kubelet hands the runtime:
/// `gkm.io/gpu=<claim UID>-<device name>`.
pub fn qualified_name(claim_uid: &str, device: &str) -> String {
    format!("{CDI_KIND}={}", device_name(claim_uid, device))
}

fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The CDI device of claim `claim_uid` that bind-mounts request
/// `request`'s metadata file (`host_path`) read-only at `container_path`,
/// named `<claim UID>-metadata-<request>`; returns it and its qualified
/// name. It cannot clash with a device's CDI device: device names start
/// with `gpu-`, `vfio-` or `vgpu-`.
pub fn metadata_device(
    claim_uid: &str,
    request: &str,
    host_path: &Path,
    container_path: &str,
) -> (CdiDevice, String) {
    let name = format!("metadata-{request}");
    (
        CdiDevice {
            name: device_name(claim_uid, &name),
            container_edits: ContainerEdits {
                mounts: vec![Mount {
                    host_path: host_path.to_path_buf(),
                    container_path: container_path.to_string(),
                    options: vec!["ro".to_string(), "bind".to_string()],
                }],
                ..ContainerEdits::default()
            },
        },
        qualified_name(claim_uid, &name),
    )
}

/// The spec file name of a claim, `gkm.io-gpu_<claim UID>.json` (what the
/// CDI library's own writers would name it).
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{}_{claim_uid}.json", CDI_KIND.replace('/', "-"))
}

/// The claim UID of a spec file this driver wrote, from its name.
pub fn claim_of_spec_file(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix(&format!("{}_", CDI_KIND.replace('/', "-")))?
        .strip_suffix(".json")
}

/// The CDI spec of claim `claim_uid` holding `devices`. Device nodes are
/// under `dev_root`; `present` says whether an optional node (one not every
/// driver install has: `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`,
/// `nvidia<N>`, `iommu`) exists there.
pub fn claim_spec(
    claim_uid: &str,
    devices: &[&DraDevice],
    dev_root: &Path,
    present: &dyn Fn(&str) -> bool,
) -> CdiSpec {
    let node = |rel: &str| DeviceNode {
        path: format!("/dev/{rel}"),
        host_path: dev_root.join(rel),
        permissions: "rw".to_string(),
    };
    let iommufd = present("iommu");
    let mut shared: Vec<String> = Vec::new();
    let mut share = |rel: &str| {
        if !shared.iter().any(|s| s == rel) {
            shared.push(rel.to_string());
        }
    };
    let (mut visible, mut vfio, mut mdevs) = (Vec::new(), Vec::new(), Vec::new());
    let mut cdi_devices = Vec::with_capacity(devices.len());
    for device in devices {
        let mut own: Vec<String> = Vec::new();
        match &device.access {
            Access::Nvidia { visible_as, minor } => {
                visible.push(visible_as.clone());
                if let Some(minor) = minor {
                    let rel = format!("nvidia{minor}");
                    if present(&rel) {
                        own.push(rel);
                    }
                }
                for rel in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
                    if present(rel) {
                        share(rel);
                    }
                }
            }
            Access::Amd { render_minor } => {
                share("kfd");
                if let Some(minor) = render_minor {
                    own.push(format!("dri/renderD{minor}"));
                }
            }
            Access::Vfio {
                iommu_group, cdevs, ..
            } => {
                if device.kind == crate::devices::DeviceType::Vgpu {
                    mdevs.push(device.id.clone());
                } else {
                    vfio.push(device.id.clone());
                }
                share("vfio/vfio");
                own.push(format!("vfio/{iommu_group}"));
                if iommufd {
                    share("iommu");
                    own.extend(cdevs.iter().map(|c| format!("vfio/devices/{c}")));
                }
            }
            Access::Share { .. } => {}
        }
        cdi_devices.push(CdiDevice {
            name: device_name(claim_uid, &device.name),
            container_edits: ContainerEdits {
                device_nodes: own.iter().map(|rel| node(rel)).collect(),
                ..ContainerEdits::default()
            },
        });
    }
    let mut env = Vec::new();
    for (name, values) in [
        (NVIDIA_VISIBLE_DEVICES, &visible),
        (GKM_VFIO_DEVICES, &vfio),
        (GKM_MDEV_UUIDS, &mdevs),
    ] {
        if !values.is_empty() {
            env.push(format!("{name}={}", values.join(",")));
        }
    }
    CdiSpec {
        cdi_version: CDI_VERSION.to_string(),
        kind: CDI_KIND.to_string(),
        devices: cdi_devices,
        container_edits: ContainerEdits {
            env,
            device_nodes: shared.iter().map(|rel| node(rel)).collect(),
            mounts: Vec::new(),
        },
    }
}
