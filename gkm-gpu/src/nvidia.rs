//! NVIDIA GPUs through NVML, loaded at run time.
//!
//! A node without `libnvidia-ml.so.1`, or without the kernel driver loaded,
//! has no NVIDIA driver: that is a state, not an error.

use gkm_core::Arch;
use gkm_core::gpu::MigMode;
use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::inventory::NvmlStatus;
use crate::pci::PciDevice;
use gkm_core::Gpu;

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    /// `GPU-…`.
    pub uuid: Option<String>,
    /// Marketing name, `NVIDIA H100 80GB HBM3`.
    pub name: Option<String>,
    /// From the CUDA compute capability.
    pub arch: Option<Arch>,
    /// Total device memory.
    pub memory_bytes: Option<u64>,
    /// PCI address in sysfs form, `0000:3b:00.0`.
    pub pci_address: Option<String>,
    /// Current MIG mode, for GPUs that support MIG.
    pub mig_mode: Option<MigMode>,
}

/// What NVML said: its status and the GPUs it listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvmlReport {
    /// Loaded, no driver, or failed.
    pub status: NvmlStatus,
    /// The GPUs, in NVML's order.
    pub gpus: Vec<NvmlGpu>,
    /// Per-device problems.
    pub warnings: Vec<String>,
}

/// Loads NVML (`libnvidia-ml.so.1`) and initialises it.
///
/// A missing library or kernel driver is [`NvmlStatus::NoDriver`]; any other
/// failure is [`NvmlStatus::Failed`].
pub fn open() -> Result<Nvml, NvmlStatus> {
    Nvml::init().map_err(|e| {
        if means_no_driver(&e) {
            NvmlStatus::NoDriver {
                reason: e.to_string(),
            }
        } else {
            NvmlStatus::Failed {
                reason: e.to_string(),
            }
        }
    })
}

/// Asks NVML for the node's NVIDIA GPUs.
pub fn query() -> NvmlReport {
    let nvml = match open() {
        Ok(nvml) => nvml,
        Err(status) => {
            let warnings = match &status {
                NvmlStatus::Failed { reason } => vec![format!("NVML failed to start: {reason}")],
                _ => Vec::new(),
            };
            return NvmlReport {
                status,
                warnings,
                ..NvmlReport::default()
            };
        }
    };
    let mut report = NvmlReport::default();
    let driver_version = nvml.sys_driver_version().unwrap_or_default();
    let cuda_driver_version = nvml.sys_cuda_driver_version().ok().map(cuda_version_string);
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            report.status = NvmlStatus::Failed {
                reason: format!("cannot count devices: {e}"),
            };
            report
                .warnings
                .push(format!("NVML cannot count devices: {e}"));
            return report;
        }
    };
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                report.warnings.push(format!("NVML device {index}: {e}"));
                continue;
            }
        };
        report.gpus.push(NvmlGpu {
            uuid: device.uuid().ok(),
            name: device.name().ok(),
            arch: device.cuda_compute_capability().ok().and_then(|cc| {
                Some(Arch::from_compute_capability(
                    cc.major.try_into().ok()?,
                    cc.minor.try_into().ok()?,
                ))
            }),
            memory_bytes: device.memory_info().ok().map(|m| m.total),
            pci_address: device
                .pci_info()
                .ok()
                .and_then(|p| normalise_bus_id(&p.bus_id)),
            mig_mode: device.mig_mode().ok().map(|m| {
                if m.current == 1 {
                    MigMode::Enabled
                } else {
                    MigMode::Disabled
                }
            }),
        });
    }
    report.status = NvmlStatus::Loaded {
        driver_version,
        cuda_driver_version,
        device_count: count,
    };
    report
}

/// What the NVIDIA kernel driver tells about one GPU in
/// `/proc/driver/nvidia/gpus/<address>/information`, without NVML.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcGpuInfo {
    /// `GPU UUID`, `GPU-…`.
    pub uuid: Option<String>,
    /// `Device Minor`: the GPU's `/dev/nvidia<minor>`.
    pub minor: Option<u32>,
}

