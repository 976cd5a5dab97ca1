//! Node labels as a table: for each inventory, every label gkm writes, with
//! and without the vendors' names.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use gkm_gpu::labels::{KEYS, LabelOptions, node_labels};

fn labels(inventory: &str, vendor_labels: bool) -> BTreeMap<String, String> {
    let inventory = gkm_gpu::simulate::parse(inventory, "gpus.yaml".as_ref()).unwrap();
    node_labels(&inventory, &LabelOptions { vendor_labels })
}

fn table(rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const H100: &str = "gpus: [{profile: H100, count: 8, driverVersion: 580.105.08}]";

const GKM_H100: &[(&str, &str)] = &[
    ("gkm.io/gpu.arch", "sm_90"),
    ("gkm.io/gpu.backend", "cuda"),
    ("gkm.io/gpu.count", "8"),
    ("gkm.io/gpu.driver.major", "580"),
    ("gkm.io/gpu.driver.minor", "105"),
    ("gkm.io/gpu.memory", "81559"),
    ("gkm.io/gpu.product", "NVIDIA-H100-80GB-HBM3"),
    ("gkm.io/gpu.simulated", "true"),
    ("gkm.io/gpu.toolkit.major", "13"),
    ("gkm.io/gpu.toolkit.minor", "0"),
    ("gkm.io/gpu.vendor", "nvidia"),
    ("gkm.io/gpu.warp-size", "32"),
];

#[test]
fn an_nvidia_node_gets_gkm_labels_and_with_the_flag_gpu_feature_discovery_names() {
    assert_eq!(labels(H100, false), table(GKM_H100));
    let mut expected = table(GKM_H100);
    expected.extend(table(&[
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
        ("nvidia.com/cuda.driver.major", "580"),
        ("nvidia.com/cuda.driver.minor", "105"),
        ("nvidia.com/cuda.driver.rev", "08"),
        ("nvidia.com/cuda.runtime.major", "13"),
        ("nvidia.com/cuda.runtime.minor", "0"),
        ("nvidia.com/cuda.driver-version.full", "580.105.08"),
        ("nvidia.com/cuda.driver-version.major", "580"),
        ("nvidia.com/cuda.driver-version.minor", "105"),
        ("nvidia.com/cuda.driver-version.revision", "08"),
        ("nvidia.com/cuda.runtime-version.full", "13.0"),
        ("nvidia.com/cuda.runtime-version.major", "13"),
        ("nvidia.com/cuda.runtime-version.minor", "0"),
    ]));
    assert_eq!(labels(H100, true), expected);
}

#[test]
fn an_amd_node_gets_the_node_labeller_names() {
    let mi300x = "gpus: [{profile: MI300X, count: 4, driverVersion: 6.8.5, toolkitVersion: '6.2'}]";
    let got = labels(mi300x, true);
    let expected = table(&[
        ("gkm.io/gpu.arch", "gfx942"),
        ("gkm.io/gpu.backend", "hip"),
        ("gkm.io/gpu.count", "4"),
        ("gkm.io/gpu.driver.major", "6"),
        ("gkm.io/gpu.driver.minor", "8"),
        ("gkm.io/gpu.memory", "196592"),
        ("gkm.io/gpu.product", "AMD-Instinct-MI300X"),
        ("gkm.io/gpu.simulated", "true"),
        ("gkm.io/gpu.toolkit.major", "6"),
        ("gkm.io/gpu.toolkit.minor", "2"),
        ("gkm.io/gpu.vendor", "amd"),
        ("gkm.io/gpu.warp-size", "64"),
        ("amd.com/gpu.product-name", "AMD_Instinct_MI300X"),
        ("amd.com/gpu.device-id", "74a1"),
        ("amd.com/gpu.family", "AI"),
        ("amd.com/gpu.vram", "192G"),
        ("amd.com/gpu.driver-version", "6.8.5"),
    ]);
    assert_eq!(got, expected);
}

#[test]
fn a_node_without_gpus_says_so_and_nothing_else() {
    assert_eq!(
        labels("gpus: []", true),
        table(&[("gkm.io/gpu.count", "0"), ("gkm.io/gpu.simulated", "true")])
    );
}

/// Every key the admission policy allows is one some node can get, and
/// every key a node gets is allowed.
#[test]
fn every_listed_key_is_written_for_some_node() {
    let mixed = "gpus:\n  - {profile: H100, count: 2, migMode: disabled}\n  - {profile: MI300X, driverVersion: 6.8.5}\n  - {profile: A100}\n\
                 vfio:\n  - {pciAddress: '0000:c1:00.0', vendor: nvidia, pciId: '10de:2330', product: H100, driver: vfio-pci, groupViable: true}\n\
                 mdevs:\n  - {uuid: 6f1c, parentAddress: '0000:3b:00.0', typeId: nvidia-222}\n";
    let got = labels(mixed, true);
    let written: Vec<&str> = got.keys().map(String::as_str).collect();
    let mut missing: Vec<&str> = KEYS
        .iter()
        .copied()
        .filter(|k| !written.contains(k))
        .collect();
    missing.sort();
    assert!(missing.is_empty(), "never written: {missing:?}");
    for key in written {
        assert!(KEYS.contains(&key), "{key} is not in KEYS");
    }
}
