//! The vendor-neutral GPU model.
//!
//! Every discovery backend (sysfs, NVML, AMD KFD, a simulated inventory)
//! produces [`Gpu`] values; compatibility checks and node labels read them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Who made the device.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA (PCI vendor 0x10de).
    Nvidia,
    /// AMD / ATI (PCI vendor 0x1002).
    Amd,
    /// Intel (PCI vendor 0x8086), GPUs and Gaudi accelerators (Habana Labs,
    /// PCI vendor 0x1da3).
    Intel,
    /// Anything else.
    #[default]
    Other,
}

impl Vendor {
    /// The vendor for a PCI vendor id, if it is one gkm knows.
    pub fn from_pci_id(id: u16) -> Vendor {
        match id {
            0x10de => Vendor::Nvidia,
            0x1002 => Vendor::Amd,
            0x8086 | 0x1da3 => Vendor::Intel,
            _ => Vendor::Other,
        }
    }

    /// The lowercase name used in labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Other => "other",
        }
    }
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The compiler backend a kernel targets, as Triton names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// NVIDIA CUDA (PTX / cubin).
    Cuda,
    /// AMD ROCm / HIP (amdgcn / hsaco).
    Hip,
    /// Intel XPU (SPIR-V).
    Xpu,
    /// Intel Gaudi (HPU).
    Hpu,
}

impl Backend {
    /// The lowercase name Triton uses (`cuda`, `hip`, `xpu`, `hpu`).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Hip => "hip",
            Backend::Xpu => "xpu",
            Backend::Hpu => "hpu",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Backend {
    type Err = ParseArchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cuda" | "nvidia" => Ok(Backend::Cuda),
            "hip" | "rocm" | "amd" => Ok(Backend::Hip),
            "xpu" => Ok(Backend::Xpu),
            "hpu" | "gaudi" => Ok(Backend::Hpu),
            _ => Err(ParseArchError {
                input: s.to_string(),
                expected: "a backend: cuda, hip, xpu or hpu",
            }),
        }
    }
}

/// A GPU architecture in canonical form.
///
/// CUDA architectures are the compute capability digits with an optional
/// feature suffix (`75`, `90a`, `100f`); `sm_75`, `sm75`, `7.5` and the number
/// `75` all normalise to `75`. AMD architectures are gfx target names
/// (`gfx90a`, `gfx942`). Serialised as a string; deserialised from a string or
/// a number, so Triton's `"arch": 75` and MCV's `"arch": "75"` both read.
///
/// ```
/// use gkm_core::Arch;
/// assert_eq!("sm_75".parse::<Arch>().unwrap(), "75".parse::<Arch>().unwrap());
/// assert_eq!("7.5".parse::<Arch>().unwrap().sm_name(), Some("sm_75".to_string()));
/// assert_eq!("GFX90A".parse::<Arch>().unwrap().as_str(), "gfx90a");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch(String);

/// An architecture or backend string that gkm cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {input:?}: expected {expected}")]
pub struct ParseArchError {
    /// What was given.
    pub input: String,
    /// What was expected instead.
    pub expected: &'static str,
}

impl Arch {
    /// The canonical form (`75`, `90a`, `gfx90a`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is a CUDA compute capability (as opposed to a gfx target).
    pub fn is_cuda(&self) -> bool {
        self.0.starts_with(|c: char| c.is_ascii_digit())
    }

    /// The CUDA compute capability as (major, minor), e.g. `90a` → (9, 0).
    pub fn compute_capability(&self) -> Option<(u32, u32)> {
        if !self.is_cuda() {
            return None;
        }
        let digits: String = self.0.chars().take_while(char::is_ascii_digit).collect();
        let n: u32 = digits.parse().ok()?;
        Some((n / 10, n % 10))
    }

    /// The `sm_XY` name of a CUDA architecture.
    pub fn sm_name(&self) -> Option<String> {
        self.is_cuda().then(|| format!("sm_{}", self.0))
    }

    /// The architecture of a CUDA compute capability.
    pub fn from_compute_capability(major: u32, minor: u32) -> Arch {
        Arch(format!("{}", major * 10 + minor))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Arch {
    type Err = ParseArchError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseArchError {
            input: s.to_string(),
            expected: "a CUDA compute capability (75, sm_75, 7.5, 90a) or a gfx target (gfx90a)",
        };
        let t = s.trim().to_ascii_lowercase();
        if let Some(rest) = t.strip_prefix("gfx") {
            if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Ok(Arch(t));
            }
            return Err(err());
        }
        let rest = t
            .strip_prefix("sm_")
            .or_else(|| t.strip_prefix("sm"))
            .unwrap_or(&t);
        let rest = rest.strip_prefix("compute_").unwrap_or(rest);
        if let Some((major, minor)) = rest.split_once('.') {
            let major: u32 = major.parse().map_err(|_| err())?;
            let minor: u32 = minor.parse().map_err(|_| err())?;
            if minor > 9 {
                return Err(err());
            }
            return Ok(Arch::from_compute_capability(major, minor));
        }
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let suffix = &rest[digits.len()..];
        if digits.len() < 2 || digits.starts_with('0') || !matches!(suffix, "" | "a" | "f") {
            return Err(err());
        }
        Ok(Arch(rest.to_string()))
    }
}

