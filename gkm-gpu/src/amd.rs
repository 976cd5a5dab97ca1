//! AMD GPUs from the KFD topology (`/sys/class/kfd/kfd/topology/nodes`), with
//! no vendor tool needed.

use std::collections::BTreeMap;
use std::path::Path;

use gkm_core::Arch;

use crate::pci::{PciDevice, read_trimmed, sorted_entries};
use gkm_core::Gpu;

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdNode {
    /// The node's number (its directory name).
    pub node: u32,
    /// PCI address from `domain` and `location_id`, `dddd:bb:dd.f`.
    pub pci_address: String,
    /// `vendor_id`.
    pub vendor_id: u16,
    /// `device_id`.
    pub device_id: u16,
    /// `gfx_target_version`, e.g. `90010`.
    pub gfx_target_version: u32,
    /// The gfx target, e.g. `gfx90a`; `None` when the version does not map.
    pub arch: Option<Arch>,
    /// `wave_front_size`: the warp size.
    pub wavefront_size: Option<u32>,
    /// Compute units (`simd_count / simd_per_cu`).
    pub compute_units: Option<u32>,
    /// Device memory from the node's frame-buffer memory banks, in bytes.
    pub memory_bytes: Option<u64>,
    /// `drm_render_minor`: the node's `/dev/dri/renderD<N>`.
    pub drm_render_minor: Option<u32>,
}

/// The gfx target name of a KFD `gfx_target_version`.
///
/// The version is `major * 10000 + minor * 100 + stepping`; the name writes
/// minor and stepping as one hex digit each.
///
/// ```
/// use gkm_gpu::amd::gfx_target_name;
/// assert_eq!(gfx_target_name(90010).as_deref(), Some("gfx90a"));
/// assert_eq!(gfx_target_name(90402).as_deref(), Some("gfx942"));
/// assert_eq!(gfx_target_name(100300).as_deref(), Some("gfx1030"));
/// assert_eq!(gfx_target_name(0), None);
/// ```
pub fn gfx_target_name(version: u32) -> Option<String> {
    let major = version / 10000;
    let minor = (version / 100) % 100;
    let stepping = version % 100;
    (major > 0 && minor < 16 && stepping < 16).then(|| format!("gfx{major}{minor:x}{stepping:x}"))
}

/// Reads the GPU nodes of `ROOT/class/kfd/kfd/topology/nodes`; CPU nodes are
/// left out. No topology (no amdgpu driver) gives an empty list; a malformed
/// node is skipped with a warning.
pub fn read_topology(root: &Path, warnings: &mut Vec<String>) -> Vec<KfdNode> {
    let dir = root.join("class/kfd/kfd/topology/nodes");
    let Ok(entries) = sorted_entries(&dir) else {
        return Vec::new();
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let Ok(node) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        match read_node(&entry.path(), node, warnings) {
            Ok(Some(n)) => nodes.push(n),
            Ok(None) => {}
            Err(msg) => warnings.push(format!("KFD node {node} skipped: {msg}")),
        }
    }
    nodes.sort_by_key(|n| n.node);
    nodes
}

fn read_node(dir: &Path, node: u32, warnings: &mut Vec<String>) -> Result<Option<KfdNode>, String> {
    let path = dir.join("properties");
    let props = read_properties(&path, warnings)?;
    let get = |key: &str| props.get(key).copied();
    let gfx = get("gfx_target_version").unwrap_or(0);
    if gfx == 0 || get("simd_count").unwrap_or(0) == 0 {
        return Ok(None);
    }
    let need = |key: &str| get(key).ok_or_else(|| format!("{} has no {key}", path.display()));
    let location = need("location_id")?;
    let domain = get("domain").unwrap_or(0);
    let pci_address = format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        domain,
        (location >> 8) & 0xff,
        (location >> 3) & 0x1f,
        location & 0x7
    );
    let id16 = |key: &str| -> Result<u16, String> {
        u16::try_from(need(key)?)
            .map_err(|_| format!("{}: {key} is not a 16-bit id", path.display()))
    };
    let gfx_target_version = u32::try_from(gfx).map_err(|_| {
        format!(
            "{}: gfx_target_version {gfx} is out of range",
            path.display()
        )
    })?;
    let arch = gfx_target_name(gfx_target_version).and_then(|n| n.parse::<Arch>().ok());
    if arch.is_none() {
        warnings.push(format!(
            "{}: gfx_target_version {gfx_target_version} does not name a gfx target",
            path.display()
        ));
    }
    let small = |key: &str| {
        get(key)
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v > 0)
    };
    let compute_units = match (small("simd_count"), small("simd_per_cu")) {
        (Some(simds), Some(per_cu)) => Some(simds / per_cu),
        _ => None,
    };
    Ok(Some(KfdNode {
        node,
        pci_address,
        vendor_id: id16("vendor_id")?,
        device_id: id16("device_id")?,
        gfx_target_version,
        arch,
        wavefront_size: small("wave_front_size"),
        compute_units,
        memory_bytes: frame_buffer_bytes(dir, warnings),
        drm_render_minor: get("drm_render_minor").and_then(|v| u32::try_from(v).ok()),
    }))
}

