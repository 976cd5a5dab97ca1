//! Readings for simulated GPUs: a deterministic function of each GPU's
//! index, product and memory, so that tests and local clusters see the same
//! real-looking values every time.
//!
//! Each GPU gets a utilization between 0 and 1 from a hash of its index and
//! product; memory in use, power and the shader clock follow it. NVIDIA GPUs
//! report everything NVML would (no throttling but `gpu_idle` on an idle GPU,
//! no ECC or XID errors); AMD GPUs what the amdgpu driver's sysfs files give
//! (no energy, XID or throttle readings); other GPUs only their memory size.
//!
//! ```
//! let inventory = gkm_gpu::simulate::parse("gpus: [{profile: MI300X}, {profile: Gaudi2}]", "s.yaml".as_ref())?;
//! let amd = gkm_gpu::telemetry::simulated::readings(&inventory.gpus[0]);
//! assert!(amd.temperature_celsius.is_some());
//! assert_eq!(amd.throttle_reasons, None);
//! let gaudi = gkm_gpu::telemetry::simulated::readings(&inventory.gpus[1]);
//! assert_eq!(gaudi.utilization_ratio, None);
//! assert_eq!(gaudi.memory_total_bytes, Some(96 << 30));
//! # Ok::<(), gkm_gpu::Error>(())
//! ```

use std::collections::BTreeMap;

use gkm_core::{Gpu, Vendor};

use super::{GpuReadings, Source};

const MIB: u64 = 1 << 20;

/// The readings of simulated GPU `gpu`.
pub fn readings(gpu: &Gpu) -> GpuReadings {
    let mut r = GpuReadings::identity(gpu, Source::Simulated);
    r.memory_total_bytes = gpu.memory_bytes;
    let (idle_watts, max_watts, memory_mhz) = match gpu.vendor {
        Vendor::Nvidia => (70.0, 700.0, 2619.0),
        Vendor::Amd => (100.0, 750.0, 1300.0),
        _ => return r,
    };
    let seed = fnv1a(&[&gpu.index.to_le_bytes(), gpu.product.as_bytes()]);
    let percent = seed % 101;
    let utilization = percent as f64 / 100.0;
    r.utilization_ratio = Some(utilization);
    if let Some(total) = gpu.memory_bytes {
        // Whole MiB, as drivers count.
        let used = (total / MIB) * percent / 100 * 9 / 10 * MIB;
        r.memory_used_bytes = Some(used);
    }
    let temperature = 30.0 + ((seed >> 8) % 10) as f64 + 40.0 * utilization;
    r.temperature_celsius = Some((temperature * 10.0).round() / 10.0);
    r.power_watts = Some((idle_watts + (max_watts - idle_watts) * utilization).round());
    r.sm_clock_hertz = Some((345.0 + 1635.0 * utilization).round() * 1e6);
    r.memory_clock_hertz = Some(memory_mhz * 1e6);
    r.ecc_corrected_errors = Some(0);
    r.ecc_uncorrected_errors = Some(0);
    if gpu.vendor == Vendor::Nvidia {
        r.energy_joules = Some((1_000_000 + (seed >> 16) % 1_000_000) as f64);
        r.xid_errors = Some(BTreeMap::new());
        r.throttle_reasons = Some(
            [
                ("gpu_idle", percent == 0),
                ("sw_power_cap", false),
                ("hw_slowdown", false),
                ("sw_thermal_slowdown", false),
                ("hw_thermal_slowdown", false),
            ]
            .into_iter()
            .collect(),
        );
    }
    r
}

/// FNV-1a over the parts: stable across platforms and Rust versions.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::PROFILES;

    #[test]
    fn readings_are_within_what_a_driver_reports() {
        for profile in PROFILES {
            for index in 0..8 {
                let gpu = Gpu {
                    index,
                    ..profile.gpu()
                };
                let r = readings(&gpu);
                assert_eq!(r, readings(&gpu), "deterministic");
                if let Some(u) = r.utilization_ratio {
                    assert!((0.0..=1.0).contains(&u), "{}: {u}", profile.name);
                }
                if let (Some(used), Some(total)) = (r.memory_used_bytes, r.memory_total_bytes) {
                    assert!(used <= total, "{}", profile.name);
                }
                if let Some(t) = r.temperature_celsius {
                    assert!((30.0..=80.0).contains(&t), "{}: {t}", profile.name);
                }
            }
        }
    }

    #[test]
    fn gpus_of_one_node_differ() {
        let h100 = crate::simulate::Profile::find("H100").unwrap();
        let utilizations: std::collections::BTreeSet<u64> = (0..8)
            .map(|index| {
                let r = readings(&Gpu {
                    index,
                    ..h100.gpu()
                });
                (r.utilization_ratio.unwrap() * 100.0) as u64
            })
            .collect();
        assert!(utilizations.len() > 4, "{utilizations:?}");
    }
}
