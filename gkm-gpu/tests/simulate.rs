//! Simulated inventories: the file format `gkm gpus --simulate` and
//! `gkm check --gpus` read.

use std::path::{Path, PathBuf};

use gkm_core::{Backend, Vendor};
use gkm_gpu::labels::{LabelOptions, node_labels};
use gkm_gpu::simulate::{self, PROFILES};
use gkm_gpu::{DiscoveryOptions, Error};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/simulate")
        .join(name)
}

fn parse(yaml: &str) -> Result<gkm_gpu::Inventory, Error> {
    simulate::parse(yaml, Path::new("node.yaml"))
}

#[test]
fn discover_returns_the_simulated_file() {
    let inv = gkm_gpu::discover(&DiscoveryOptions {
        simulate: Some(testdata("mixed.yaml")),
        // Never looked at when simulating.
        sysfs_root: "/nonexistent".into(),
        ..Default::default()
    })
    .unwrap();
    assert!(inv.simulated);
    let described: Vec<String> = inv.gpus.iter().map(|g| g.describe()).collect();
    assert_eq!(
        described,
        [
            "0 NVIDIA H100 80GB HBM3 (cuda/90/32)",
            "1 NVIDIA H100 80GB HBM3 (cuda/90/32)",
            "2 NVIDIA H100 80GB HBM3 (cuda/90/32)",
            "3 NVIDIA H100 80GB HBM3 (cuda/90/32)",
            "4 AMD Instinct MI300X (hip/gfx942/64)",
            "5 NVIDIA A40 (cuda/86/32)",
        ]
    );
    assert_eq!(inv.gpus[4].driver_version.as_deref(), Some("6.8.5"));
    assert_eq!(
        inv.gpus[5].uuid.as_deref(),
        Some("GPU-5e3a0c1d-0000-4000-8000-000000000001")
    );
    insta::assert_yaml_snapshot!(
        "mixed-labels",
        node_labels(
            &inv,
            &LabelOptions {
                vendor_labels: true
            }
        )
    );
}

#[test]
fn json_files_read_too() {
    let inv = simulate::load(&testdata("t4.json")).unwrap();
    assert_eq!(inv.gpus.len(), 2);
    assert!(inv.gpus.iter().all(|g| g.product == "Tesla T4"));
}

#[test]
fn every_profile_gives_labels() {
    for p in PROFILES {
        let inv = parse(&format!("gpus: [{{profile: {}, count: 2}}]", p.name)).unwrap();
        let labels = node_labels(
            &inv,
            &LabelOptions {
                vendor_labels: true,
            },
        );
        assert_eq!(labels["gkm.io/gpu.count"], "2", "{}", p.name);
        assert_eq!(labels["gkm.io/gpu.simulated"], "true", "{}", p.name);
        assert_eq!(
            labels["gkm.io/gpu.backend"],
            p.backend.as_str(),
            "{}",
            p.name
        );
        insta::assert_yaml_snapshot!(format!("profile-{}-labels", p.name), labels);
    }
}

#[test]
fn profile_names_ignore_case_and_punctuation() {
    let inv = parse("gpus:\n  - profile: mi-210\n  - profile: a100_40gb\n  - profile: tesla t4\n")
        .unwrap();
    let vendors: Vec<(Vendor, Option<Backend>)> =
        inv.gpus.iter().map(|g| (g.vendor, g.backend)).collect();
    assert_eq!(
        vendors,
        [
            (Vendor::Amd, Some(Backend::Hip)),
            (Vendor::Nvidia, Some(Backend::Cuda)),
            (Vendor::Nvidia, Some(Backend::Cuda)),
        ]
    );
}

#[test]
fn mistakes_are_named() {
    let cases = [
        (
            "gpus: [{profile: H300}]",
            "GPU entry 0: unknown profile \"H300\"; known profiles: T4,",
        ),
        (
            "gpus: [{profile: T4}, {profile: T4, count: 0}]",
            "GPU entry 1: count 0 is out of range",
        ),
        (
            "gpus: [{profile: T4, count: 100000}]",
            "count 100000 is out of range 1..=1024",
        ),
        (
            "gpus: [{profile: T4, warp_size: 64}]",
            "unknown field `warp_size`",
        ),
        (
            "gpus: [{product: Foo}]",
            "GPU entry 0: give a profile, or at least vendor and product",
        ),
        (
            "gpus: [{profile: T4, arch: ampere}]",
            "invalid value \"ampere\"",
        ),
        (
            "gpus: [{profile: T4, count: 2, uuid: GPU-1}]",
            "uuid and pciAddress name one GPU, but count is 2",
        ),
        ("gpu: []", "missing field `gpus`"),
        (
            "gpus: [{vendor: acme, product: X}]",
            "unknown variant `acme`",
        ),
    ];
    for (yaml, expected) in cases {
        let err = parse(yaml).unwrap_err().to_string();
        assert!(err.contains("node.yaml"), "{yaml}: {err}");
        assert!(err.contains(expected), "{yaml}: {err}");
    }
    let err = simulate::load(&testdata("missing.yaml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot read ") && err.contains("missing.yaml"),
        "{err}"
    );
}

