//! GPU readings: utilization, memory, temperature, power, clocks, errors and
//! throttling, per GPU.
//!
//! Readings come from NVML for NVIDIA GPUs (loaded at run time, like
//! discovery), from the amdgpu driver's sysfs files for AMD GPUs
//! (`gpu_busy_percent`, `mem_info_vram_*`, `hwmon`), and, for a simulated
//! inventory, from a deterministic function of each GPU (see [`simulated`]).
//! A reading a GPU or its driver does not offer is `None`, never zero: a
//! metrics exporter leaves its series out.
//!
//! ```
//! let inventory = gkm_gpu::simulate::parse("gpus: [{profile: H100, count: 2}]", "h.yaml".as_ref())?;
//! let telemetry = gkm_gpu::telemetry::Telemetry::open(&inventory, &Default::default());
//! let readings = telemetry.read();
//! assert_eq!(readings.len(), 2);
//! assert!(readings[0].utilization_ratio.is_some());
//! assert!(telemetry.notes().is_empty());
//! // The same inventory gives the same readings.
//! assert_eq!(readings, telemetry.read());
//! # Ok::<(), gkm_gpu::Error>(())
//! ```

mod nvml;
pub mod simulated;
mod sysfs;

use std::collections::BTreeMap;
use std::path::PathBuf;

use gkm_core::{Gpu, Vendor};

use crate::inventory::{Inventory, NvmlStatus};

/// Where [`Telemetry`] reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryOptions {
    /// The sysfs root (`/sys` on a node) for AMD readings.
    pub sysfs_root: PathBuf,
    /// Whether to load NVML for NVIDIA readings.
    pub nvml: bool,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        TelemetryOptions {
            sysfs_root: PathBuf::from("/sys"),
            nvml: true,
        }
    }
}

/// Where a GPU's readings came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// NVIDIA's NVML.
    Nvml,
    /// The amdgpu driver's sysfs files.
    Sysfs,
    /// A deterministic function of a simulated GPU.
    Simulated,
    /// Nothing: the GPU has no reading source here.
    None,
}

impl Source {
    /// The name used in metrics: `nvml`, `sysfs`, `simulated`, `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Nvml => "nvml",
            Source::Sysfs => "sysfs",
            Source::Simulated => "simulated",
            Source::None => "none",
        }
    }
}

/// One GPU's identity and its readings at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReadings {
    /// The GPU's index in the inventory.
    pub gpu: u32,
    /// Who made it.
    pub vendor: Vendor,
    /// Vendor UUID (`GPU-…`), when known.
    pub uuid: Option<String>,
    /// PCI address, `0000:3b:00.0`, when known.
    pub pci_bus_id: Option<String>,
    /// Marketing name.
    pub model_name: String,
    /// Where the readings came from.
    pub source: Source,
    /// Fraction of the last sample period a kernel ran, 0 to 1.
    pub utilization_ratio: Option<f64>,
    /// Device memory in use.
    pub memory_used_bytes: Option<u64>,
    /// Device memory free.
    pub memory_free_bytes: Option<u64>,
    /// Device memory in all.
    pub memory_total_bytes: Option<u64>,
    /// Core (edge) temperature.
    pub temperature_celsius: Option<f64>,
    /// Power draw.
    pub power_watts: Option<f64>,
    /// Energy used since the driver loaded.
    pub energy_joules: Option<f64>,
    /// SM (NVIDIA) or shader (AMD `sclk`) clock.
    pub sm_clock_hertz: Option<f64>,
    /// Memory clock.
    pub memory_clock_hertz: Option<f64>,
    /// Corrected ECC errors since the driver loaded.
    pub ecc_corrected_errors: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected_errors: Option<u64>,
    /// XID errors seen since readings started, by XID number.
    pub xid_errors: Option<BTreeMap<u64, u64>>,
    /// Whether each reason that can hold the clocks down does now, by
    /// reason (`sw_power_cap`, `hw_slowdown`…); `None` when the driver does
    /// not say.
    pub throttle_reasons: Option<BTreeMap<&'static str, bool>>,
}

