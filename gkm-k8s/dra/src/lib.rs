//! gkm's kubelet DRA plugin: the node side of Dynamic Resource Allocation
//! (`resource.k8s.io/v1`) for the driver [`DRIVER`] (`gpu.gkm.io`).
//!
//! # What it does
//!
//! - **Publishes** the node's devices as ResourceSlices of one pool named
//!   after the node ([`slices`]), owned by the Node: container GPUs with
//!   their model, architecture, compute capability, driver and toolkit
//!   versions and memory; GPUs bound to VFIO with their IOMMU group; mdev
//!   vGPUs with their type and parent ([`devices`]). Republished when the
//!   devices change or the slices go (the kubelet wipes them when it
//!   starts), deleted when the plugin stops (`publish`).
//! - **Prepares** claims: the kubelet calls `NodePrepareResources` with
//!   the claims of a pod; the plugin reads each ResourceClaim's allocation,
//!   picks its own devices (`prepare`) and writes a CDI spec per claim
//!   (`cdi`) naming what a container gets: `/dev/nvidia<N>`,
//!   `/dev/nvidiactl`, `/dev/nvidia-uvm*` and `NVIDIA_VISIBLE_DEVICES`;
//!   `/dev/kfd` and the render node; `/dev/vfio/<group>` and
//!   `/dev/vfio/vfio`. The kubelet hands the CDI names to the runtime.
//!   Each request also gets a device metadata file (`metadata`, the DRA
//!   device attributes downward API) that virtual machine launchers read
//!   the PCI address or mdev UUID from. A claim taking part of an IOMMU
//!   group is refused.
//! - **Reports health** to the kubelet (`health`): a published device
//!   that goes or fails is reported unhealthy, so pods using it show it in
//!   their status, as it leaves the slice.
//! - **Selects** for others: [`selector`] turns what a cache's targets
//!   require of a GPU into CEL over these attributes, for the operator's
//!   per-cache DeviceClasses.
//! - **Remembers** prepared claims in a checkpoint (`checkpoint`), so a
//!   claim prepared before a kubelet or plugin restart is answered with the
//!   same devices, and its CDI spec is there for the runtime.
//!
//! # Why a binary of its own
//!
//! `gkm-dra-plugin` is not a mode of `gkm-device-plugin`: the kubelet
//! APIs differ (a registration socket in `plugins_registry/` and
//! `DRAPlugin`, against `kubelet.sock` and `DevicePlugin`), so does the API
//! access (ResourceClaims and its node's ResourceSlices, against pods and
//! its Node's annotation), and a GPU must be offered through one of the two
//! paths only, or two pods could get it. A node runs one plugin or the
//! other; both read the node through the same crate
//! ([`gkm_k8s_devices`]), so a device is the same device either way.

mod cdi;
mod checkpoint;
pub mod devices;
mod error;
mod health;
mod metadata;
mod plugin;
mod prepare;
mod publish;
pub use gkm_k8s_api::dra::selector;
pub use gkm_k8s_devices::rescan;
mod service;
pub mod slices;
mod version;

#[cfg(test)]
mod tests;

pub use error::{Error, Result};
pub use plugin::{DraConfig, look, look_with, run};

use gkm_k8s_kubelet::registration::Plugin;

pub use gkm_k8s_api::dra::DRIVER;

/// What the plugin tells the kubelet when it registers: the kubelet picks
/// the first of the services it also speaks.
pub const PLUGIN: Plugin = Plugin {
    kind: "DRAPlugin",
    name: DRIVER,
    versions: &["v1.DRAPlugin", "v1beta1.DRAPlugin"],
};

/// The code generated from the kubelet's DRA protos.
pub mod proto {
    /// The `v1.DRAPlugin` service (package `k8s.io.kubelet.pkg.apis.dra.v1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }

    /// The `v1alpha1.DRAResourceHealth` service (package `v1alpha1`):
    /// device health the kubelet shows in pod status.
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod health {
        tonic::include_proto!("v1alpha1");
    }

    /// The `v1beta1.DRAPlugin` service (package
    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`).
    #[allow(missing_docs, clippy::all, clippy::pedantic)]
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}
