//! Scanning `/sys/bus/pci/devices` with the sysfs root as a parameter.

use std::io;
use std::path::{Path, PathBuf};

use crate::Error;

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// PCI address, `dddd:bb:dd.f`, lowercase.
    pub address: String,
    /// The function's directory under `bus/pci/devices`.
    pub path: PathBuf,
    /// `vendor`.
    pub vendor_id: u16,
    /// `device`.
    pub device_id: u16,
    /// `subsystem_vendor`, when present.
    pub subsystem_vendor_id: Option<u16>,
    /// `subsystem_device`, when present.
    pub subsystem_device_id: Option<u16>,
    /// `class`, 24 bits: base class, subclass, programming interface.
    pub class: u32,
    /// The bound driver (the name the `driver` link points to).
    pub driver: Option<String>,
    /// `numa_node`; `None` for `-1` or when absent.
    pub numa_node: Option<u32>,
    /// The IOMMU group number (the name the `iommu_group` link points to).
    pub iommu_group: Option<u32>,
}

impl PciDevice {
    /// Vendor and device id as `lspci -n` prints them, `10de:2330`.
    pub fn pci_id(&self) -> String {
        format!("{:04x}:{:04x}", self.vendor_id, self.device_id)
    }

    /// The class code as sysfs writes it, `0x030200`.
    pub fn class_code(&self) -> String {
        format!("0x{:06x}", self.class)
    }

    /// A display controller (VGA, 3D, other): class 0x03.
    pub fn is_display(&self) -> bool {
        self.class >> 16 == 0x03
    }

    /// A processing accelerator: class 0x1200.
    pub fn is_accelerator(&self) -> bool {
        self.class >> 8 == 0x1200
    }

    /// A PCI-to-PCI bridge: class 0x0604.
    pub fn is_bridge(&self) -> bool {
        self.class >> 8 == 0x0604
    }

    /// Bound to a VFIO driver (`vfio-pci`, `nvgrace_gpu_vfio_pci`, …).
    pub fn is_vfio(&self) -> bool {
        self.driver.as_deref().is_some_and(is_vfio_driver)
    }
}

/// Whether a driver name is a VFIO driver.
pub fn is_vfio_driver(driver: &str) -> bool {
    driver.contains("vfio")
}

/// Scans `ROOT/bus/pci/devices`, in address order.
///
/// A function whose required files (`vendor`, `device`, `class`) are missing
/// or malformed is skipped with a warning; a root with no PCI bus at all is
/// an error.
///
/// ```no_run
/// let mut warnings = Vec::new();
/// for dev in gkm_gpu::pci::scan("/sys".as_ref(), &mut warnings)? {
///     println!("{} {} {:?}", dev.address, dev.pci_id(), dev.driver);
/// }
/// # Ok::<(), gkm_gpu::Error>(())
/// ```
pub fn scan(root: &Path, warnings: &mut Vec<String>) -> Result<Vec<PciDevice>, Error> {
    let dir = root.join("bus/pci/devices");
    let entries = match sorted_entries(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Error::NotSysfs {
                path: root.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io(dir, e)),
    };
    let mut devices = Vec::new();
    for entry in entries {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_pci_address(&name) {
            warnings.push(format!(
                "{}: not a PCI address (expected dddd:bb:dd.f); skipped",
                entry.path().display()
            ));
            continue;
        }
        match read_device(&entry.path(), &name) {
            Ok(dev) => devices.push(dev),
            Err(msg) => warnings.push(format!("PCI device {name} skipped: {msg}")),
        }
    }
    devices.sort_by(|a, b| a.address.cmp(&b.address));
    Ok(devices)
}

fn read_device(path: &Path, name: &str) -> Result<PciDevice, String> {
    if !path.is_dir() {
        return Err(format!("{} leads to no directory", path.display()));
    }
    let required = |file: &str| -> Result<u32, String> {
        let p = path.join(file);
        match read_trimmed(&p) {
            Ok(Some(text)) => parse_hex(&text).ok_or_else(|| {
                format!(
                    "{}: expected a hex number like 0x10de, found {text:?}",
                    p.display()
                )
            }),
            Ok(None) => Err(format!("{} is missing", p.display())),
            Err(e) => Err(format!("cannot read {}: {e}", p.display())),
        }
    };
    let optional_id = |file: &str| -> Option<u16> {
        read_trimmed(&path.join(file))
            .ok()
            .flatten()
            .and_then(|t| parse_hex(&t))
            .and_then(|v| u16::try_from(v).ok())
    };
    let vendor_id = u16::try_from(required("vendor")?)
        .map_err(|_| format!("{}: vendor id wider than 16 bits", path.display()))?;
    let device_id = u16::try_from(required("device")?)
        .map_err(|_| format!("{}: device id wider than 16 bits", path.display()))?;
    let class = required("class")?;
    Ok(PciDevice {
        address: name.to_ascii_lowercase(),
        path: path.to_path_buf(),
        vendor_id,
        device_id,
        subsystem_vendor_id: optional_id("subsystem_vendor"),
        subsystem_device_id: optional_id("subsystem_device"),
        class,
        driver: link_name(&path.join("driver")),
        numa_node: read_trimmed(&path.join("numa_node"))
            .ok()
            .flatten()
            .and_then(|t| t.parse::<u32>().ok()),
        iommu_group: link_name(&path.join("iommu_group")).and_then(|g| g.parse().ok()),
    })
}

/// Whether a name is a PCI address, `dddd:bb:dd.f`.
pub fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11]
            .iter()
            .all(|&i| b[i].is_ascii_hexdigit())
}

/// A directory's entries in name order, so results and warnings do not
/// depend on the file system's order.
pub(crate) fn sorted_entries(dir: &Path) -> io::Result<Vec<std::fs::DirEntry>> {
    let mut entries = std::fs::read_dir(dir)?.collect::<io::Result<Vec<_>>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    Ok(entries)
}

/// A file's contents, trimmed; `None` when it does not exist.
pub(crate) fn read_trimmed(path: &Path) -> io::Result<Option<String>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).trim().to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The last component of where a symlink points (`driver` → `nvidia`).
pub(crate) fn link_name(path: &Path) -> Option<String> {
    let target = std::fs::read_link(path).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// `0x10de`, `10de` → 0x10de.
pub(crate) fn parse_hex(text: &str) -> Option<u32> {
    let t = text.trim();
    let digits = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_pci_addresses() {
        assert!(is_pci_address("0000:3b:00.0"));
        assert!(is_pci_address("0001:C1:1f.7"));
        for bad in ["0000:3b:00", "3b:00.0", "0000:3b:00.0x", "zzzz:3b:00.0", ""] {
            assert!(!is_pci_address(bad), "{bad}");
        }
    }

    #[test]
    fn parses_sysfs_hex() {
        assert_eq!(parse_hex("0x10de\n"), Some(0x10de));
        assert_eq!(parse_hex("0x030200"), Some(0x030200));
        assert_eq!(parse_hex("10DE"), Some(0x10de));
        for bad in ["", "0x", "nvidia", "0x123456789"] {
            assert_eq!(parse_hex(bad), None, "{bad}");
        }
    }
}