proptest::proptest! {
    /// Whatever the file holds, reading it answers Ok or a named error.
    #[test]
    fn any_text_reads_without_panicking(text in "\\PC{0,200}") {
        let _ = parse(&text);
        let _ = simulate::parse(&text, Path::new("node.json"));
    }

    #[test]
    fn counts_add_up(counts in proptest::collection::vec(1u32..20, 1..6)) {
        let yaml: String = std::iter::once("gpus:\n".to_string())
            .chain(counts.iter().zip(PROFILES.iter().cycle()).map(|(c, p)| format!("  - profile: {}\n    count: {c}\n", p.name)))
            .collect();
        let inv = parse(&yaml).unwrap();
        proptest::prop_assert_eq!(inv.gpus.len() as u32, counts.iter().sum::<u32>());
        for (i, g) in inv.gpus.iter().enumerate() {
            proptest::prop_assert_eq!(g.index as usize, i);
        }
    }
}

#[test]
fn every_simulated_gpu_has_a_uuid_and_a_pci_address_of_its_own() {
    let text: String = std::iter::once("gpus:\n".to_string())
        .chain(
            PROFILES
                .iter()
                .map(|p| format!("  - profile: {}\n    count: 2\n", p.name)),
        )
        .collect();
    let inv = parse(&text).unwrap();
    let uuids: std::collections::BTreeSet<&str> =
        inv.gpus.iter().filter_map(|g| g.uuid.as_deref()).collect();
    let addresses: std::collections::BTreeSet<&str> = inv
        .gpus
        .iter()
        .filter_map(|g| g.pci_address.as_deref())
        .collect();
    assert_eq!(uuids.len(), inv.gpus.len(), "{uuids:?}");
    assert_eq!(addresses.len(), inv.gpus.len(), "{addresses:?}");
    for gpu in &inv.gpus {
        let uuid = gpu.uuid.as_deref().unwrap();
        // NVML's form, which dcgm-exporter's `UUID` label carries.
        assert_eq!(
            uuid.starts_with("GPU-"),
            gpu.vendor == Vendor::Nvidia,
            "{uuid}"
        );
    }
    // The same file reads the same; another file gives other UUIDs.
    assert_eq!(parse(&text).unwrap().gpus, inv.gpus);
    let elsewhere = simulate::parse(&text, Path::new("other-node.yaml")).unwrap();
    assert!(
        elsewhere
            .gpus
            .iter()
            .zip(&inv.gpus)
            .all(|(a, b)| a.uuid != b.uuid)
    );
    // A UUID or address the entry gives is kept.
    let given = parse(
        "gpus:\n  - profile: B200\n    uuid: GPU-given\n    pciAddress: \"0000:18:00.0\"\n  - profile: B200\n",
    )
    .unwrap();
    assert_eq!(given.gpus[0].uuid.as_deref(), Some("GPU-given"));
    assert_eq!(given.gpus[0].pci_address.as_deref(), Some("0000:18:00.0"));
    assert_eq!(given.gpus[1].pci_address.as_deref(), Some("0000:19:00.0"));
}

#[test]
fn profiles_of_2026_report_a_current_driver() {
    for name in ["B200", "B300", "GB200", "RTX-PRO-6000", "H200", "T4"] {
        let gpu = simulate::Profile::find(name).unwrap().gpu();
        assert_eq!(gpu.driver_version.as_deref(), Some("580.95.05"), "{name}");
        assert_eq!(gpu.toolkit_version.as_deref(), Some("13.0"), "{name}");
    }
    let b300 = simulate::Profile::find("b300").unwrap().gpu();
    assert_eq!(b300.describe(), "0 NVIDIA B300 SXM6 AC (cuda/103/32)");
    let mi355x = simulate::Profile::find("MI355X").unwrap().gpu();
    assert_eq!(mi355x.describe(), "0 AMD Instinct MI355X (hip/gfx950/64)");
}
