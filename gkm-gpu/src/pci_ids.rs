//! Names from the PCI ID Repository (`pci.ids`).
//!
//! The system copy (Debian's `pci.ids` package, hwdata) is read when present;
//! a small bundled table covers the GPUs gkm cares about when it is not, and
//! devices newer than the system copy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::Error;

/// Where the system keeps `pci.ids`, in the order they are tried.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
];

const BUNDLED: &str = include_str!("pci_ids_fallback.ids");

/// Which PCI IDs database discovery names devices from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PciIdsSource {
    /// The system's `pci.ids` (see [`SYSTEM_PATHS`]), completed by the bundled
    /// table.
    #[default]
    System,
    /// Only the bundled table: the same names on every machine.
    Bundled,
    /// This file, completed by the bundled table.
    File(PathBuf),
}

/// Vendor and device names, looked up by PCI id.
///
/// ```
/// let ids = gkm_gpu::pci_ids::PciIds::bundled();
/// assert_eq!(ids.device(0x1002, 0x74a1), Some("Aqua Vanjaram [Instinct MI300X]"));
/// assert_eq!(ids.product(0x1002, 0x74a1), "AMD Instinct MI300X");
/// assert_eq!(ids.product(0x10de, 0x2330), "NVIDIA H100 SXM5 80GB");
/// ```
#[derive(Debug, Clone, Default)]
pub struct PciIds {
    vendors: HashMap<u16, String>,
    devices: HashMap<(u16, u16), String>,
}

impl PciIds {
    /// Reads the `pci.ids` format: `vvvv  Vendor` lines, tab-indented
    /// `dddd  Device` lines; subsystems, comments and the class list are
    /// skipped, and so are lines that do not parse.
    pub fn parse(text: &str) -> PciIds {
        let mut ids = PciIds::default();
        let mut vendor: Option<u16> = None;
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if line.starts_with("C ") {
                break;
            }
            if let Some(rest) = line.strip_prefix('\t') {
                if rest.starts_with('\t') {
                    continue;
                }
                if let (Some(v), Some((id, name))) = (vendor, split_entry(rest)) {
                    ids.devices.insert((v, id), name.to_string());
                }
            } else {
                vendor = split_entry(line).map(|(id, name)| {
                    ids.vendors.insert(id, name.to_string());
                    id
                });
            }
        }
        ids
    }

    /// Reads a `pci.ids` file.
    pub fn load(path: &Path) -> Result<PciIds, Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Ok(PciIds::parse(&String::from_utf8_lossy(&bytes)))
    }

    /// The bundled table only.
    pub fn bundled() -> PciIds {
        PciIds::parse(BUNDLED)
    }

    /// The first readable system copy of `pci.ids`, completed by the bundled
    /// table; the bundled table alone when there is none.
    pub fn system() -> PciIds {
        for path in SYSTEM_PATHS {
            if let Ok(ids) = PciIds::load(Path::new(path)) {
                return ids.with_fallback();
            }
        }
        tracing::debug!("no system pci.ids found; using the bundled table");
        PciIds::bundled()
    }

    /// Opens the database a [`PciIdsSource`] names.
    pub fn open(source: &PciIdsSource) -> Result<PciIds, Error> {
        Ok(match source {
            PciIdsSource::System => PciIds::system(),
            PciIdsSource::Bundled => PciIds::bundled(),
            PciIdsSource::File(path) => PciIds::load(path)?.with_fallback(),
        })
    }

    /// Adds the bundled entries this database lacks.
    pub fn with_fallback(mut self) -> PciIds {
        let bundled = PciIds::bundled();
        for (id, name) in bundled.vendors {
            self.vendors.entry(id).or_insert(name);
        }
        for (id, name) in bundled.devices {
            self.devices.entry(id).or_insert(name);
        }
        self
    }

    /// The vendor's name, `NVIDIA Corporation`.
    pub fn vendor(&self, vendor: u16) -> Option<&str> {
        self.vendors.get(&vendor).map(String::as_str)
    }

    /// The device's name as the database writes it, `GH100 [H100 SXM5 80GB]`.
    pub fn device(&self, vendor: u16, device: u16) -> Option<&str> {
        self.devices.get(&(vendor, device)).map(String::as_str)
    }

    /// A product name for people: the marketing name in brackets when the
    /// database has one, after the vendor's brand (`NVIDIA H100 SXM5 80GB`,
    /// `AMD Instinct MI210`); `NVIDIA device 10de:abcd` when it has none.
    pub fn product(&self, vendor: u16, device: u16) -> String {
        let brand = match vendor {
            0x10de => "NVIDIA".to_string(),
            0x1002 => "AMD".to_string(),
            0x8086 | 0x1da3 => "Intel".to_string(),
            _ => self
                .vendor(vendor)
                .and_then(|v| v.split_whitespace().next())
                .unwrap_or("PCI")
                .trim_end_matches(',')
                .to_string(),
        };
        let Some(name) = self.device(vendor, device) else {
            return format!("{brand} device {vendor:04x}:{device:04x}");
        };
        let core = bracketed(name).unwrap_or(name).trim();
        if core
            .to_ascii_lowercase()
            .starts_with(&brand.to_ascii_lowercase())
        {
            core.to_string()
        } else {
            format!("{brand} {core}")
        }
    }
}

