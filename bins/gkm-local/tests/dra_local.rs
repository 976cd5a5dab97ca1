//! `gkm-local --dra --exit-when-ready`: the chart runs gkm's DRA kubelet
//! plugin on the real node instead of the device plugin, and a pod whose
//! claim template names the cache's DeviceClass runs with the node's
//! (simulated) T4 allocated to its claim.

use std::process::Command;

use gkm_local::dra::{DRIVER, T4_DEVICE, cache_class};

#[test]
fn a_pod_claims_the_real_nodes_gpu_through_the_caches_device_class() -> anyhow::Result<()> {
    let dir = gkm_testenv::temp_dir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_gkm-local"))
        .arg("--dir")
        .arg(dir.path().join("local"))
        .args(["--dra", "--exit-when-ready"])
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "gkm-local --dra failed:\n{stdout}\n{stderr}"
    );

    // The chart's DRA components, each one pod, Running on the real node;
    // no device plugin.
    let pods: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("$ kubectl get pods -n gkm-system"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    for component in gkm_local::chart::DRA_COMPONENTS {
        let line = pods
            .iter()
            .find(|l| l.starts_with(&format!("{component}-")))
            .unwrap_or_else(|| panic!("no {component} pod in:\n{stdout}"));
        assert!(
            line.contains(" Running ") && line.contains(" real-sm75 "),
            "{line}"
        );
    }
    assert_eq!(pods.len(), 4, "{pods:?}");

    // The claim of the cache's class got the real node's T4 (the pod ran:
    // gkm-local waits for it to run before it reads the claim).
    let class = cache_class("default", "vector-add");
    let allocated =
        format!("(class {class}) allocated driver={DRIVER} pool=real-sm75 device={T4_DEVICE}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("claim default/vector-add-gpu-") && l.ends_with(&allocated)),
        "no claim allocated {allocated} in:\n{stdout}"
    );
    Ok(())
}
