//! Resource names, socket names and environment variable names.
//!
//! Passthrough GPUs are named as KubeVirt users know them from NVIDIA's
//! KubeVirt GPU device plugin: the PCI ID database's device name, upper-cased,
//! `/` and `.` to `_`, runs of whitespace to one `_`, every other character
//! that is not a letter, digit or `_` dropped (`GH100 [H100 SXM5 80GB]` →
//! `nvidia.com/GH100_H100_SXM5_80GB`). vGPUs take the mdev type's name with
//! whitespace runs to `_` (`GRID T4-2Q` → `nvidia.com/GRID_T4-2Q`).
//!
//! Beyond those rules, a name is only changed where Kubernetes would refuse
//! it: characters a resource name cannot hold are dropped, leading and
//! trailing `_`, `-` and `.` are trimmed, and the name is cut to 63
//! characters. A device with no usable name falls back to its PCI device id
//! (`2330`), as the same plugin does.

use gkm_core::Vendor;

/// The longest name part of an extended resource (a qualified name).
const MAX_NAME: usize = 63;

/// The resource domain for a vendor's devices; `None` for a vendor gkm does
/// not name resources for.
pub fn vendor_domain(vendor: Vendor) -> Option<&'static str> {
    match vendor {
        Vendor::Nvidia => Some("nvidia.com"),
        Vendor::Amd => Some("amd.com"),
        Vendor::Intel => Some("intel.com"),
        Vendor::Other => None,
    }
}

/// The resource name part for a passthrough GPU model, from its PCI ID
/// database name (`None` when the database does not know it) and its PCI
/// device id.
///
/// ```
/// use gkm_k8s_devices::naming::model_name;
/// assert_eq!(model_name(Some("GH100 [H100 SXM5 80GB]"), 0x2330), "GH100_H100_SXM5_80GB");
/// assert_eq!(model_name(Some("TU104GL [Quadro RTX 4000 Mobile / Max-Q]"), 0x1eb6),
///            "TU104GL_QUADRO_RTX_4000_MOBILE___MAXQ");
/// assert_eq!(model_name(None, 0x2330), "2330");
/// ```
pub fn model_name(pci_ids_name: Option<&str>, device_id: u16) -> String {
    let upper = pci_ids_name
        .unwrap_or_default()
        .trim()
        .to_uppercase()
        .replace(['/', '.'], "_");
    let mut out = String::new();
    let mut in_space = false;
    for c in upper.chars() {
        if c.is_whitespace() {
            if !in_space {
                out.push('_');
            }
            in_space = true;
            continue;
        }
        in_space = false;
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        }
    }
    let name = valid_name(&out);
    if name.is_empty() {
        format!("{device_id:04X}")
    } else {
        name
    }
}

/// The resource name part for an mdev type: its name (`mdev_type/name`) with
/// whitespace runs to `_`, or its type id (`nvidia-222`) when it has none.
///
/// ```
/// use gkm_k8s_devices::naming::mdev_name;
/// assert_eq!(mdev_name(Some("GRID T4-2Q"), "nvidia-222"), "GRID_T4-2Q");
/// assert_eq!(mdev_name(None, "nvidia-222"), "nvidia-222");
/// ```
pub fn mdev_name(type_name: Option<&str>, type_id: &str) -> String {
    let spaced = |text: &str| text.split_whitespace().collect::<Vec<_>>().join("_");
    let name = valid_name(&spaced(type_name.unwrap_or_default()));
    if name.is_empty() {
        valid_name(&spaced(type_id))
    } else {
        name
    }
}

/// Keeps what a qualified name may hold (letters, digits, `-`, `_`, `.`),
/// starting and ending with a letter or digit, at most 63 characters.
fn valid_name(text: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect();
    let edge = |c: char| !c.is_ascii_alphanumeric();
    let trimmed = kept.trim_matches(edge);
    let cut: String = trimmed.chars().take(MAX_NAME).collect();
    cut.trim_end_matches(edge).to_string()
}

