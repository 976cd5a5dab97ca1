//! Putting the sources together: sysfs PCI, KFD, NVML, VFIO and mdev.

use std::path::{Path, PathBuf};

use gkm_core::{Backend, Gpu, Vendor};

use crate::amd::{self, KfdNode};
use crate::inventory::Inventory;
use crate::nvidia::{self, NvmlReport};
use crate::pci::{self, PciDevice, read_trimmed};
use crate::pci_ids::{PciIds, PciIdsSource};
use crate::{Error, simulate, vfio};

/// Where and how [`discover`] looks.
///
/// ```
/// let opts = gkm_gpu::DiscoveryOptions::default();
/// assert_eq!(opts.sysfs_root, std::path::Path::new("/sys"));
/// assert!(opts.nvml);
/// // A captured tree, without NVML:
/// let captured = gkm_gpu::DiscoveryOptions {
///     sysfs_root: "testdata/sysfs/no-gpu".into(),
///     nvml: false,
///     ..Default::default()
/// };
/// assert!(gkm_gpu::discover(&captured)?.gpus.is_empty());
/// # Ok::<(), gkm_gpu::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryOptions {
    /// The sysfs root, `/sys` on a node; a captured tree in tests.
    pub sysfs_root: PathBuf,
    /// Whether to ask NVML (loaded at run time) about NVIDIA GPUs.
    pub nvml: bool,
    /// Read this simulated inventory file instead of looking at the node.
    pub simulate: Option<PathBuf>,
    /// Where PCI device names come from.
    pub pci_ids: PciIdsSource,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        DiscoveryOptions {
            sysfs_root: PathBuf::from("/sys"),
            nvml: true,
            simulate: None,
            pci_ids: PciIdsSource::System,
        }
    }
}

/// Finds the node's GPUs, VFIO passthrough devices and vGPUs.
///
/// With `simulate` set, returns that file's inventory (see
/// [`crate::simulate`]). Otherwise scans `sysfs_root`: PCI functions, AMD's
/// KFD topology, VFIO bindings and mdevs, and NVML when `nvml` is set. A
/// missing NVIDIA library is reported in [`Inventory::nvml`], not as an error;
/// a malformed device is left out with a warning. Only a root that is not a
/// sysfs tree, or an unreadable PCI IDs file that was asked for, is an error.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// std::fs::create_dir_all(dir.path().join("bus/pci/devices")).unwrap();
/// let inventory = gkm_gpu::discover(&gkm_gpu::DiscoveryOptions {
///     sysfs_root: dir.path().into(),
///     nvml: false,
///     ..Default::default()
/// })?;
/// assert!(inventory.gpus.is_empty());
/// # Ok::<(), gkm_gpu::Error>(())
/// ```
pub fn discover(opts: &DiscoveryOptions) -> Result<Inventory, Error> {
    if let Some(path) = &opts.simulate {
        return simulate::load(path);
    }
    let ids = PciIds::open(&opts.pci_ids)?;
    let mut warnings = Vec::new();
    let devices = pci::scan(&opts.sysfs_root, &mut warnings)?;
    let kfd = amd::read_topology(&opts.sysfs_root, &mut warnings);
    let nvml = if opts.nvml {
        nvidia::query()
    } else {
        NvmlReport::default()
    };
    Ok(assemble(
        &opts.sysfs_root,
        &devices,
        &ids,
        &kfd,
        nvml,
        warnings,
    ))
}

/// Which kind of accelerator a PCI function is, if any.
fn accelerator_backend(dev: &PciDevice) -> Option<Backend> {
    match dev.vendor_id {
        0x10de if dev.is_display() => Some(Backend::Cuda),
        // MI300-series parts are processing accelerators (class 0x1200).
        0x1002 if dev.is_display() || dev.is_accelerator() => Some(Backend::Hip),
        0x8086 if dev.is_display() => Some(Backend::Xpu),
        0x1da3 if dev.is_accelerator() => Some(Backend::Hpu),
        _ => None,
    }
}

