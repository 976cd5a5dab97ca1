//! Real TVM-FFI inside a pod on a real node, against a `csi.gkm.io` cache
//! volume holding a real TVM-FFI cache (`triton_pod_support::tvm_ffi`:
//! apache-tvm-ffi 0.1.12 built the C++ module `add_one` and the CUDA module
//! `scale` for sm_90a without a GPU, on this machine, at the start). The pod
//! runs as uid 1000 (fsGroup 1000), mounts its writable cache volume at the
//! path the cache was built at (a TVM-FFI cache is bound to it), sets
//! `TVM_FFI_CACHE_DIR` there and builds three modules
//! (`hack/fixtures/tvm_ffi_modules.py`):
//!
//! - the two the cache holds: ninja finds them up to date, building
//!   nothing (the files' mtimes came through the image and the store);
//! - one it never saw: the miss among the hits, built into the pod's own
//!   view only, and counted by the driver as one TVM-FFI entry.
//!
//! Once the pod ends no upper is left and the store's tree is byte for byte
//! the verified one. A pod that names another path to the driver
//! (`csi.gkm.io/mountPath`), where TVM-FFI would build every module again,
//! is refused its volume with the sentence that says where to mount it. The
//! node, driver and store are `triton_pod_support`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
// Shared with the Triton tests, which use the rest of it.
#[allow(dead_code)]
mod triton_pod_support;

use std::path::Path;

use gkm_testenv::{eventually, pod_events, pod_log, tree_files, wait_for_pod};
use kube::api::PostParams;
use triton_pod_support::tvm_ffi::{CACHED, tvm_ffi_node, tvm_ffi_pod};
use triton_pod_support::{
    TIMEOUT, check_view_left_nothing, delete_all, ended, exit_code, json_report, phase, pods_api,
    usage_record,
};

#[tokio::test(flavor = "multi_thread")]
async fn real_tvm_ffi_in_a_non_root_pod_finds_the_delivered_modules_built_and_builds_the_one_it_lacks()
-> anyhow::Result<()> {
    let (n, cache) = tvm_ffi_node().await;
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    let modules = [CACHED[0], CACHED[1], "triple"];
    let pod = tvm_ffi_pod(n, "tvm-ffi-rw", &cache.built_at, &[], &modules)?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "tvm-ffi-rw", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "tvm-ffi-rw", "tvm-ffi").await?;
    assert_eq!(phase(&done), Some("Succeeded"), "{log}");
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let found = json_report(&log, "modules")?;
    println!("TVM-FFI in tvm-ffi-rw: {found}");
    assert_eq!(found["modules"]["add_one"], "hit", "{found:#}");
    assert_eq!(found["modules"]["scale"], "hit", "{found:#}");
    assert_eq!(found["modules"]["triple"], "miss", "{found:#}");

    // What the pod wrote went to its own upper, gone with it; the store's
    // tree is the verified one.
    check_view_left_nothing(n, &pods, &done, "tvm-ffi-cache", &cache.entry, &verified).await?;

    // The driver counted the miss as the one module directory it is (its
    // lock and ninja's depfiles are scratch).
    let counted = usage_record(n, "tvm-ffi-rw")?;
    assert_eq!(counted.kind, "tvm-ffi");
    assert_eq!(counted.usage.new_entries, 1, "{counted:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_mounting_a_tvm_ffi_cache_elsewhere_is_refused_its_volume_saying_where_it_hits()
-> anyhow::Result<()> {
    let (n, cache) = tvm_ffi_node().await;
    let pods = pods_api().await?;
    let elsewhere = Path::new("/home/workload/.cache/tvm-ffi");
    let at = elsewhere.display().to_string();
    let pod = tvm_ffi_pod(
        n,
        "tvm-ffi-moved",
        elsewhere,
        &[("csi.gkm.io/mountPath", at.as_str())],
        &CACHED,
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    let client = gkm_testenv::ControlPlane::shared().await?.client().await?;
    let built = cache.built_at.display().to_string();
    let wanted = format!("mount it at {built} (TVM_FFI_CACHE_DIR={built})");
    let client = &client;
    let wanted = &wanted;
    let refusal = eventually("the volume is refused", TIMEOUT, || async move {
        let events = pod_events(client, "ml", "tvm-ffi-moved").await?;
        Ok(events.into_iter().find(|e| e.contains(wanted.as_str())))
    })
    .await?;
    println!("tvm-ffi-moved: {refusal}");
    assert!(
        refusal.contains("would be built again at /home/workload/.cache/tvm-ffi"),
        "{refusal}"
    );
    let pod = pods.get("tvm-ffi-moved").await?;
    assert_ne!(phase(&pod), Some("Running"));
    delete_all(&pods, &["tvm-ffi-moved"]).await?;
    Ok(())
}
