//! The named GPUs a simulated inventory can list.

use gkm_core::{Arch, Backend, Gpu, Vendor};

/// A named GPU to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// The name used in files, `H100`.
    pub name: &'static str,
    /// Other accepted names.
    pub aliases: &'static [&'static str],
    /// Who makes it.
    pub vendor: Vendor,
    /// The name its driver reports.
    pub product: &'static str,
    /// Its backend.
    pub backend: Backend,
    /// Its architecture (`75`, `gfx90a`); empty when the backend has none.
    pub arch: &'static str,
    /// Threads per warp / wavefront.
    pub warp_size: Option<u32>,
    /// Device memory in bytes, as the driver reports it.
    pub memory_bytes: u64,
    /// PCI vendor and device id.
    pub pci_id: &'static str,
    /// Driver version simulated GPUs report unless the entry says otherwise.
    pub driver_version: Option<&'static str>,
    /// CUDA version simulated GPUs report unless the entry says otherwise.
    pub toolkit_version: Option<&'static str>,
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The driver NVIDIA profiles report: the R580 production branch, the first
/// to report CUDA 13.0 and one every profile here runs on (Turing through
/// Blackwell; R580 is also the last branch for Volta). An entry can say
/// `driverVersion: "570.195.03"` and `toolkitVersion: "12.8"` for R570.
const NV_DRIVER: Option<&str> = Some("580.95.05");
/// The CUDA version the R580 driver reports.
const NV_CUDA: Option<&str> = Some("13.0");

const fn nvidia(
    name: &'static str,
    aliases: &'static [&'static str],
    product: &'static str,
    arch: &'static str,
    memory_mib: u64,
    pci_id: &'static str,
) -> Profile {
    Profile {
        name,
        aliases,
        vendor: Vendor::Nvidia,
        product,
        backend: Backend::Cuda,
        arch,
        warp_size: Some(32),
        memory_bytes: memory_mib * MIB,
        pci_id,
        driver_version: NV_DRIVER,
        toolkit_version: NV_CUDA,
    }
}

const fn amd(
    name: &'static str,
    product: &'static str,
    arch: &'static str,
    memory_bytes: u64,
    pci_id: &'static str,
) -> Profile {
    Profile {
        name,
        aliases: &[],
        vendor: Vendor::Amd,
        product,
        backend: Backend::Hip,
        arch,
        warp_size: Some(64),
        memory_bytes,
        pci_id,
        driver_version: None,
        toolkit_version: None,
    }
}

/// The profiles gkm knows. NVIDIA ones report driver 580.95.05 and CUDA 13.0
/// unless an entry says otherwise; memory is what the driver reports
/// (`nvidia-smi --query-gpu=memory.total` for NVIDIA, the VRAM size for AMD).
pub const PROFILES: &[Profile] = &[
    nvidia("T4", &["Tesla-T4"], "Tesla T4", "75", 15360, "10de:1eb8"),
    nvidia(
        "V100",
        &["V100-SXM2-32GB"],
        "Tesla V100-SXM2-32GB",
        "70",
        32768,
        "10de:1db5",
    ),
    nvidia("A10", &[], "NVIDIA A10", "86", 23028, "10de:2236"),
    nvidia(
        "A100",
        &["A100-80GB", "A100-SXM4-80GB"],
        "NVIDIA A100-SXM4-80GB",
        "80",
        81920,
        "10de:20b2",
    ),
    nvidia(
        "A100-40GB",
        &["A100-SXM4-40GB"],
        "NVIDIA A100-SXM4-40GB",
        "80",
        40960,
        "10de:20b0",
    ),
    nvidia("L4", &[], "NVIDIA L4", "89", 23034, "10de:27b8"),
    nvidia("L40S", &[], "NVIDIA L40S", "89", 46068, "10de:26b9"),
    nvidia(
        "H100",
        &["H100-SXM", "H100-80GB"],
        "NVIDIA H100 80GB HBM3",
        "90",
        81559,
        "10de:2330",
    ),
    nvidia("H200", &[], "NVIDIA H200", "90", 143771, "10de:2335"),
    nvidia("B200", &[], "NVIDIA B200", "100", 183359, "10de:2901"),
    nvidia(
        "B300",
        &["B300-SXM6"],
        "NVIDIA B300 SXM6 AC",
        "103",
        275040,
        "10de:3182",
    ),
    nvidia("GB200", &[], "NVIDIA GB200", "100", 189471, "10de:2941"),
    nvidia(
        "RTX-PRO-6000",
        &["RTX-PRO-6000-Blackwell", "RTX-PRO-6000-Server"],
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        "120",
        97887,
        "10de:2bb5",
    ),
    amd(
        "MI100",
        "AMD Instinct MI100",
        "gfx908",
        34342961152,
        "1002:738c",
    ),
    amd(
        "MI210",
        "AMD Instinct MI210",
        "gfx90a",
        68702699520,
        "1002:740f",
    ),
    amd(
        "MI250X",
        "AMD Instinct MI250X",
        "gfx90a",
        68702699520,
        "1002:7408",
    ),
    amd(
        "MI300X",
        "AMD Instinct MI300X",
        "gfx942",
        206141652992,
        "1002:74a1",
    ),
    amd(
        "MI325X",
        "AMD Instinct MI325X",
        "gfx942",
        256 * GIB,
        "1002:74a5",
    ),
    amd(
        "MI355X",
        "AMD Instinct MI355X",
        "gfx950",
        288 * GIB,
        "1002:75a3",
    ),
    Profile {
        name: "Gaudi2",
        aliases: &["HL-225"],
        vendor: Vendor::Intel,
        product: "Intel Gaudi2 AI Training Accelerator",
        backend: Backend::Hpu,
        arch: "",
        warp_size: None,
        memory_bytes: 96 << 30,
        pci_id: "1da3:1020",
        driver_version: None,
        toolkit_version: None,
    },
];

impl Profile {
    /// The profile called `name` (case, `-`, `_` and spaces ignored).
    ///
    /// ```
    /// let p = gkm_gpu::simulate::Profile::find("mi300x").unwrap();
    /// assert_eq!(p.gpu().arch.unwrap().as_str(), "gfx942");
    /// ```
    pub fn find(name: &str) -> Option<&'static Profile> {
        let key = fold(name);
        PROFILES
            .iter()
            .find(|p| fold(p.name) == key || p.aliases.iter().any(|a| fold(a) == key))
    }

    /// The GPU this profile simulates, at index 0.
    pub fn gpu(&self) -> Gpu {
        Gpu {
            vendor: self.vendor,
            product: self.product.to_string(),
            backend: Some(self.backend),
            arch: (!self.arch.is_empty())
                .then(|| self.arch.parse::<Arch>().ok())
                .flatten(),
            warp_size: self.warp_size,
            memory_bytes: Some(self.memory_bytes),
            pci_id: Some(self.pci_id.to_string()),
            driver_version: self.driver_version.map(str::to_string),
            toolkit_version: self.toolkit_version.map(str::to_string),
            ..Gpu::default()
        }
    }
}

fn fold(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}
