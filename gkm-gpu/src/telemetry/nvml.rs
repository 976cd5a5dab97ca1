//! NVIDIA readings through NVML, with XID errors counted by a thread that
//! waits for NVML's critical-XID events ([`crate::nvidia::watch_xids`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use gkm_core::Gpu;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::{Device, Nvml};
use tracing::debug;

use super::{GpuReadings, Source};
use crate::inventory::NvmlStatus;

/// XID counts by GPU PCI address, then by XID number.
type XidCounts = Arc<Mutex<BTreeMap<String, BTreeMap<u64, u64>>>>;

/// An open NVML and the XID counts its event thread keeps.
pub(super) struct NvmlReader {
    nvml: Nvml,
    xids: XidCounts,
    /// Whether the XID thread is watching; it stops at once where the driver
    /// offers no XID events, and then there are no XID readings.
    watching: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl NvmlReader {
    /// Loads NVML and starts counting XID errors.
    pub(super) fn open() -> Result<NvmlReader, NvmlStatus> {
        let nvml = crate::nvidia::open()?;
        let stop = Arc::new(AtomicBool::new(false));
        let watching = Arc::new(AtomicBool::new(true));
        let xids = XidCounts::default();
        watch_xids(xids.clone(), watching.clone(), stop.clone());
        Ok(NvmlReader {
            nvml,
            xids,
            watching,
            stop,
        })
    }

    /// Reads one GPU, found by UUID or else by PCI address.
    pub(super) fn read(&self, gpu: &Gpu) -> GpuReadings {
        let mut r = GpuReadings::identity(gpu, Source::Nvml);
        let device = match (&gpu.uuid, &gpu.pci_address) {
            (Some(uuid), _) => self.nvml.device_by_uuid(uuid.as_str()),
            (None, Some(address)) => self.nvml.device_by_pci_bus_id(address.as_str()),
            (None, None) => return r,
        };
        let device = match device {
            Ok(d) => d,
            Err(e) => {
                debug!(gpu = gpu.index, error = %e, "NVML does not know this GPU");
                return r;
            }
        };
        read_device(&device, &mut r);
        if let Some(address) = &r.pci_bus_id
            && self.watching.load(Ordering::Relaxed)
        {
            let counts = self.xids.lock().unwrap_or_else(PoisonError::into_inner);
            r.xid_errors = Some(counts.get(address).cloned().unwrap_or_default());
        }
        r
    }
}

impl Drop for NvmlReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read_device(device: &Device<'_>, r: &mut GpuReadings) {
    if r.uuid.is_none() {
        r.uuid = device.uuid().ok();
    }
    r.utilization_ratio = device
        .utilization_rates()
        .ok()
        .map(|u| f64::from(u.gpu) / 100.0);
    if let Ok(memory) = device.memory_info() {
        r.memory_used_bytes = Some(memory.used);
        r.memory_free_bytes = Some(memory.free);
        r.memory_total_bytes = Some(memory.total);
    }
    r.temperature_celsius = device
        .temperature(TemperatureSensor::Gpu)
        .ok()
        .map(f64::from);
    r.power_watts = device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0);
    r.energy_joules = device
        .total_energy_consumption()
        .ok()
        .map(|mj| mj as f64 / 1000.0);
    r.sm_clock_hertz = device
        .clock_info(Clock::SM)
        .ok()
        .map(|mhz| f64::from(mhz) * 1e6);
    r.memory_clock_hertz = device
        .clock_info(Clock::Memory)
        .ok()
        .map(|mhz| f64::from(mhz) * 1e6);
    r.ecc_corrected_errors = device
        .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        .ok();
    r.ecc_uncorrected_errors = device
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .ok();
    r.throttle_reasons = device.current_throttle_reasons().ok().map(throttle_reasons);
}

/// NVML's throttle reasons by the names gkm's metrics use.
const THROTTLE_REASONS: &[(&str, ThrottleReasons)] = &[
    ("gpu_idle", ThrottleReasons::GPU_IDLE),
    (
        "applications_clocks_setting",
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
    ),
    ("sw_power_cap", ThrottleReasons::SW_POWER_CAP),
    ("hw_slowdown", ThrottleReasons::HW_SLOWDOWN),
    ("sync_boost", ThrottleReasons::SYNC_BOOST),
    ("sw_thermal_slowdown", ThrottleReasons::SW_THERMAL_SLOWDOWN),
    ("hw_thermal_slowdown", ThrottleReasons::HW_THERMAL_SLOWDOWN),
    (
        "hw_power_brake_slowdown",
        ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
    ),
    (
        "display_clock_setting",
        ThrottleReasons::DISPLAY_CLOCK_SETTING,
    ),
];

fn throttle_reasons(active: ThrottleReasons) -> BTreeMap<&'static str, bool> {
    THROTTLE_REASONS
        .iter()
        .map(|(name, flag)| (*name, active.contains(*flag)))
        .collect()
}

/// Starts the thread that counts the critical XID events of every device
/// into `counts`, clearing `watching` when it stops.
fn watch_xids(counts: XidCounts, watching: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    let thread_watching = watching.clone();
    let spawned = std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || {
            let ended = crate::nvidia::watch_xids(&stop, |event| {
                let (Some(address), Some(xid)) = (event.pci_address, event.xid) else {
                    return;
                };
                let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
                *counts.entry(address).or_default().entry(xid).or_default() += 1;
            });
            thread_watching.store(false, Ordering::Relaxed);
            debug!(reason = %ended, "no longer watching NVML XID events");
        });
    if let Err(e) = spawned {
        debug!(error = %e, "cannot start watching NVML XID events");
        watching.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_throttle_reason_is_named_once_and_read_from_its_bit() {
        let active = ThrottleReasons::SW_POWER_CAP | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        let reasons = throttle_reasons(active);
        assert_eq!(reasons.len(), THROTTLE_REASONS.len());
        let on: Vec<&str> = reasons
            .iter()
            .filter(|(_, on)| **on)
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(on, ["hw_thermal_slowdown", "sw_power_cap"]);
        assert!(
            throttle_reasons(ThrottleReasons::empty())
                .values()
                .all(|on| !on)
        );
    }
}
