//! `gkm check` of every real Triton fixture (`fixtures/triton`, one cache
//! per target of the fleet) against every simulated GPU profile: a cache
//! fits exactly the GPUs of its own target, on current drivers and, by
//! CUDA's minor version compatibility, on older drivers of the same CUDA
//! major version, never on an older major.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use gkm_gpu::simulate::PROFILES;
// The fleet: which profiles run each fixture's target. Profiles not named
// there (V100, MI100, Gaudi2) run none of them.
use gkm_testenv::triton::FLEET_PROFILES as FLEET;

fn fixtures() -> PathBuf {
    gkm_testenv::repo_root().join("fixtures/triton")
}

/// The fixture directories, sorted.
fn fixture_dirs() -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(fixtures())
        .expect("fixtures/triton (hack/fixtures/triton.sh writes it)")
        .map(|e| e.expect("fixture entry"))
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

/// One GPU of every profile, in `PROFILES` order, with the driver fields
/// given (none: the profile's own).
fn inventory(dir: &Path, name: &str, driver: &[(&str, &str)]) -> PathBuf {
    let mut text = String::from("gpus:\n");
    for p in PROFILES {
        text.push_str(&format!("  - profile: {}\n", p.name));
        if p.backend == gkm_core::Backend::Cuda {
            for (key, value) in driver {
                text.push_str(&format!("    {key}: \"{value}\"\n"));
            }
        }
    }
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write inventory");
    path
}

/// The profiles whose GPU `gkm check` finds compatible, and its report.
fn compatible_profiles(fixture: &str, gpus: &Path) -> (BTreeSet<&'static str>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gkm"))
        .arg("check")
        .arg(fixtures().join(fixture))
        .arg("--gpus")
        .arg(gpus)
        .arg("--json")
        .output()
        .expect("run gkm check");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "gkm check {fixture}: {e}\n{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let compatible: BTreeSet<&str> = report["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter(|g| g["compatible"] == true)
        .map(|g| PROFILES[g["index"].as_u64().expect("index") as usize].name)
        .collect();
    // Exit code 3 is gkm's "fits none of the GPUs".
    let expected_code = if compatible.is_empty() { 3 } else { 0 };
    assert_eq!(
        out.status.code(),
        Some(expected_code),
        "{fixture}: {stdout}"
    );
    (compatible, stdout)
}

#[test]
fn every_fixture_fits_exactly_the_gpus_of_its_target() {
    let fleet: BTreeMap<&str, BTreeSet<&str>> = FLEET
        .iter()
        .map(|(dir, profiles)| (*dir, profiles.iter().copied().collect()))
        .collect();
    assert_eq!(
        fixture_dirs(),
        fleet.keys().map(|k| k.to_string()).collect::<Vec<_>>(),
        "fixtures/triton holds one cache per target of the fleet"
    );
    let work = tempfile::tempdir().expect("tempdir");
    let default_driver = inventory(work.path(), "r580.yaml", &[]);
    let r570 = inventory(
        work.path(),
        "r570.yaml",
        &[("driverVersion", "570.195.03"), ("toolkitVersion", "12.8")],
    );
    // Older than the toolkit that assembled the cubins (ptxas 12.8 and 12.9):
    // minor version compatibility lets it run them.
    let older_minor = inventory(
        work.path(),
        "r550.yaml",
        &[("driverVersion", "550.163.01"), ("toolkitVersion", "12.4")],
    );
    let older_major = inventory(
        work.path(),
        "r520.yaml",
        &[("driverVersion", "520.61.05"), ("toolkitVersion", "11.8")],
    );
    for (fixture, expected) in &fleet {
        for gpus in [&default_driver, &r570, &older_minor] {
            let (compatible, report) = compatible_profiles(fixture, gpus);
            assert_eq!(
                &compatible,
                expected,
                "{fixture} on {}:\n{report}",
                gpus.display()
            );
        }
        // CUDA 12's PTX ISA on a CUDA 11 driver: refused. AMD GPUs have no
        // CUDA driver and are unaffected.
        let (compatible, report) = compatible_profiles(fixture, &older_major);
        let expected_on_11: BTreeSet<&str> = if fixture.starts_with("cuda-") {
            BTreeSet::new()
        } else {
            expected.clone()
        };
        assert_eq!(
            compatible, expected_on_11,
            "{fixture} on CUDA 11.8:\n{report}"
        );
        if fixture.starts_with("cuda-") {
            assert!(report.contains("ptxNewerThanDriver"), "{report}");
        }
    }
    // Every profile of the fleet is served by exactly one fixture.
    let served: Vec<&str> = fleet.values().flatten().copied().collect();
    let distinct: BTreeSet<&str> = served.iter().copied().collect();
    assert_eq!(served.len(), distinct.len(), "{served:?}");
    for p in PROFILES {
        assert!(
            distinct.contains(p.name) || ["V100", "MI100", "Gaudi2"].contains(&p.name),
            "profile {} has no fixture target",
            p.name
        );
    }
}
