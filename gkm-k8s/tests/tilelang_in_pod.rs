//! Real TileLang inside a pod on a real node, against a `csi.gkm.io` cache
//! volume holding the real TileLang cache of `fixtures/tilelang`
//! (`triton_pod_support::tilelang`: TileLang 0.1.15, GEMM kernels compiled
//! without a GPU for sm_90a and sm_80). The pod runs as uid 1000 (fsGroup
//! 1000), mounts its writable cache volume at a path other than the one
//! the cache was compiled at, sets `TILELANG_CACHE_DIR` there and compiles
//! three kernels for sm_90a (`hack/fixtures/tilelang_kernels.py`):
//!
//! - the two the cache holds: TileLang finds them, compiling nothing;
//! - one it never saw: the miss among the hits, compiled into the pod's
//!   own view only, and counted by the driver as TileLang's entries (its
//!   kernel and its device binary).
//!
//! Once the pod ends no upper is left and the store's tree is byte for byte
//! the verified one. On a read-only view of the same cache, TileLang hits
//! every delivered kernel, and a kernel it lacks fails the pod. The node,
//! driver and store are `triton_pod_support`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
// Shared with the Triton tests, which use the rest of it.
#[allow(dead_code)]
mod triton_pod_support;

use std::path::Path;

use gkm_testenv::{pod_log, tree_files, wait_for_pod};
use kube::api::PostParams;
use triton_pod_support::tilelang::{report, tilelang_node, tilelang_pod};
use triton_pod_support::{
    TIMEOUT, check_view_left_nothing, delete_all, ended, exit_code, phase, pods_api, usage_record,
};

/// Where the pod mounts the cache: not where it was compiled
/// (`/tmp/gkm-tilelang-fixtures/cache`).
const MOUNT: &str = "/home/workload/.tilelang/cache";

#[tokio::test(flavor = "multi_thread")]
async fn real_tilelang_in_a_non_root_pod_hits_the_delivered_kernels_at_another_path_and_compiles_the_one_it_lacks()
-> anyhow::Result<()> {
    let (n, cache) = tilelang_node().await;
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    let kernels = ["gemm_64x64", "gemm_128x128", "gemm_64x128"];
    let pod = tilelang_pod(
        n,
        "tilelang-rw",
        Path::new(MOUNT),
        false,
        "sm_90a",
        &kernels,
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "tilelang-rw", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "tilelang-rw", "tilelang").await?;
    assert_eq!(phase(&done), Some("Succeeded"), "{log}");
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let found = report(&log)?;
    println!("TileLang in tilelang-rw: {found}");
    assert_eq!(found["kernels"]["gemm_64x64"], "hit", "{found:#}");
    assert_eq!(found["kernels"]["gemm_128x128"], "hit", "{found:#}");
    assert_eq!(found["kernels"]["gemm_64x128"], "miss", "{found:#}");

    // What the pod wrote went to its own upper, gone with it; the store's
    // tree is the verified one.
    check_view_left_nothing(n, &pods, &done, "tilelang-cache", &cache.entry, &verified).await?;

    // The driver counted the miss as TileLang files it: a kernel directory
    // and a device binary directory, each one entry.
    let counted = usage_record(n, "tilelang-rw")?;
    assert_eq!(counted.kind, "tilelang");
    assert_eq!(counted.usage.new_entries, 2, "{counted:#?}");
    Ok(())
}

/// The variant a user writes for a cache they only mean to read: a
/// read-only view. TileLang serves every delivered kernel from it; a
/// kernel it lacks fails the pod, naming the read-only file system, since
/// TileLang cannot save it (and a read-only view counts no miss).
#[tokio::test(flavor = "multi_thread")]
async fn real_tilelang_on_a_read_only_view_hits_the_delivered_kernels_and_fails_on_a_miss()
-> anyhow::Result<()> {
    let (n, _) = tilelang_node().await;
    let pods = pods_api().await?;
    let cached = ["gemm_64x64", "gemm_128x128"];
    let pod = tilelang_pod(n, "tilelang-ro", Path::new(MOUNT), true, "sm_90a", &cached)?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "tilelang-ro", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "tilelang-ro", "tilelang").await?;
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let found = report(&log)?;
    for kernel in cached {
        assert_eq!(found["kernels"][kernel], "hit", "{found:#}");
    }

    let missing = ["gemm_64x64", "gemm_64x128"];
    let pod = tilelang_pod(
        n,
        "tilelang-ro-miss",
        Path::new(MOUNT),
        true,
        "sm_90a",
        &missing,
    )?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "tilelang-ro-miss", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "tilelang-ro-miss", "tilelang").await?;
    assert_ne!(exit_code(&done), Some(0), "{log}");
    assert!(log.contains("Read-only file system"), "{log}");
    delete_all(&pods, &["tilelang-ro", "tilelang-ro-miss"]).await?;
    Ok(())
}