/// `abcd  Name` → (0xabcd, "Name").
fn split_entry(line: &str) -> Option<(u16, &str)> {
    let (id, name) = line.split_once(char::is_whitespace)?;
    if id.len() != 4 {
        return None;
    }
    let id = u16::from_str_radix(id, 16).ok()?;
    let name = name.trim();
    (!name.is_empty()).then_some((id, name))
}

/// The text inside the last `[...]` of a name, if it is not empty.
fn bracketed(name: &str) -> Option<&str> {
    let open = name.rfind('[')?;
    let close = open + name[open..].find(']')?;
    let inner = name[open + 1..close].trim();
    (!inner.is_empty()).then_some(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vendors_devices_and_skips_subsystems_and_classes() {
        let ids = PciIds::parse(
            "# comment\n10de  NVIDIA Corporation\n\t1eb8  TU104GL [Tesla T4]\n\t\t10de 12a2  T4 16GB\n\
             bogus line\n\tzzzz  not hex\nC 03  Display controller\n\t02  3D controller\n",
        );
        assert_eq!(ids.vendor(0x10de), Some("NVIDIA Corporation"));
        assert_eq!(ids.device(0x10de, 0x1eb8), Some("TU104GL [Tesla T4]"));
        assert_eq!(ids.product(0x10de, 0x1eb8), "NVIDIA Tesla T4");
        assert_eq!(ids.devices.len(), 1);
    }

    #[test]
    fn names_unknown_devices_by_id() {
        let ids = PciIds::bundled();
        assert_eq!(ids.product(0x10de, 0xabcd), "NVIDIA device 10de:abcd");
        assert_eq!(ids.product(0x1a03, 0x2000), "ASPEED Graphics Family");
        assert_eq!(ids.product(0x1234, 0x1111), "PCI device 1234:1111");
    }

    #[test]
    fn bundled_table_completes_an_older_database() {
        let old = PciIds::parse("1002  AMD\n\t740f  Aldebaran/MI200 [Instinct MI210]\n");
        assert_eq!(old.device(0x1002, 0x74a1), None);
        let ids = old.with_fallback();
        assert_eq!(ids.product(0x1002, 0x74a1), "AMD Instinct MI300X");
        assert_eq!(ids.vendor(0x1002), Some("AMD"));
    }

    #[test]
    fn system_database_names_gpus_when_installed() {
        let ids = PciIds::system();
        // With or without the system copy, the GPUs gkm cares about have names.
        assert_eq!(ids.product(0x1002, 0x740f), "AMD Instinct MI210");
        assert_eq!(ids.product(0x10de, 0x1eb8), "NVIDIA Tesla T4");
    }
}