/// Reads `PROC/driver/nvidia/gpus/<address>/information`; `None` when the
/// file is missing (no NVIDIA driver, or the GPU is not on it).
///
/// ```
/// let proc_root = tempfile::tempdir().unwrap();
/// let dir = proc_root.path().join("driver/nvidia/gpus/0000:3b:00.0");
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("information"),
///     "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-8f3a\nDevice Minor: \t 2\n").unwrap();
/// let info = gkm_gpu::nvidia::proc_info(proc_root.path(), "0000:3b:00.0").unwrap();
/// assert_eq!(info.uuid.as_deref(), Some("GPU-8f3a"));
/// assert_eq!(info.minor, Some(2));
/// ```
pub fn proc_info(proc_root: &std::path::Path, address: &str) -> Option<ProcGpuInfo> {
    let path = proc_root
        .join("driver/nvidia/gpus")
        .join(address)
        .join("information");
    let text = crate::pci::read_trimmed(&path).ok().flatten()?;
    let mut info = ProcGpuInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key.trim() {
            "GPU UUID" if !value.is_empty() => info.uuid = Some(value.to_string()),
            "Device Minor" => info.minor = value.parse().ok(),
            _ => {}
        }
    }
    Some(info)
}

/// XIDs that report an application's fault, not the GPU's, and so do not
/// make a GPU unhealthy: 31 (memory page fault), 43 (a channel stopped),
/// 45 (preemptive cleanup).
pub const IGNORED_XIDS: &[u64] = &[31, 43, 45];

/// A critical XID error NVML reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    /// The GPU's PCI address, sysfs form; `None` when NVML could not say.
    pub pci_address: Option<String>,
    /// The XID; `None` when NVML reports it as unknown.
    pub xid: Option<u64>,
}

impl XidEvent {
    /// Whether the event marks the GPU unhealthy (an unknown XID does).
    pub fn is_critical(&self) -> bool {
        self.xid.is_none_or(|x| !IGNORED_XIDS.contains(&x))
    }
}

/// Waits for NVML's critical XID events on every NVIDIA GPU and hands each
/// to `on_event`, until `stop` is set (checked every few seconds). Blocking:
/// run it on a thread of its own. Returns why it ended: at once when NVML is
/// absent or cannot watch events, which is not an error for callers (no
/// NVML, no XIDs).
pub fn watch_xids(
    stop: &std::sync::atomic::AtomicBool,
    mut on_event: impl FnMut(XidEvent),
) -> String {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    let nvml = match Nvml::init() {
        Ok(nvml) => nvml,
        Err(e) => return format!("NVML not available: {e}"),
    };
    let Ok(count) = nvml.device_count() else {
        return "NVML cannot count devices".to_string();
    };
    let mut set = match nvml.create_event_set() {
        Ok(set) => set,
        Err(e) => return format!("NVML cannot create an event set: {e}"),
    };
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        set = match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(set) => set,
            Err(e) => return format!("NVML cannot watch XIDs of device {index}: {}", e.error),
        };
    }
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match set.wait(2000) {
            Ok(data) => {
                let event = XidEvent {
                    pci_address: data
                        .device
                        .pci_info()
                        .ok()
                        .and_then(|p| normalise_bus_id(&p.bus_id)),
                    xid: match data.event_data {
                        Some(XidError::Value(v)) => Some(v),
                        _ => None,
                    },
                };
                on_event(event);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => return format!("NVML stopped reporting events: {e}"),
        }
    }
    "stopped".to_string()
}

fn means_no_driver(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::LibloadingError(_)
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::LibraryNotFound
            | NvmlError::DriverNotLoaded
    )
}

