//! GPU discovery on a node.
//!
//! [`discover`] lists a node's GPUs in gkm-core's vendor-neutral
//! [`gkm_core::Gpu`] model, from the sysfs PCI tree (the root is a parameter,
//! so captured trees work in tests), NVIDIA's NVML (loaded at run time; no
//! library means no NVIDIA driver, not an error) and AMD's KFD topology, with
//! VFIO passthrough devices and mdev vGPUs alongside. A [`simulate`]d
//! inventory file stands in on clusters without GPUs, [`labels`] turns an
//! inventory into node labels, [`telemetry`] reads each GPU's
//! utilization, memory, temperature, power, clocks and errors, and
//! [`metrics`] serves those readings as Prometheus families.
//!
//! This crate has no OCI or Kubernetes dependency.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("gpus.yaml");
//! std::fs::write(&file, "gpus:\n  - profile: MI300X\n    count: 8\n").unwrap();
//! let inventory = gkm_gpu::discover(&gkm_gpu::DiscoveryOptions {
//!     simulate: Some(file),
//!     ..Default::default()
//! })?;
//! assert_eq!(inventory.gpus.len(), 8);
//! let labels = gkm_gpu::labels::node_labels(&inventory, &Default::default());
//! assert_eq!(labels["gkm.io/gpu.arch"], "gfx942");
//! # Ok::<(), gkm_gpu::Error>(())
//! ```

pub mod amd;
mod discover;
mod error;
mod inventory;
pub mod labels;
pub mod metrics;
pub mod nvidia;
pub mod pci;
pub mod pci_ids;
pub mod report;
pub mod simulate;
pub mod telemetry;
pub mod vfio;

pub use discover::{DiscoveryOptions, discover};
pub use error::Error;
pub use inventory::{Inventory, MdevDevice, NvmlStatus, PciFunction, VfioDevice};
pub use labels::{LabelOptions, node_labels};
pub use pci_ids::PciIdsSource;
