//! Node labels: a pure function of the inventory.
//!
//! gkm's own labels are `gkm.io/gpu.*` (plus `gkm.io/vfio.count` and
//! `gkm.io/vgpu.count`). With [`LabelOptions::vendor_labels`], the names
//! NVIDIA GPU Feature Discovery (`nvidia.com/…`, both its current
//! `cuda.driver-version.*` names and the older `cuda.driver.*` ones) and AMD's
//! node labeller (`amd.com/gpu.…`) use are added, so selectors written for
//! them keep working. When a node has GPUs of several kinds, the per-GPU
//! labels describe its first GPU and `gkm.io/gpu.mixed` is `true`.
//!
//! [`KEYS`] lists every label this module may write: a labeller removes the
//! ones it wrote that no longer apply, and the agent's admission policy
//! allows exactly these.

use std::collections::BTreeMap;

use gkm_core::{Gpu, Vendor};

use crate::inventory::Inventory;

/// Which labels [`node_labels`] writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LabelOptions {
    /// Also write NVIDIA GPU Feature Discovery's and AMD's label names.
    pub vendor_labels: bool,
}

/// The prefixes of every label [`node_labels`] may write.
pub const MANAGED_PREFIXES: &[&str] = &[
    "gkm.io/gpu.",
    "gkm.io/vfio.",
    "gkm.io/vgpu.",
    "nvidia.com/gpu.",
    "nvidia.com/cuda.",
    "nvidia.com/mig.capable",
    "amd.com/gpu.",
];

/// Every label [`node_labels`] may write, gkm's first, then GPU Feature
/// Discovery's, then AMD's.
pub const KEYS: &[&str] = &[
    "gkm.io/gpu.count",
    "gkm.io/gpu.simulated",
    "gkm.io/vfio.count",
    "gkm.io/vgpu.count",
    "gkm.io/gpu.mixed",
    "gkm.io/gpu.vendor",
    "gkm.io/gpu.product",
    "gkm.io/gpu.backend",
    "gkm.io/gpu.arch",
    "gkm.io/gpu.warp-size",
    "gkm.io/gpu.memory",
    "gkm.io/gpu.driver.major",
    "gkm.io/gpu.driver.minor",
    "gkm.io/gpu.toolkit.major",
    "gkm.io/gpu.toolkit.minor",
    "nvidia.com/gpu.present",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.count",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.runtime.major",
    "nvidia.com/cuda.runtime.minor",
    "nvidia.com/cuda.driver-version.full",
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
    "nvidia.com/cuda.runtime-version.full",
    "nvidia.com/cuda.runtime-version.major",
    "nvidia.com/cuda.runtime-version.minor",
    "nvidia.com/mig.capable",
    "amd.com/gpu.product-name",
    "amd.com/gpu.device-id",
    "amd.com/gpu.family",
    "amd.com/gpu.vram",
    "amd.com/gpu.driver-version",
];