/// The environment variable KubeVirt reads a resource's devices from:
/// `prefix` + `_` + the resource name upper-cased with `/` and `.` to `_`.
///
/// ```
/// use gkm_k8s_devices::naming::env_var;
/// assert_eq!(env_var("PCI_RESOURCE", "nvidia.com/GH100_H100_SXM5_80GB"),
///            "PCI_RESOURCE_NVIDIA_COM_GH100_H100_SXM5_80GB");
/// assert_eq!(env_var("MDEV_PCI_RESOURCE", "nvidia.com/GRID_T4-2Q"),
///            "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q");
/// ```
pub fn env_var(prefix: &str, resource: &str) -> String {
    format!(
        "{prefix}_{}",
        resource.to_uppercase().replace(['/', '.'], "_")
    )
}

/// The longest socket file name: unix socket paths hold at most 107 bytes,
/// and the device-plugins directory takes some of them.
const MAX_SOCKET_NAME: usize = 48;

/// The file name of a resource's socket in the device-plugins directory; a
/// long resource name is cut and made unique with a hash of the whole name.
///
/// ```
/// use gkm_k8s_devices::naming::socket_name;
/// assert_eq!(socket_name("nvidia.com/GRID_T4-2Q"), "gkm-nvidia.com_GRID_T4-2Q.sock");
/// let long = socket_name("nvidia.com/TU104GL_QUADRO_RTX_4000_MOBILE___MAXQ");
/// assert_eq!(long, "gkm-nvidia.com_TU104GL_QUADRO_RTX_-5f24acf1.sock");
/// assert!(long.len() <= 48);
/// ```
pub fn socket_name(resource: &str) -> String {
    let name = format!("gkm-{}.sock", resource.replace('/', "_"));
    if name.len() <= MAX_SOCKET_NAME {
        return name;
    }
    // FNV-1a: stable across builds and platforms.
    let hash = resource.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let keep = MAX_SOCKET_NAME - ".sock".len() - 9;
    let head: String = name.chars().take(keep).collect();
    format!("{head}-{hash:08x}.sock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_ids_names_become_the_names_kubevirt_users_know() {
        let cases = [
            ("GK210GL [Tesla K80]", "GK210GL_TESLA_K80"),
            ("GA100 [A100 PCIe 40GB]", "GA100_A100_PCIE_40GB"),
            ("TU104GL [Tesla T4]", "TU104GL_TESLA_T4"),
            ("AD102GL [L40S]", "AD102GL_L40S"),
            ("GH100 [H100 NVL]", "GH100_H100_NVL"),
            ("GB100 [B200]", "GB100_B200"),
            (
                "Aqua Vanjaram [Instinct MI300X]",
                "AQUA_VANJARAM_INSTINCT_MI300X",
            ),
            (
                "Aldebaran/MI200 [Instinct MI210]",
                "ALDEBARAN_MI200_INSTINCT_MI210",
            ),
            // `.` and `/` become `_`; `+`, `(`, `)` and `-` are dropped.
            (
                "GP104GL [Tesla P4 (v1.0) +8GB]",
                "GP104GL_TESLA_P4_V1_0_8GB",
            ),
            ("Device\t  2330", "DEVICE_2330"),
            // Tabs and repeated spaces are one `_`.
            ("GA102GL  [RTX A6000]", "GA102GL_RTX_A6000"),
        ];
        for (pci_ids, want) in cases {
            assert_eq!(model_name(Some(pci_ids), 0x2330), want, "{pci_ids}");
        }
    }

    #[test]
    fn names_kubernetes_would_refuse_are_made_valid() {
        // Only punctuation: the device id stands in.
        assert_eq!(model_name(Some("[?]"), 0x20b5), "20B5");
        assert_eq!(model_name(Some(""), 0x20b5), "20B5");
        // Leading and trailing `_` are trimmed.
        assert_eq!(model_name(Some(" / GPU / "), 0x1), "GPU");
        // Non-ASCII letters are dropped, not kept.
        assert_eq!(model_name(Some("GPU Ü"), 0x1), "GPU");
        // At most 63 characters, ending with a letter or digit.
        let long = "A".repeat(62) + " B";
        let name = model_name(Some(&long), 0x1);
        assert_eq!(name, "A".repeat(62));
        assert!(name.len() <= 63);
        assert_eq!(
            mdev_name(Some("  GRID  A100-4C "), "nvidia-1"),
            "GRID_A100-4C"
        );
        assert_eq!(mdev_name(Some("GRID T4-2Q (2 GB)"), "x"), "GRID_T4-2Q_2_GB");
        assert_eq!(mdev_name(Some("!!"), "nvidia-222"), "nvidia-222");
    }
}
