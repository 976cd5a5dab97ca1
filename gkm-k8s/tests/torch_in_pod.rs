//! Real `torch.compile` inside a pod on a real node, against a `csi.gkm.io`
//! cache volume holding the fixture's Inductor cache
//! (`fixtures/torch/inductor`, compiled cold on the CPU by PyTorch 2.11):
//! the pod runs as uid 1000 (fsGroup 1000), sets `TORCHINDUCTOR_CACHE_DIR`
//! to its cache volume, mounted at a path other than the one the cache was
//! compiled at, and compiles the fixture's model
//! (`hack/fixtures/torch_model.py check`) for its two input shapes and one
//! the cache never saw, reporting Inductor's own cache counters.
//!
//! On a writable cache volume every delivered FX graph is a hit, the new
//! shape is the one miss, the outputs equal the cold run's, and once the pod
//! ends no upper is left and the store's tree is byte for byte the verified
//! one. On a read-only cache volume `torch.compile` fails even when every
//! graph is in the cache: Inductor takes lock files in the cache directory
//! on a hit too, which is why a volume is writable unless it asks not to be.
//!
//! The node, driver and store are `triton_pod_support`'s, with the
//! Inductor cache published beside the Triton one
//! (`triton_pod_support::torch`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
// Shared with the Triton tests, which use the rest of it.
#[allow(dead_code)]
mod triton_pod_support;

use std::path::Path;

use gkm_testenv::torch::{FIXTURE_COMPILE_PATH, FIXTURE_GRAPHS, parse_report};
use gkm_testenv::{pod_log, tree_files, wait_for_pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use triton_pod_support::torch::{torch_node, torch_pod};
use triton_pod_support::{
    TIMEOUT, check_view_left_nothing, delete_all, ended, exit_code, phase, pods_api, usage_record,
};

/// Where the pods mount the cache: not where it was compiled.
const MOUNT: &str = "/models/torch/inductor";

/// Runs `pod` to its end; the ended pod and its log.
async fn run_to_end(pods: &Api<Pod>, pod: &Pod) -> anyhow::Result<(Pod, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    pods.create(&PostParams::default(), pod).await?;
    let done = wait_for_pod(pods, &name, TIMEOUT, ended).await?;
    let log = pod_log(pods, &name, "torch").await?;
    eprintln!("{name}:\n{log}");
    Ok((done, log))
}

#[tokio::test(flavor = "multi_thread")]
async fn real_torch_compile_in_a_non_root_pod_hits_every_delivered_fx_graph_at_another_path_and_misses_once_for_a_new_shape()
-> anyhow::Result<()> {
    let (n, cache) = torch_node().await;
    let mount = Path::new(MOUNT);
    assert_ne!(mount, Path::new(FIXTURE_COMPILE_PATH));
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    let pod = torch_pod(n, "torch-rw", mount, false, true)?;
    let (done, log) = run_to_end(&pods, &pod).await?;
    assert_eq!(phase(&done), Some("Succeeded"), "{log}");
    assert_eq!(exit_code(&done), Some(0), "{log}");
    let report = parse_report(&log)?;
    println!("torch.compile in torch-rw: {}", report.summary());
    assert_eq!(report.cache, mount, "{report:#?}");
    // Every delivered graph a hit, the new shape the one miss.
    assert_eq!(report.graphs, FIXTURE_GRAPHS + 1, "{report:#?}");
    assert_eq!(report.fxgraph_cache_hit, FIXTURE_GRAPHS, "{report:#?}");
    assert_eq!(report.fxgraph_cache_miss, 1, "{report:#?}");
    assert_eq!(report.autograd_cache_hit, FIXTURE_GRAPHS, "{report:#?}");
    assert!(report.outputs_as_cold_run(), "{report:#?}");

    // What the pod wrote went to its own upper, gone with it; the store's
    // tree is the verified one.
    check_view_left_nothing(n, &pods, &done, "inductor", &cache.entry, &verified).await?;

    // The driver counted the miss as the view went: one new FX graph, the
    // new shape's.
    let counted = usage_record(n, "torch-rw")?;
    assert_eq!(counted.kind, "inductor");
    let graphs: Vec<&str> = counted
        .usage
        .named
        .iter()
        .map(|e| e.key.as_str())
        .filter(|key| key.starts_with("fxgraph/"))
        .collect();
    assert_eq!(graphs.len(), 1, "one new FX graph: {counted:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_inductor_cache_volume_makes_torch_compile_fail_even_when_every_graph_is_cached()
-> anyhow::Result<()> {
    let (n, cache) = torch_node().await;
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    // Only the shapes the cache holds: nothing to compile.
    let pod = torch_pod(n, "torch-ro", Path::new(MOUNT), true, false)?;
    let (done, log) = run_to_end(&pods, &pod).await?;
    assert_eq!(phase(&done), Some("Failed"), "{log}");
    assert_ne!(exit_code(&done), Some(0), "{log}");
    // It failed making its lock directory in the cache, before any graph.
    let refused = format!("Read-only file system: '{MOUNT}/locks'");
    assert!(
        log.contains(&refused),
        "torch.compile did not fail taking its locks in the cache:\n{log}"
    );
    assert!(parse_report(&log).is_err(), "it printed a report:\n{log}");
    delete_all(&pods, &["torch-ro"]).await?;
    assert!(tree_files(&cache.entry)? == verified);
    Ok(())
}