/// NVML's CUDA driver version number as `major.minor`: 12040 → `12.4`.
pub fn cuda_version_string(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// NVML's bus id (`00000000:3B:00.0`) in sysfs form (`0000:3b:00.0`).
///
/// ```
/// assert_eq!(gkm_gpu::nvidia::normalise_bus_id("00000000:3B:00.0").as_deref(), Some("0000:3b:00.0"));
/// assert_eq!(gkm_gpu::nvidia::normalise_bus_id("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"));
/// assert_eq!(gkm_gpu::nvidia::normalise_bus_id("junk"), None);
/// ```
pub fn normalise_bus_id(bus_id: &str) -> Option<String> {
    let lower = bus_id.trim().trim_end_matches('\0').to_ascii_lowercase();
    let (domain, rest) = lower.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let address = format!("{:04x}:{rest}", domain & 0xffff);
    crate::pci::is_pci_address(&address).then_some(address)
}

/// The CUDA compute capability of an NVIDIA data-center GPU by PCI device
/// id, for when NVML is not there to ask.
///
/// ```
/// assert_eq!(gkm_gpu::nvidia::compute_capability(0x2330), Some((9, 0)));
/// assert_eq!(gkm_gpu::nvidia::compute_capability(0x1eb8), Some((7, 5)));
/// ```
pub fn compute_capability(device_id: u16) -> Option<(u32, u32)> {
    Some(match device_id {
        0x1db1..=0x1db8 | 0x1df6 => (7, 0),
        0x1eb8 => (7, 5),
        0x20b0..=0x20b7 | 0x20f1 | 0x20f3 | 0x20f5 => (8, 0),
        0x2235..=0x2237 => (8, 6),
        0x26b5 | 0x26b9 | 0x27b8 => (8, 9),
        0x2321..=0x2324 | 0x2330 | 0x2331 | 0x2335 | 0x2342 => (9, 0),
        0x2901 | 0x2941 => (10, 0),
        0x3182 => (10, 3),
        0x2bb5 => (12, 0),
        _ => return None,
    })
}

/// Fills in what a GPU on the nvidia driver has beyond sysfs: warp size,
/// compute capability by device id, then what NVML says of the GPU at
/// `dev`'s address (taken out of `nvml_gpus`).
pub(crate) fn enrich(
    gpu: &mut Gpu,
    dev: &PciDevice,
    nvml_gpus: &mut Vec<NvmlGpu>,
    status: &NvmlStatus,
) {
    gpu.warp_size = Some(32);
    gpu.arch = compute_capability(dev.device_id)
        .map(|(major, minor)| Arch::from_compute_capability(major, minor));
    if let Some(pos) = nvml_gpus
        .iter()
        .position(|n| n.pci_address.as_deref() == Some(dev.address.as_str()))
    {
        apply_nvml(gpu, nvml_gpus.remove(pos), status);
    }
}

/// What NVML says of one GPU, over what sysfs said.
pub(crate) fn apply_nvml(gpu: &mut Gpu, n: NvmlGpu, status: &NvmlStatus) {
    if let Some(name) = n.name {
        gpu.product = name;
    }
    gpu.uuid = n.uuid.or(gpu.uuid.take());
    gpu.arch = n.arch.or(gpu.arch.take());
    gpu.memory_bytes = n.memory_bytes.or(gpu.memory_bytes);
    gpu.mig_mode = n.mig_mode;
    if let NvmlStatus::Loaded {
        driver_version,
        cuda_driver_version,
        ..
    } = status
    {
        if !driver_version.is_empty() {
            gpu.driver_version = Some(driver_version.clone());
        }
        gpu.toolkit_version = cuda_driver_version.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/driver/nvidia/gpus/0000:00:06.0/information` as the 580
    /// driver wrote it for an H100.
    const H100_INFORMATION: &str = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 41\n\
        GPU UUID: \t GPU-371a41ef-f7a7-1e92-4980-6239ca4d139c\nVideo BIOS: \t 96.00.da.00.0c\n\
        Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
        Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\n\
        GPU Excluded:\t No\n";

    #[test]
    fn the_drivers_proc_information_gives_uuid_and_minor() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("driver/nvidia/gpus/0000:00:06.0");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("information"), H100_INFORMATION).unwrap();
        assert_eq!(
            proc_info(root.path(), "0000:00:06.0"),
            Some(ProcGpuInfo {
                uuid: Some("GPU-371a41ef-f7a7-1e92-4980-6239ca4d139c".into()),
                minor: Some(0),
            })
        );
        assert_eq!(proc_info(root.path(), "0000:00:07.0"), None);
    }

    #[test]
    fn xids_of_application_faults_are_not_critical() {
        let event = |xid| XidEvent {
            pci_address: Some("0000:00:06.0".into()),
            xid,
        };
        for xid in [31, 43, 45] {
            assert!(!event(Some(xid)).is_critical(), "{xid}");
        }
        for xid in [48, 63, 64, 74, 79, 94, 95] {
            assert!(event(Some(xid)).is_critical(), "{xid}");
        }
        assert!(event(None).is_critical());
    }

    #[test]
    fn cuda_versions_read_as_major_minor() {
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
        assert_eq!(cuda_version_string(13000), "13.0");
    }

    #[test]
    fn without_a_driver_nvml_reports_no_driver_not_failure() {
        // This machine may or may not have an NVIDIA driver; either way the
        // call returns a state, and a failure to load is never `Failed`.
        let report = query();
        match &report.status {
            NvmlStatus::Loaded { device_count, .. } => {
                assert_eq!(
                    *device_count as usize,
                    report.gpus.len() + report.warnings.len()
                )
            }
            NvmlStatus::NoDriver { reason } => {
                assert!(!reason.is_empty());
                assert!(report.gpus.is_empty());
            }
            other => panic!("unexpected NVML status {other:?}"),
        }
    }
}