/// The labels that describe a node's GPUs.
///
/// ```
/// use gkm_gpu::labels::{node_labels, LabelOptions};
/// let inventory = gkm_gpu::simulate::parse("gpus: [{profile: H100, count: 8}]", "n.yaml".as_ref())?;
/// let labels = node_labels(&inventory, &LabelOptions { vendor_labels: true });
/// assert_eq!(labels["gkm.io/gpu.count"], "8");
/// assert_eq!(labels["gkm.io/gpu.arch"], "sm_90");
/// assert_eq!(labels["gkm.io/gpu.product"], "NVIDIA-H100-80GB-HBM3");
/// assert_eq!(labels["nvidia.com/gpu.family"], "hopper");
/// # Ok::<(), gkm_gpu::Error>(())
/// ```
pub fn node_labels(inventory: &Inventory, opts: &LabelOptions) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut put = |key: &str, value: String| {
        if !value.is_empty() {
            labels.insert(key.to_string(), value);
        }
    };
    let usable: Vec<&Gpu> = inventory.usable_gpus().collect();
    put("gkm.io/gpu.count", usable.len().to_string());
    if inventory.simulated {
        put("gkm.io/gpu.simulated", "true".into());
    }
    if !inventory.vfio.is_empty() {
        put("gkm.io/vfio.count", inventory.vfio.len().to_string());
    }
    if !inventory.mdevs.is_empty() {
        put("gkm.io/vgpu.count", inventory.mdevs.len().to_string());
    }
    let Some(first) = usable.first() else {
        return labels;
    };
    if usable
        .iter()
        .any(|g| g.product != first.product || g.arch != first.arch)
    {
        put("gkm.io/gpu.mixed", "true".into());
    }
    put("gkm.io/gpu.vendor", first.vendor.as_str().into());
    put("gkm.io/gpu.product", sanitize(&first.product, '-'));
    if let Some(backend) = first.backend {
        put("gkm.io/gpu.backend", backend.as_str().into());
    }
    if let Some(arch) = &first.arch {
        put(
            "gkm.io/gpu.arch",
            sanitize(&arch.sm_name().unwrap_or_else(|| arch.to_string()), '-'),
        );
    }
    if let Some(w) = first.warp_size {
        put("gkm.io/gpu.warp-size", w.to_string());
    }
    if let Some(m) = first.memory_bytes {
        put("gkm.io/gpu.memory", (m >> 20).to_string());
    }
    let driver = version_parts(first.driver_version.as_deref());
    put(
        "gkm.io/gpu.driver.major",
        driver.first().cloned().unwrap_or_default(),
    );
    put(
        "gkm.io/gpu.driver.minor",
        driver.get(1).cloned().unwrap_or_default(),
    );
    let toolkit = version_parts(first.toolkit_version.as_deref());
    put(
        "gkm.io/gpu.toolkit.major",
        toolkit.first().cloned().unwrap_or_default(),
    );
    put(
        "gkm.io/gpu.toolkit.minor",
        toolkit.get(1).cloned().unwrap_or_default(),
    );
    if opts.vendor_labels {
        if let Some(nv) = usable.iter().find(|g| g.vendor == Vendor::Nvidia) {
            let count = usable.iter().filter(|g| g.vendor == Vendor::Nvidia).count();
            nvidia_labels(nv, count, &mut put);
        }
        if let Some(amd) = usable.iter().find(|g| g.vendor == Vendor::Amd) {
            amd_labels(amd, &mut put);
        }
    }
    labels
}

/// NVIDIA GPU Feature Discovery's names.
fn nvidia_labels(gpu: &Gpu, count: usize, put: &mut impl FnMut(&str, String)) {
    put("nvidia.com/gpu.present", "true".into());
    put("nvidia.com/gpu.product", sanitize(&gpu.product, '-'));
    put("nvidia.com/gpu.count", count.to_string());
    if let Some(m) = gpu.memory_bytes {
        put("nvidia.com/gpu.memory", (m >> 20).to_string());
    }
    if let Some((major, minor)) = gpu.arch.as_ref().and_then(|a| a.compute_capability()) {
        put("nvidia.com/gpu.compute.major", major.to_string());
        put("nvidia.com/gpu.compute.minor", minor.to_string());
        put("nvidia.com/gpu.family", nvidia_family(major, minor).into());
    }
    if let Some(full) = &gpu.driver_version {
        put("nvidia.com/cuda.driver-version.full", sanitize(full, '-'));
        let parts = version_parts(Some(full));
        for (i, (old, new)) in [("major", "major"), ("minor", "minor"), ("rev", "revision")]
            .iter()
            .enumerate()
        {
            if let Some(p) = parts.get(i) {
                put(&format!("nvidia.com/cuda.driver.{old}"), p.clone());
                put(&format!("nvidia.com/cuda.driver-version.{new}"), p.clone());
            }
        }
    }
    if let Some(full) = &gpu.toolkit_version {
        put("nvidia.com/cuda.runtime-version.full", sanitize(full, '-'));
        let parts = version_parts(Some(full));
        for (i, name) in ["major", "minor"].iter().enumerate() {
            if let Some(p) = parts.get(i) {
                put(&format!("nvidia.com/cuda.runtime.{name}"), p.clone());
                put(
                    &format!("nvidia.com/cuda.runtime-version.{name}"),
                    p.clone(),
                );
            }
        }
    }
    if gpu.mig_mode.is_some() {
        put("nvidia.com/mig.capable", "true".into());
    }
}

