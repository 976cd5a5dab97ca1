//! Names from the PCI ID Repository (`pci.ids`).
//!
//! The system copy (Debian's `pci.ids` package, hwdata) is read when present;
//! a small bundled table covers the GPUs gkm cares about when it is not, and
//! devices newer than the system copy.
//!
//! [`PciIds::open`] parses each file once per process (the system copy is
//! about 1.5 MB) and reads it again only when it changed, so discovery run
//! every few seconds does not re-read it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

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

    /// Opens the database a [`PciIdsSource`] names: a file completed by
    /// the bundled table ([`PciIdsSource::System`]: the first readable
    /// [`SYSTEM_PATHS`] copy, the bundled table alone when there is none).
    ///
    /// Each file is parsed once per process and shared; it is read again
    /// when its identity, modification time or size changed.
    pub fn open(source: &PciIdsSource) -> Result<Arc<PciIds>, Error> {
        match source {
            PciIdsSource::System => {
                for path in SYSTEM_PATHS {
                    if let Ok(ids) = file_completed(Path::new(path)) {
                        return Ok(ids);
                    }
                }
                tracing::debug!("no system pci.ids found; using the bundled table");
                Ok(bundled_shared())
            }
            PciIdsSource::Bundled => Ok(bundled_shared()),
            PciIdsSource::File(path) => file_completed(path),
        }
    }

    /// Adds the bundled entries this database lacks.
    pub fn with_fallback(mut self) -> PciIds {
        let bundled = bundled_shared();
        for (id, name) in &bundled.vendors {
            self.vendors.entry(*id).or_insert_with(|| name.clone());
        }
        for (id, name) in &bundled.devices {
            self.devices.entry(*id).or_insert_with(|| name.clone());
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

/// The bundled table, parsed once.
fn bundled_shared() -> Arc<PciIds> {
    static BUNDLED_IDS: OnceLock<Arc<PciIds>> = OnceLock::new();
    BUNDLED_IDS
        .get_or_init(|| Arc::new(PciIds::bundled()))
        .clone()
}

/// What tells that a file changed: its device and inode (a replaced file),
/// modification time and size.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    modified: Option<SystemTime>,
    len: u64,
}

impl FileStamp {
    fn of(path: &Path) -> Result<FileStamp, Error> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        Ok(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            modified: meta.modified().ok(),
            len: meta.len(),
        })
    }
}

/// The database in the file at `path`, completed by the bundled table:
/// parsed again only when the file's [`FileStamp`] changed since the last
/// parse of this path.
fn file_completed(path: &Path) -> Result<Arc<PciIds>, Error> {
    static PARSED: Mutex<BTreeMap<PathBuf, (FileStamp, Arc<PciIds>)>> = Mutex::new(BTreeMap::new());
    let stamp = FileStamp::of(path)?;
    if let Some((seen, ids)) = PARSED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(path)
        && *seen == stamp
    {
        return Ok(ids.clone());
    }
    // Parsed without the lock held; a file changed while being read has a
    // new stamp at the next call, and is read again then.
    let ids = Arc::new(PciIds::load(path)?.with_fallback());
    PARSED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(path.to_path_buf(), (stamp, ids.clone()));
    Ok(ids)
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
        let ids = PciIds::open(&PciIdsSource::System).unwrap();
        // With or without the system copy, the GPUs gkm cares about have names.
        assert_eq!(ids.product(0x1002, 0x740f), "AMD Instinct MI210");
        assert_eq!(ids.product(0x10de, 0x1eb8), "NVIDIA Tesla T4");
    }

    #[test]
    fn a_file_is_parsed_once_and_a_changed_file_or_another_path_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.ids"), dir.path().join("b.ids"));
        std::fs::write(&a, "1234  Acme Corp\n\t5678  W1 [Widget One]\n").unwrap();
        std::fs::write(&b, "1234  Acme Corp\n\t5678  W2 [Widget Two]\n").unwrap();
        let first = PciIds::open(&PciIdsSource::File(a.clone())).unwrap();
        assert_eq!(first.product(0x1234, 0x5678), "Acme Widget One");
        // Completed by the bundled table.
        assert_eq!(first.product(0x10de, 0x2330), "NVIDIA H100 SXM5 80GB");
        let again = PciIds::open(&PciIdsSource::File(a.clone())).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "parsed again");

        let other = PciIds::open(&PciIdsSource::File(b)).unwrap();
        assert_eq!(other.product(0x1234, 0x5678), "Acme Widget Two");

        // Replaced (a new file, as package upgrades write it).
        let new = dir.path().join("a.new");
        std::fs::write(&new, "1234  Acme Corp\n\t5678  W3 [Widget Three]\n").unwrap();
        std::fs::rename(&new, &a).unwrap();
        let changed = PciIds::open(&PciIdsSource::File(a.clone())).unwrap();
        assert_eq!(changed.product(0x1234, 0x5678), "Acme Widget Three");

        std::fs::remove_file(&a).unwrap();
        let err = PciIds::open(&PciIdsSource::File(a.clone())).unwrap_err();
        assert!(err.to_string().contains("a.ids"), "{err}");
    }
}
