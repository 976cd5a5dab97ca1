//! Real CuTe DSL inside a pod on a real node, against a `csi.gkm.io` cache
//! volume holding a real CuTe DSL cache (`triton_pod_support::cutedsl`:
//! NVIDIA's CUTLASS Python DSL 4.8.1 compiled `add` and `mul` for sm_90a
//! without a GPU, on this machine, at the start). The pod runs as uid 1000
//! (fsGroup 1000), mounts its cache volume at a path other than the one the
//! cache was compiled at, sets `CUTE_DSL_CACHE_DIR` there and compiles
//! three kernels (`hack/fixtures/cutedsl_kernels.py`; without a GPU each
//! launch then fails for want of a driver, which the script expects):
//!
//! - the two the cache holds: CuTe DSL finds them in its file cache;
//! - one it never saw: the miss among the hits, written into the pod's own
//!   view only, and counted by the driver as one CuTe DSL entry.
//!
//! Once the pod ends no upper is left and the store's tree is byte for byte
//! the verified one. On a read-only view CuTe DSL finds the delivered
//! kernels too, and compiles a kernel it lacks in memory only (it warns
//! that it cannot save it): the pod still succeeds. The node, driver and
//! store are `triton_pod_support`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
// Shared with the Triton tests, which use the rest of it.
#[allow(dead_code)]
mod triton_pod_support;

use std::path::Path;

use gkm_testenv::{pod_log, tree_files, wait_for_pod};
use kube::api::PostParams;
use triton_pod_support::cutedsl::{CACHED, cutedsl_node, cutedsl_pod};
use triton_pod_support::{
    TIMEOUT, check_view_left_nothing, delete_all, ended, exit_code, json_report, phase, pods_api,
    usage_record,
};

/// Where the pods mount the cache: not where it was compiled.
const MOUNT: &str = "/home/workload/.cache/cutlass_python_cache";

#[tokio::test(flavor = "multi_thread")]
async fn real_cutedsl_in_a_non_root_pod_hits_the_delivered_kernels_at_another_path_and_compiles_the_one_it_lacks()
-> anyhow::Result<()> {
    let (n, cache) = cutedsl_node().await;
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    let kernels = [CACHED[0], CACHED[1], "sub"];
    let pod = cutedsl_pod(n, "cutedsl-rw", Path::new(MOUNT), false, &kernels)?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "cutedsl-rw", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "cutedsl-rw", "cutedsl").await?;
    assert_eq!(phase(&done), Some("Succeeded"), "{log}");
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let found = json_report(&log, "kernels")?;
    println!("CuTe DSL in cutedsl-rw: {found}");
    assert_eq!(found["kernels"]["add"], "hit", "{found:#}");
    assert_eq!(found["kernels"]["mul"], "hit", "{found:#}");
    assert_eq!(found["kernels"]["sub"], "miss", "{found:#}");

    check_view_left_nothing(n, &pods, &done, "cutedsl-cache", &cache.entry, &verified).await?;

    // The driver counted the miss as the one compiled function it is.
    let counted = usage_record(n, "cutedsl-rw")?;
    assert_eq!(counted.kind, "cutedsl");
    assert_eq!(counted.usage.new_entries, 1, "{counted:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn real_cutedsl_on_a_read_only_view_hits_the_delivered_kernels_and_compiles_a_miss_in_memory()
-> anyhow::Result<()> {
    let (n, _) = cutedsl_node().await;
    let pods = pods_api().await?;
    let kernels = [CACHED[0], "sub"];
    let pod = cutedsl_pod(n, "cutedsl-ro", Path::new(MOUNT), true, &kernels)?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "cutedsl-ro", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "cutedsl-ro", "cutedsl").await?;
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let found = json_report(&log, "kernels")?;
    println!("CuTe DSL in cutedsl-ro: {found}");
    assert_eq!(found["kernels"]["add"], "hit", "{found:#}");
    assert_eq!(found["kernels"]["sub"], "miss", "{found:#}");
    delete_all(&pods, &["cutedsl-ro"]).await?;
    Ok(())
}
