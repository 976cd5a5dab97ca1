//! AMD readings from the amdgpu driver's sysfs files under the GPU's PCI
//! device: `gpu_busy_percent`, `mem_info_vram_used`/`_total`, the `hwmon`
//! sensors (`temp1_input` in millidegrees, `power1_average` or
//! `power1_input` in microwatts, `freq1_input`/`freq2_input` in hertz for the
//! shader and memory clocks, `energy1_input` in microjoules) and the RAS
//! counters in `ras/umc_err_count` (`ue: N` / `ce: N`).

use std::path::{Path, PathBuf};

use gkm_core::Gpu;

use super::{GpuReadings, Source};
use crate::pci::{read_trimmed, sorted_entries};

/// Reads one AMD GPU from `ROOT/bus/pci/devices/<address>`.
pub(super) fn read(root: &Path, gpu: &Gpu) -> GpuReadings {
    let mut r = GpuReadings::identity(gpu, Source::Sysfs);
    let Some(address) = &gpu.pci_address else {
        return r;
    };
    let dir = root.join("bus/pci/devices").join(address);
    r.utilization_ratio = number(&dir.join("gpu_busy_percent")).map(|p| p as f64 / 100.0);
    r.memory_used_bytes = number(&dir.join("mem_info_vram_used"));
    r.memory_total_bytes = number(&dir.join("mem_info_vram_total"));
    if let Some(hwmon) = hwmon_dir(&dir) {
        let sensor = |name: &str| number(&hwmon.join(name)).map(|v| v as f64);
        r.temperature_celsius = sensor("temp1_input").map(|m| m / 1000.0);
        r.power_watts = sensor("power1_average")
            .or_else(|| sensor("power1_input"))
            .map(|uw| uw / 1e6);
        r.energy_joules = sensor("energy1_input").map(|uj| uj / 1e6);
        r.sm_clock_hertz = sensor("freq1_input");
        r.memory_clock_hertz = sensor("freq2_input");
    }
    if let Ok(Some(text)) = read_trimmed(&dir.join("ras/umc_err_count")) {
        let count = |key: &str| {
            text.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == key)
                .and_then(|(_, v)| v.trim().parse::<u64>().ok())
        };
        r.ecc_uncorrected_errors = count("ue");
        r.ecc_corrected_errors = count("ce");
    }
    r
}

/// The first `hwmon/hwmonN` directory of the device.
fn hwmon_dir(dir: &Path) -> Option<PathBuf> {
    sorted_entries(&dir.join("hwmon"))
        .ok()?
        .into_iter()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("hwmon"))
        })
}

/// A file holding one unsigned number; `None` when missing or malformed.
fn number(path: &Path) -> Option<u64> {
    read_trimmed(path).ok().flatten()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_amdgpu_files_and_leaves_missing_ones_out() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("bus/pci/devices/0000:83:00.0");
        std::fs::create_dir_all(dev.join("hwmon/hwmon4")).unwrap();
        std::fs::create_dir_all(dev.join("ras")).unwrap();
        for (file, value) in [
            ("gpu_busy_percent", "37"),
            ("mem_info_vram_used", "1073741824"),
            ("mem_info_vram_total", "68702699520"),
            ("hwmon/hwmon4/temp1_input", "45000"),
            ("hwmon/hwmon4/power1_average", "91000000"),
            ("hwmon/hwmon4/freq1_input", "800000000"),
            ("ras/umc_err_count", "ue: 0\nce: 3\n"),
        ] {
            std::fs::write(dev.join(file), value).unwrap();
        }
        let gpu = Gpu {
            pci_address: Some("0000:83:00.0".into()),
            product: "AMD Instinct MI210".into(),
            ..Gpu::default()
        };
        let r = read(root.path(), &gpu);
        assert_eq!(r.utilization_ratio, Some(0.37));
        assert_eq!(r.memory_used_bytes, Some(1 << 30));
        assert_eq!(r.memory_total_bytes, Some(68702699520));
        assert_eq!(r.temperature_celsius, Some(45.0));
        assert_eq!(r.power_watts, Some(91.0));
        assert_eq!(r.sm_clock_hertz, Some(8e8));
        assert_eq!(r.ecc_corrected_errors, Some(3));
        assert_eq!(r.ecc_uncorrected_errors, Some(0));
        // No memory clock, energy, XID or throttle files: absent, not zero.
        assert_eq!(r.memory_clock_hertz, None);
        assert_eq!(r.energy_joules, None);
        assert_eq!(r.xid_errors, None);
        assert_eq!(r.throttle_reasons, None);
    }
}