/// `key value` lines; lines that do not parse are reported and skipped.
fn read_properties(
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<BTreeMap<String, u64>, String> {
    let text = match read_trimmed(path) {
        Ok(Some(text)) => text,
        Ok(None) => return Err(format!("{} is missing", path.display())),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut props = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let mut parts = line.split_whitespace();
        match (
            parts.next(),
            parts.next().map(str::parse::<u64>),
            parts.next(),
        ) {
            (Some(key), Some(Ok(value)), None) => {
                props.insert(key.to_string(), value);
            }
            (None, ..) => {}
            _ => warnings.push(format!(
                "{} line {}: expected `name number`, found {line:?}",
                path.display(),
                n + 1
            )),
        }
    }
    Ok(props)
}

/// The sum of the frame-buffer banks (heap types 1 and 2) in `mem_banks/*`.
fn frame_buffer_bytes(dir: &Path, warnings: &mut Vec<String>) -> Option<u64> {
    let banks = sorted_entries(&dir.join("mem_banks")).ok()?;
    let mut total = 0u64;
    for bank in banks {
        let Ok(props) = read_properties(&bank.path().join("properties"), warnings) else {
            continue;
        };
        if matches!(props.get("heap_type"), Some(1 | 2)) {
            total = total.saturating_add(props.get("size_in_bytes").copied().unwrap_or(0));
        }
    }
    (total > 0).then_some(total)
}

/// The family name AMD's node labeller uses for a gfx target (`AI` for the
/// GFX9 data-center parts, `NV` for RDNA 1/2).
pub fn family(arch: &Arch) -> Option<&'static str> {
    let name = arch.as_str();
    if name.starts_with("gfx9") {
        Some("AI")
    } else if name.starts_with("gfx10") {
        Some("NV")
    } else {
        None
    }
}

/// Fills in what a GPU on amdgpu has beyond its PCI ids: the marketing name
/// sysfs gives, the gfx target, wavefront size and memory of its KFD node,
/// and its VRAM; a GPU `bound` to amdgpu without a KFD node is warned of.
pub(crate) fn enrich(
    gpu: &mut Gpu,
    dev: &PciDevice,
    kfd: &[KfdNode],
    bound: bool,
    warnings: &mut Vec<String>,
) {
    if let Some(name) = read_trimmed(&dev.path.join("product_name"))
        .ok()
        .flatten()
        .filter(|n| !n.is_empty())
    {
        gpu.product = name;
    }
    let node = kfd.iter().find(|n| n.pci_address == dev.address);
    match node {
        Some(node) => {
            gpu.arch = node.arch.clone();
            gpu.warp_size = node.wavefront_size;
            gpu.memory_bytes = node.memory_bytes;
        }
        None if bound => warnings.push(format!(
            "{} {} is on amdgpu but has no KFD topology node; its gfx target is unknown",
            dev.address, gpu.product
        )),
        None => {}
    }
    if let Some(vram) = read_trimmed(&dev.path.join("mem_info_vram_total"))
        .ok()
        .flatten()
        .and_then(|t| t.parse::<u64>().ok())
    {
        gpu.memory_bytes = Some(vram);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn maps_known_targets() {
        for (version, name) in [
            (90008, "gfx908"),
            (90010, "gfx90a"),
            (90400, "gfx940"),
            (90402, "gfx942"),
            (90500, "gfx950"),
            (110000, "gfx1100"),
            (120001, "gfx1201"),
        ] {
            assert_eq!(gfx_target_name(version).as_deref(), Some(name), "{version}");
        }
        assert_eq!(gfx_target_name(91600), None);
        assert_eq!(gfx_target_name(90016), None);
    }

    proptest! {
        #[test]
        fn every_mapped_name_parses_and_round_trips(major in 1u32..20, minor in 0u32..16, step in 0u32..16) {
            let version = major * 10000 + minor * 100 + step;
            let name = gfx_target_name(version).unwrap();
            let arch: Arch = name.parse().unwrap();
            prop_assert_eq!(arch.as_str(), name.as_str());
            // Reading the name back gives the version back.
            let digits = &name[3..];
            let (maj, rest) = digits.split_at(digits.len() - 2);
            let back = maj.parse::<u32>().unwrap() * 10000
                + u32::from_str_radix(&rest[..1], 16).unwrap() * 100
                + u32::from_str_radix(&rest[1..], 16).unwrap();
            prop_assert_eq!(back, version);
        }
    }
}
