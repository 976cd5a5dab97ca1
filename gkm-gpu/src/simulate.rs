//! Simulated inventories: GPUs read from a file, for clusters without GPUs
//! and for tests.
//!
//! The file is YAML (or JSON, by its `.json` extension) with a `gpus` list.
//! Each entry names a [profile](PROFILES) with an optional `count`, or gives
//! the GPU's fields in full (`vendor` and `product` at least); fields given
//! next to a profile override it. The field names are those of
//! [`gkm_core::Gpu`] in JSON (`warpSize`, `memoryBytes`, `driverVersion`…),
//! so the output of `gkm gpus --json` is itself a valid file. Optional `vfio`
//! and `mdevs` lists are read as [`crate::VfioDevice`] and
//! [`crate::MdevDevice`]; an optional `cpuIsa` is the vector ISA PyTorch
//! Inductor picks on the node's CPU (`avx2`, `avx512`…, as
//! [`crate::Inventory::cpu_isa`]; unknown when absent); other top-level
//! keys are ignored. GPUs are numbered
//! in file order; an `index` in an entry is ignored. Every GPU gets a `uuid`
//! and a `pciAddress` (as real GPUs have) unless its entry gives them:
//! derived from the file's name, its directory's name, its text and the
//! GPU's index, so stable from one read to the next (wherever the tree
//! lies), with NVML's `GPU-…` form for NVIDIA.
//!
//! ```yaml
//! gpus:
//!   - profile: H100
//!     count: 8
//!   - profile: MI300X
//!     driverVersion: "6.8.5"
//!   - vendor: nvidia
//!     product: NVIDIA A40
//!     backend: cuda
//!     arch: sm_86
//!     warpSize: 32
//!     memoryBytes: 48305799168
//! ```
//!
//! ```
//! let inventory = gkm_gpu::simulate::parse("gpus:\n  - profile: T4\n    count: 2\n", "gpus.yaml".as_ref())?;
//! assert_eq!(inventory.gpus.len(), 2);
//! assert_eq!(inventory.gpus[1].describe(), "1 Tesla T4 (cuda/75/32)");
//! assert!(inventory.simulated);
//! let cpu_only = gkm_gpu::simulate::parse("gpus: []\ncpuIsa: avx512\n", "cpu.yaml".as_ref())?;
//! assert_eq!(cpu_only.cpu_isa.as_deref(), Some("avx512"));
//! # Ok::<(), gkm_gpu::Error>(())
//! ```

use std::path::Path;

use gkm_core::gpu::MigMode;
use gkm_core::{Arch, Backend, Gpu, Vendor};
use serde::Deserialize;

use crate::Error;
use crate::inventory::{Inventory, MdevDevice, VfioDevice};

mod identity;
mod profiles;

pub use profiles::{PROFILES, Profile};

/// The most GPUs one entry may ask for.
pub const MAX_COUNT: u32 = 1024;

/// The file as written.
#[derive(Deserialize)]
struct SimFile {
    gpus: Vec<Entry>,
    #[serde(default)]
    vfio: Vec<VfioDevice>,
    #[serde(default)]
    mdevs: Vec<MdevDevice>,
    /// The CPU ISA Inductor would pick on the simulated node.
    #[serde(default, rename = "cpuIsa")]
    cpu_isa: Option<String>,
}

/// One `gpus` entry: a profile, or a GPU's fields, or both.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    profile: Option<String>,
    count: Option<u32>,
    #[allow(dead_code)]
    index: Option<u32>,
    vendor: Option<Vendor>,
    product: Option<String>,
    backend: Option<Backend>,
    arch: Option<Arch>,
    warp_size: Option<u32>,
    memory_bytes: Option<u64>,
    uuid: Option<String>,
    pci_address: Option<String>,
    driver_version: Option<String>,
    toolkit_version: Option<String>,
    pci_id: Option<String>,
    kernel_driver: Option<String>,
    numa_node: Option<u32>,
    mig_mode: Option<MigMode>,
}

/// Reads a simulated inventory file (YAML, or JSON when it ends in `.json`).
pub fn load(path: &Path) -> Result<Inventory, Error> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8(bytes).map_err(|_| Error::Simulate {
        path: path.to_path_buf(),
        message: "not UTF-8 text".into(),
    })?;
    parse(&text, path)
}