/// The drivers through which each backend runs kernels.
fn compute_drivers(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Cuda => &["nvidia"],
        Backend::Hip => &["amdgpu"],
        Backend::Xpu => &["i915", "xe"],
        Backend::Hpu => &["habanalabs"],
    }
}

pub(crate) fn assemble(
    root: &Path,
    devices: &[PciDevice],
    ids: &PciIds,
    kfd: &[KfdNode],
    nvml: NvmlReport,
    mut warnings: Vec<String>,
) -> Inventory {
    let mut inventory = Inventory {
        nvml: nvml.status,
        ..Inventory::default()
    };
    warnings.extend(nvml.warnings);
    let mut nvml_gpus = nvml.gpus;
    for dev in devices {
        let Some(kind) = accelerator_backend(dev) else {
            continue;
        };
        if dev.is_vfio() {
            let v = vfio::vfio_device(dev, devices, ids);
            if !v.group_viable {
                warnings.push(format!(
                    "{} is bound to {} but IOMMU group {} has members bound to host drivers; it cannot be passed through as is",
                    v.pci_address,
                    v.driver,
                    v.iommu_group.map_or_else(|| "?".into(), |g| g.to_string())
                ));
            }
            inventory.vfio.push(v);
            continue;
        }
        let bound = dev
            .driver
            .as_deref()
            .is_some_and(|d| compute_drivers(kind).contains(&d));
        let mut gpu = Gpu {
            vendor: Vendor::from_pci_id(dev.vendor_id),
            product: ids.product(dev.vendor_id, dev.device_id),
            backend: bound.then_some(kind),
            pci_address: Some(dev.address.clone()),
            pci_id: Some(dev.pci_id()),
            kernel_driver: dev.driver.clone(),
            numa_node: dev.numa_node,
            driver_version: dev.driver.as_deref().and_then(|d| module_version(root, d)),
            ..Gpu::default()
        };
        match (&dev.driver, bound) {
            (None, _) => warnings.push(format!(
                "{} {} has no driver bound; no {kind} kernels can run on it",
                dev.address, gpu.product
            )),
            (Some(driver), false) => warnings.push(format!(
                "{} {} is bound to {driver}, not {}; no {kind} kernels can run on it",
                dev.address,
                gpu.product,
                compute_drivers(kind).join(" or ")
            )),
            _ => {}
        }
        match kind {
            Backend::Cuda => nvidia::enrich(&mut gpu, dev, &mut nvml_gpus, &inventory.nvml),
            Backend::Hip => amd::enrich(&mut gpu, dev, kfd, bound, &mut warnings),
            Backend::Xpu | Backend::Hpu => {}
        }
        inventory.gpus.push(gpu);
    }
    // NVML devices sysfs did not show (a container with a partial /sys).
    for n in nvml_gpus {
        warnings.push(format!(
            "NVML reports a GPU at {} that sysfs does not list",
            n.pci_address.as_deref().unwrap_or("an unknown address")
        ));
        let mut gpu = Gpu {
            vendor: Vendor::Nvidia,
            product: "NVIDIA GPU".into(),
            backend: Some(Backend::Cuda),
            warp_size: Some(32),
            pci_address: n.pci_address.clone(),
            ..Gpu::default()
        };
        nvidia::apply_nvml(&mut gpu, n, &inventory.nvml);
        inventory.gpus.push(gpu);
    }
    if let crate::NvmlStatus::NoDriver { reason } = &inventory.nvml {
        let on_nvidia = inventory
            .gpus
            .iter()
            .filter(|g| g.backend == Some(Backend::Cuda))
            .count();
        if on_nvidia > 0 {
            warnings.push(format!(
                "{on_nvidia} GPU(s) are on the nvidia driver but NVML could not be used ({reason}); \
                 their UUID, memory and CUDA version are unknown"
            ));
        }
    }
    for (i, gpu) in inventory.gpus.iter_mut().enumerate() {
        gpu.index = u32::try_from(i).unwrap_or(u32::MAX);
    }
    inventory.mdevs = vfio::read_mdevs(root, devices, ids, &mut warnings);
    inventory.warnings = warnings;
    inventory
}