/// AMD's node labeller names.
fn amd_labels(gpu: &Gpu, put: &mut impl FnMut(&str, String)) {
    put("amd.com/gpu.product-name", sanitize(&gpu.product, '_'));
    if let Some((_, device)) = gpu.pci_id.as_deref().and_then(|p| p.split_once(':')) {
        put("amd.com/gpu.device-id", sanitize(device, '_'));
    }
    if let Some(family) = gpu.arch.as_ref().and_then(crate::amd::family) {
        put("amd.com/gpu.family", family.into());
    }
    if let Some(m) = gpu.memory_bytes {
        put("amd.com/gpu.vram", format!("{}G", (m + (1 << 29)) >> 30));
    }
    if let Some(v) = &gpu.driver_version {
        put("amd.com/gpu.driver-version", sanitize(v, '_'));
    }
}

/// GPU Feature Discovery's family name for a compute capability.
pub fn nvidia_family(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        _ => "undefined",
    }
}

/// The numeric parts of a version: `550.54.15` → `["550", "54", "15"]`.
fn version_parts(version: Option<&str>) -> Vec<String> {
    version
        .map(|v| {
            v.split(['.', '-', '+'])
                .take_while(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A valid Kubernetes label value from free text: characters other than
/// `A-Za-z0-9-_.` dropped, runs of spaces and `/` turned into `sep`, at most
/// 63 characters, starting and ending with a letter or digit. May be empty.
///
/// ```
/// use gkm_gpu::labels::sanitize;
/// assert_eq!(sanitize("NVIDIA H100 80GB HBM3", '-'), "NVIDIA-H100-80GB-HBM3");
/// assert_eq!(sanitize("AMD Instinct MI300X", '_'), "AMD_Instinct_MI300X");
/// assert_eq!(sanitize("  (weird) / name!  ", '-'), "weird-name");
/// ```
pub fn sanitize(text: &str, sep: char) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() {
                ' '
            } else {
                c
            }
        })
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    let joined = cleaned
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(&sep.to_string());
    let mut out: String = joined.chars().take(63).collect();
    while out.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        out.pop();
    }
    out.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Whether a string is a valid Kubernetes label value.
pub fn is_valid_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sanitized_values_are_valid_labels(text in "\\PC{0,100}", dash in any::<bool>()) {
            let v = sanitize(&text, if dash { '-' } else { '_' });
            prop_assert!(is_valid_label_value(&v), "{:?} -> {:?}", text, v);
        }

        #[test]
        fn every_label_of_any_inventory_is_valid(product in "\\PC{0,80}", driver in "\\PC{0,20}", count in 1usize..4) {
            let gpu = Gpu {
                vendor: Vendor::Nvidia,
                product,
                backend: Some(gkm_core::Backend::Cuda),
                driver_version: Some(driver),
                toolkit_version: Some("12.4".into()),
                ..Gpu::default()
            };
            let inventory = Inventory { gpus: vec![gpu; count], ..Inventory::default() };
            for (key, value) in node_labels(&inventory, &LabelOptions { vendor_labels: true }) {
                prop_assert!(is_valid_label_value(&value), "{} = {:?}", key, value);
                prop_assert!(MANAGED_PREFIXES.iter().any(|p| key.starts_with(p)), "{}", key);
                prop_assert!(KEYS.contains(&key.as_str()), "{} is not in KEYS", key);
            }
        }
    }

    #[test]
    fn version_parts_stop_at_non_numbers() {
        assert_eq!(version_parts(Some("550.54.15")), ["550", "54", "15"]);
        assert_eq!(version_parts(Some("6.8.5-k")), ["6", "8", "5"]);
        assert!(version_parts(Some("unknown")).is_empty());
    }

    #[test]
    fn families_follow_gpu_feature_discovery() {
        assert_eq!(nvidia_family(7, 0), "volta");
        assert_eq!(nvidia_family(7, 5), "turing");
        assert_eq!(nvidia_family(8, 6), "ampere");
        assert_eq!(nvidia_family(8, 9), "ada-lovelace");
        assert_eq!(nvidia_family(12, 0), "blackwell");
    }
}