/// Parses a simulated inventory; `path` names it in messages and picks the
/// format (`.json` is JSON, anything else YAML).
pub fn parse(text: &str, path: &Path) -> Result<Inventory, Error> {
    let invalid = |message: String| Error::Simulate {
        path: path.to_path_buf(),
        message,
    };
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let file: SimFile = if is_json {
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
    } else {
        serde_yaml::from_str(text).map_err(|e| invalid(e.to_string()))?
    };
    let mut gpus = Vec::new();
    for (n, entry) in file.gpus.into_iter().enumerate() {
        let count = entry.count.unwrap_or(1);
        if count == 0 || count > MAX_COUNT {
            return Err(invalid(format!(
                "GPU entry {n}: count {count} is out of range 1..={MAX_COUNT}"
            )));
        }
        if count > 1 && (entry.uuid.is_some() || entry.pci_address.is_some()) {
            return Err(invalid(format!(
                "GPU entry {n}: uuid and pciAddress name one GPU, but count is {count}"
            )));
        }
        let gpu = entry_gpu(entry, n, path)?;
        for _ in 0..count {
            let mut g = gpu.clone();
            g.index = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
            gpus.push(g);
        }
    }
    identity::assign(&mut gpus, &identity::seed(path, text));
    Ok(Inventory {
        gpus,
        vfio: file.vfio,
        mdevs: file.mdevs,
        cpu_isa: file.cpu_isa,
        simulated: true,
        ..Inventory::default()
    })
}

fn entry_gpu(e: Entry, n: usize, path: &Path) -> Result<Gpu, Error> {
    let mut gpu = match &e.profile {
        Some(name) => Profile::find(name)
            .ok_or_else(|| Error::UnknownProfile {
                path: path.to_path_buf(),
                entry: n,
                name: name.clone(),
                known: PROFILES
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?
            .gpu(),
        None => {
            let (Some(vendor), Some(product)) = (e.vendor, e.product.clone()) else {
                return Err(Error::Simulate {
                    path: path.to_path_buf(),
                    message: format!(
                        "GPU entry {n}: give a profile, or at least vendor and product"
                    ),
                });
            };
            Gpu {
                vendor,
                product,
                ..Gpu::default()
            }
        }
    };
    macro_rules! set {
        ($($field:ident),*) => { $( if let Some(v) = e.$field { gpu.$field = Some(v); } )* };
    }
    if let Some(v) = e.vendor {
        gpu.vendor = v;
    }
    if let Some(p) = e.product {
        gpu.product = p;
    }
    set!(
        backend,
        arch,
        warp_size,
        memory_bytes,
        uuid,
        pci_address,
        driver_version,
        toolkit_version,
        pci_id,
        kernel_driver,
        numa_node,
        mig_mode
    );
    Ok(gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_consistent() {
        for p in PROFILES {
            let gpu = p.gpu();
            assert_eq!(Profile::find(p.name), Some(p), "{}", p.name);
            let (vendor, device) = p.pci_id.split_once(':').unwrap();
            let vendor = u16::from_str_radix(vendor, 16).unwrap();
            let device = u16::from_str_radix(device, 16).unwrap();
            assert_eq!(Vendor::from_pci_id(vendor), p.vendor, "{}", p.name);
            // The bundled PCI names know every profiled device.
            assert!(
                crate::pci_ids::PciIds::bundled()
                    .device(vendor, device)
                    .is_some(),
                "{}",
                p.name
            );
            match p.backend {
                Backend::Cuda => {
                    let cc = gpu.arch.as_ref().and_then(Arch::compute_capability);
                    assert_eq!(cc, crate::nvidia::compute_capability(device), "{}", p.name);
                }
                Backend::Hip => assert!(
                    gpu.arch.as_ref().is_some_and(|a| !a.is_cuda()),
                    "{}",
                    p.name
                ),
                _ => assert!(gpu.arch.is_none()),
            }
        }
    }

    #[test]
    fn required_profiles_have_the_right_targets() {
        for (name, arch) in [
            ("T4", "sm_75"),
            ("A100", "sm_80"),
            ("A10", "sm_86"),
            ("L4", "sm_89"),
            ("H100", "sm_90"),
            ("H200", "sm_90"),
            ("B200", "sm_100"),
            ("GB200", "sm_100"),
            ("B300", "sm_103"),
            ("RTX-PRO-6000", "sm_120"),
        ] {
            let gpu = Profile::find(name).unwrap().gpu();
            assert_eq!(gpu.arch.unwrap().sm_name().as_deref(), Some(arch), "{name}");
            assert_eq!(gpu.warp_size, Some(32));
        }
        for (name, arch) in [
            ("MI210", "gfx90a"),
            ("MI300X", "gfx942"),
            ("MI325X", "gfx942"),
            ("MI355X", "gfx950"),
        ] {
            let gpu = Profile::find(name).unwrap().gpu();
            assert_eq!(gpu.arch.unwrap().as_str(), arch, "{name}");
            assert_eq!(gpu.warp_size, Some(64));
        }
    }
}
