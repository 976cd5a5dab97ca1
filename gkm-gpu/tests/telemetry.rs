//! GPU readings: from amdgpu's sysfs files in a captured tree, without NVML,
//! and for simulated inventories.

use std::path::{Path, PathBuf};

use gkm_gpu::telemetry::{Source, Telemetry, TelemetryOptions};
use gkm_gpu::{DiscoveryOptions, PciIdsSource};

fn tree(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/sysfs")
        .join(name)
}

/// The readings of a captured tree's GPUs (discovered without NVML), with
/// NVML asked for readings when `nvml`.
fn telemetry(name: &str, nvml: bool) -> Telemetry {
    let root = tree(name);
    let inventory = gkm_gpu::discover(&DiscoveryOptions {
        sysfs_root: root.clone(),
        nvml: false,
        simulate: None,
        pci_ids: PciIdsSource::Bundled,
    })
    .unwrap_or_else(|e| panic!("discovery on {name} failed: {e}"));
    Telemetry::open(
        &inventory,
        &TelemetryOptions {
            sysfs_root: root,
            nvml,
        },
    )
}

#[test]
fn amd_readings_come_from_the_driver_files() {
    let telemetry = telemetry("amd-mi210", true);
    assert!(telemetry.notes().is_empty(), "{:?}", telemetry.notes());
    let readings = telemetry.read();
    assert_eq!(readings.len(), 1);
    let r = &readings[0];
    assert_eq!(r.source, Source::Sysfs);
    assert_eq!(r.pci_bus_id.as_deref(), Some("0000:83:00.0"));
    assert_eq!(r.utilization_ratio, Some(0.23));
    assert_eq!(r.memory_used_bytes, Some(8 << 30));
    assert_eq!(r.memory_total_bytes, Some(68702699520));
    assert_eq!(r.memory_free_bytes, Some(68702699520 - (8 << 30)));
    assert_eq!(r.temperature_celsius, Some(52.0));
    assert_eq!(r.power_watts, Some(142.0));
    assert_eq!(r.sm_clock_hertz, Some(1.7e9));
    assert_eq!(r.memory_clock_hertz, Some(1.6e9));
    assert_eq!(r.ecc_corrected_errors, Some(2));
    assert_eq!(r.ecc_uncorrected_errors, Some(0));
    // amdgpu has no energy counter file here, no XID or throttle readings.
    assert_eq!(r.energy_joules, None);
    assert_eq!(r.xid_errors, None);
    assert_eq!(r.throttle_reasons, None);
}

#[test]
fn nvidia_gpus_without_nvml_have_no_readings_and_a_reason() {
    let telemetry = telemetry("nvidia-h100", false);
    assert_eq!(
        telemetry.notes(),
        ["NVML is switched off: no readings for 2 NVIDIA GPU(s)"]
    );
    for r in telemetry.read() {
        assert_eq!(r.source, Source::None);
        assert_eq!(r.utilization_ratio, None);
        assert_eq!(r.memory_used_bytes, None);
        assert_eq!(r.temperature_celsius, None);
        assert!(r.pci_bus_id.is_some(), "the GPU is still named");
    }
}

#[test]
fn without_an_nvidia_library_the_reason_names_nvml() {
    let telemetry = telemetry("nvidia-h100", true);
    if gkm_gpu::nvidia::open().is_ok() {
        eprintln!(
            "skipped: this machine has NVML, so the GPUs of the captured tree are looked up in it"
        );
        return;
    }
    let [note] = telemetry.notes() else {
        panic!("expected one note, got {:?}", telemetry.notes());
    };
    assert!(
        note.starts_with("NVML is not available (")
            && note.ends_with("no readings for 2 NVIDIA GPU(s)"),
        "{note}"
    );
}

#[test]
fn simulated_readings_are_deterministic_and_leave_out_what_the_gpu_lacks() {
    let text = "gpus:\n  - profile: H100\n    count: 2\n  - profile: MI300X\n  - profile: Gaudi2\n";
    let inventory = gkm_gpu::simulate::parse(text, "mixed.yaml".as_ref()).unwrap();
    let telemetry = Telemetry::open(&inventory, &TelemetryOptions::default());
    assert!(telemetry.notes().is_empty());
    let first = telemetry.read();
    let again =
        gkm_gpu::telemetry::Telemetry::open(&inventory, &TelemetryOptions::default()).read();
    assert_eq!(first, again);
    let sources: Vec<Source> = first.iter().map(|r| r.source).collect();
    assert_eq!(sources, [Source::Simulated; 4]);

    let h100 = &first[0];
    assert!(h100.utilization_ratio.is_some());
    assert!(h100.throttle_reasons.is_some());
    assert_eq!(h100.memory_total_bytes, Some(81559 << 20));
    assert_eq!(
        h100.memory_used_bytes
            .zip(h100.memory_free_bytes)
            .map(|(u, f)| u + f),
        h100.memory_total_bytes
    );
    let mi300x = &first[2];
    assert!(mi300x.temperature_celsius.is_some());
    assert_eq!(mi300x.throttle_reasons, None);
    assert_eq!(mi300x.xid_errors, None);
    let gaudi = &first[3];
    assert_eq!(gaudi.memory_total_bytes, Some(96 << 30));
    assert_eq!(gaudi.utilization_ratio, None);
    assert_eq!(gaudi.temperature_celsius, None);
    assert_eq!(gaudi.power_watts, None);
}