/// `ROOT/module/<driver>/version` (`nvidia` → `550.54.15`).
fn module_version(root: &Path, driver: &str) -> Option<String> {
    let module = driver.replace('-', "_");
    read_trimmed(&root.join("module").join(module).join("version"))
        .ok()
        .flatten()
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NvmlStatus;
    use crate::nvidia::NvmlGpu;
    use gkm_core::Arch;
    use gkm_core::gpu::MigMode;

    fn h100_tree() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/sysfs/nvidia-h100")
    }

    fn nvml_gpu(addr: &str, uuid: &str) -> NvmlGpu {
        NvmlGpu {
            uuid: Some(uuid.into()),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            arch: Some(Arch::from_compute_capability(9, 0)),
            memory_bytes: Some(81559 << 20),
            pci_address: Some(addr.into()),
            mig_mode: Some(MigMode::Disabled),
        }
    }

    #[test]
    fn gpus_on_the_nvidia_driver_without_nvml_are_reported() {
        let root = h100_tree();
        let mut warnings = Vec::new();
        let devices = pci::scan(&root, &mut warnings).unwrap();
        let report = NvmlReport {
            status: NvmlStatus::NoDriver {
                reason: "libnvidia-ml.so.1: cannot open shared object file".into(),
            },
            ..NvmlReport::default()
        };
        let inv = assemble(&root, &devices, &PciIds::bundled(), &[], report, warnings);
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!(inv.warnings.len(), 1);
        assert!(inv.warnings[0].starts_with(
            "2 GPU(s) are on the nvidia driver but NVML could not be used (libnvidia-ml.so.1"
        ));
    }

    /// NVML's answer is matched to sysfs by PCI address; a device only NVML
    /// lists is kept, with a warning.
    #[test]
    fn nvml_answers_are_matched_to_sysfs_by_pci_address() {
        let root = h100_tree();
        let mut warnings = Vec::new();
        let devices = pci::scan(&root, &mut warnings).unwrap();
        let report = NvmlReport {
            status: NvmlStatus::Loaded {
                driver_version: "550.90.07".into(),
                cuda_driver_version: Some("12.4".into()),
                device_count: 3,
            },
            gpus: vec![
                nvml_gpu("0000:bd:00.0", "GPU-b"),
                nvml_gpu("0000:18:00.0", "GPU-a"),
                nvml_gpu("0000:f0:00.0", "GPU-c"),
            ],
            warnings: Vec::new(),
        };
        let inv = assemble(&root, &devices, &PciIds::bundled(), &[], report, warnings);
        let seen: Vec<(u32, Option<&str>, Option<&str>)> = inv
            .gpus
            .iter()
            .map(|g| (g.index, g.uuid.as_deref(), g.pci_address.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                (0, Some("GPU-a"), Some("0000:18:00.0")),
                (1, Some("GPU-b"), Some("0000:bd:00.0")),
                (2, Some("GPU-c"), Some("0000:f0:00.0")),
            ]
        );
        let first = &inv.gpus[0];
        assert_eq!(first.product, "NVIDIA H100 80GB HBM3");
        assert_eq!(first.memory_bytes, Some(81559 << 20));
        assert_eq!(first.driver_version.as_deref(), Some("550.90.07"));
        assert_eq!(first.toolkit_version.as_deref(), Some("12.4"));
        assert_eq!(first.mig_mode, Some(MigMode::Disabled));
        assert_eq!(first.numa_node, Some(0), "sysfs facts are kept");
        assert_eq!(
            inv.warnings,
            ["NVML reports a GPU at 0000:f0:00.0 that sysfs does not list"]
        );
    }
}