impl Serialize for Arch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Arch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Str(String),
        }
        let s = match Raw::deserialize(d)? {
            Raw::Num(n) => n.to_string(),
            Raw::Str(s) => s,
        };
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// NVIDIA Multi-Instance GPU mode of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigMode {
    /// MIG is on: the GPU is split into instances.
    Enabled,
    /// MIG is supported but off.
    Disabled,
}

impl MigMode {
    /// The lowercase name used in labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            MigMode::Enabled => "enabled",
            MigMode::Disabled => "disabled",
        }
    }
}

/// One GPU (or accelerator) on a node, whatever found it.
///
/// Fields that a backend cannot tell are `None`; build one with
/// `..Default::default()` so new optional fields do not break callers.
///
/// ```
/// use gkm_core::{Arch, Backend, Gpu, Vendor};
/// let gpu = Gpu {
///     vendor: Vendor::Nvidia,
///     product: "Tesla T4".into(),
///     backend: Some(Backend::Cuda),
///     arch: Some("sm_75".parse().unwrap()),
///     warp_size: Some(32),
///     ..Default::default()
/// };
/// assert_eq!(gpu.describe(), "0 Tesla T4 (cuda/75/32)");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Position on the node, in discovery order.
    pub index: u32,
    /// Who made it.
    pub vendor: Vendor,
    /// Marketing name, e.g. `Tesla T4`, `AMD Instinct MI210`.
    pub product: String,
    /// The compiler backend that targets it; `None` for a device no kernel
    /// can run on as it is (for example one with no compute driver bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// Its architecture, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<Arch>,
    /// Threads per warp (32 on NVIDIA, 64 on CDNA, 32 or 64 on RDNA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warp_size: Option<u32>,
    /// Device memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Vendor UUID (`GPU-…` on NVIDIA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// PCI address, `dddd:bb:dd.f`, lowercase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// Kernel driver version (`550.54.15`, amdgpu's version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Highest CUDA (or ROCm) runtime version the driver supports, `12.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolkit_version: Option<String>,
    /// PCI vendor and device id as `lspci -n` prints them, `10de:2330`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
    /// The kernel driver bound to the PCI function (`nvidia`, `amdgpu`,
    /// `vfio-pci`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_driver: Option<String>,
    /// The NUMA node the device is attached to, when the platform reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// NVIDIA MIG mode, for GPUs that support MIG.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<MigMode>,
}

impl Gpu {
    /// A one-line description for messages: `0 Tesla T4 (cuda/75/32)`.
    pub fn describe(&self) -> String {
        let target = match (&self.backend, &self.arch) {
            (Some(b), Some(a)) => format!(
                " ({b}/{a}/{})",
                self.warp_size
                    .map_or_else(|| "?".to_string(), |w| w.to_string())
            ),
            (Some(b), None) => format!(" ({b})"),
            _ => String::new(),
        };
        format!("{} {}{target}", self.index, self.product)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_forms_normalise() {
        for s in ["75", "sm_75", "sm75", "SM_75", "7.5", "compute_75"] {
            assert_eq!(s.parse::<Arch>().unwrap().as_str(), "75", "{s}");
        }
        assert_eq!("sm_90a".parse::<Arch>().unwrap().as_str(), "90a");
        assert_eq!(
            "90a".parse::<Arch>().unwrap().compute_capability(),
            Some((9, 0))
        );
        assert_eq!("gfx942".parse::<Arch>().unwrap().compute_capability(), None);
        for bad in ["", "sm_", "7", "gfx", "ampere", "7.10", "075", "90z"] {
            assert!(bad.parse::<Arch>().is_err(), "{bad}");
        }
    }

    #[test]
    fn arch_reads_numbers_and_strings() {
        let a: Arch = serde_json::from_str("75").unwrap();
        let b: Arch = serde_json::from_str("\"sm_75\"").unwrap();
        assert_eq!(a, b);
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"75\"");
        assert!(serde_json::from_str::<Arch>("\"nope\"").is_err());
    }
}