impl GpuReadings {
    /// A GPU with no readings yet.
    pub fn identity(gpu: &Gpu, source: Source) -> GpuReadings {
        GpuReadings {
            gpu: gpu.index,
            vendor: gpu.vendor,
            uuid: gpu.uuid.clone(),
            pci_bus_id: gpu.pci_address.clone(),
            model_name: gpu.product.clone(),
            source,
            utilization_ratio: None,
            memory_used_bytes: None,
            memory_free_bytes: None,
            memory_total_bytes: None,
            temperature_celsius: None,
            power_watts: None,
            energy_joules: None,
            sm_clock_hertz: None,
            memory_clock_hertz: None,
            ecc_corrected_errors: None,
            ecc_uncorrected_errors: None,
            xid_errors: None,
            throttle_reasons: None,
        }
    }

    /// Sets free memory from total and used when the driver gives only those.
    fn derive_free(&mut self) {
        if self.memory_free_bytes.is_none()
            && let (Some(total), Some(used)) = (self.memory_total_bytes, self.memory_used_bytes)
        {
            self.memory_free_bytes = Some(total.saturating_sub(used));
        }
    }
}

/// Reads a node's GPUs, from the sources opened once by [`Telemetry::open`].
pub struct Telemetry {
    gpus: Vec<Gpu>,
    simulated: bool,
    sysfs_root: PathBuf,
    nvml: Option<nvml::NvmlReader>,
    notes: Vec<String>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("gpus", &self.gpus.len())
            .field("simulated", &self.simulated)
            .field("nvml", &self.nvml.is_some())
            .field("notes", &self.notes)
            .finish()
    }
}

impl Telemetry {
    /// Opens the reading sources the inventory's GPUs need: NVML when there
    /// are NVIDIA GPUs (and `opts.nvml`), sysfs for AMD GPUs, nothing for a
    /// simulated inventory. A source that cannot be opened leaves its GPUs
    /// without readings and says why in [`Telemetry::notes`].
    pub fn open(inventory: &Inventory, opts: &TelemetryOptions) -> Telemetry {
        let gpus: Vec<Gpu> = inventory.usable_gpus().cloned().collect();
        let mut notes = Vec::new();
        let nvidia = gpus.iter().filter(|g| g.vendor == Vendor::Nvidia).count();
        let nvml = if inventory.simulated || nvidia == 0 {
            None
        } else if !opts.nvml {
            notes.push(format!(
                "NVML is switched off: no readings for {nvidia} NVIDIA GPU(s)"
            ));
            None
        } else {
            match nvml::NvmlReader::open() {
                Ok(reader) => Some(reader),
                Err(status) => {
                    notes.push(format!(
                        "NVML {}: no readings for {nvidia} NVIDIA GPU(s)",
                        describe(&status)
                    ));
                    None
                }
            }
        };
        Telemetry {
            gpus,
            simulated: inventory.simulated,
            sysfs_root: opts.sysfs_root.clone(),
            nvml,
            notes,
        }
    }

    /// Why some readings are missing, one sentence each; empty when every
    /// source opened. Say these once: they do not change until the next
    /// [`Telemetry::open`].
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Reads every GPU now, in inventory order.
    pub fn read(&self) -> Vec<GpuReadings> {
        self.gpus
            .iter()
            .map(|gpu| {
                let mut readings = if self.simulated {
                    simulated::readings(gpu)
                } else {
                    match (gpu.vendor, &self.nvml) {
                        (Vendor::Nvidia, Some(nvml)) => nvml.read(gpu),
                        (Vendor::Amd, _) => sysfs::read(&self.sysfs_root, gpu),
                        _ => GpuReadings::identity(gpu, Source::None),
                    }
                };
                readings.derive_free();
                readings
            })
            .collect()
    }
}

fn describe(status: &NvmlStatus) -> String {
    match status {
        NvmlStatus::NoDriver { reason } => format!("is not available ({reason})"),
        NvmlStatus::Failed { reason } => format!("failed to start ({reason})"),
        NvmlStatus::NotChecked | NvmlStatus::Loaded { .. } => "was not asked".into(),
    }
}
