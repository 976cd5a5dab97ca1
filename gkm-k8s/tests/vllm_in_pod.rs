//! Real vLLM inside a pod on a real node, against a `csi.gkm.io` cache
//! volume holding the `VLLM_CACHE_ROOT` another vLLM's cold start wrote
//! (`triton_pod_support::vllm`: vLLM 0.32 on the CPU, the tiny Llama model
//! of `hack/fixtures/vllm-models/llama`, dummy weights). The pod runs as
//! uid 1000 (fsGroup 1000), mounts its writable cache volume at a path
//! other than the one the root was compiled at, sets `VLLM_CACHE_ROOT`
//! there and starts two engines in turn (`hack/vllm/engine_start.py`):
//!
//! - Llama, which the delivered root holds: Inductor builds no C++ kernel
//!   again, and the engine generates the cold start's tokens;
//! - Qwen3, which it never saw: the miss among the hits, compiled into the
//!   pod's own view only.
//!
//! Once the pod ends no upper is left and the store's tree is byte for byte
//! the verified one. The node, driver and store are `triton_pod_support`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../csi/tests/csi_support/mod.rs"]
mod csi_support;
// Shared with the Triton tests, which use the rest of it.
#[allow(dead_code)]
mod triton_pod_support;

use std::path::Path;

use gkm_testenv::{pod_log, tree_files, wait_for_pod};
use kube::api::PostParams;
use triton_pod_support::vllm::{reports, vllm_node, vllm_pod};
use triton_pod_support::{
    TIMEOUT, check_view_left_nothing, ended, exit_code, phase, pods_api, usage_record,
};

/// Where the pod mounts the cache root: not where it was compiled.
const MOUNT: &str = "/home/workload/.cache/vllm";

#[tokio::test(flavor = "multi_thread")]
async fn real_vllm_in_a_non_root_pod_reuses_a_delivered_cache_root_at_another_path_and_compiles_a_new_model_into_its_own_view()
-> anyhow::Result<()> {
    let (n, cache) = vllm_node().await;
    let mount = Path::new(MOUNT);
    assert_ne!(mount, cache.built_at);
    let cold_built = cache.cold["cpp_kernels_built"].as_u64().unwrap_or_default();
    assert!(
        cold_built > 0,
        "the cold start built no C++ kernel: {}",
        cache.cold
    );
    let verified = tree_files(&cache.entry)?;
    let pods = pods_api().await?;

    let pod = vllm_pod(n, "vllm-rw", mount, &["llama", "qwen3"])?;
    pods.create(&PostParams::default(), &pod).await?;
    let done = wait_for_pod(&pods, "vllm-rw", TIMEOUT, ended).await?;
    let log = pod_log(&pods, "vllm-rw", "vllm").await?;
    let tail: String = log
        .lines()
        .rev()
        .take(60)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(phase(&done), Some("Succeeded"), "{tail}");
    assert_eq!(exit_code(&done), Some(0), "{tail}");
    let found = reports(&log);
    assert_eq!(found.len(), 2, "two engine reports: {tail}");
    let (llama, qwen3) = (&found[0], &found[1]);
    for (arch, report) in [("llama", llama), ("qwen3", qwen3)] {
        println!(
            "{arch} in vllm-rw: init engine {}s, engine {}s, {} C++ kernels built (cold on the host: init engine {}s, {cold_built} built)",
            report["init_engine_s"],
            report["engine_wall_s"],
            report["cpp_kernels_built"],
            cache.cold["init_engine_s"],
        );
    }

    // The delivered model: every C++ kernel a hit, the cold start's tokens.
    assert_eq!(
        llama["cpp_kernels_built"], 0,
        "llama rebuilt kernels: {llama}"
    );
    assert_eq!(
        llama["output_token_ids"], cache.cold["output_token_ids"],
        "llama's tokens differ from the cold start's"
    );
    // The new model: its C++ kernels compiled, into the pod's cache path.
    let kernels: Vec<String> = qwen3["cpp_builds"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_str())
        .filter(|t| t.ends_with(".so") && t.contains("inductor_cache"))
        .map(String::from)
        .collect();
    assert!(
        !kernels.is_empty() && kernels.len() as u64 == qwen3["cpp_kernels_built"],
        "qwen3, never cached, compiled no C++ kernel: {qwen3}"
    );
    for kernel in &kernels {
        assert!(
            kernel.starts_with(&format!("{MOUNT}/")),
            "qwen3 built {kernel} outside its cache volume"
        );
    }

    // What the pod wrote went to its own upper, gone with it; the store's
    // tree is the verified one.
    check_view_left_nothing(n, &pods, &done, "vllm-cache", &cache.entry, &verified).await?;

    // The driver counted the misses as the view went: at least Qwen3's C++
    // kernels, each one entry however many files it was built as.
    let counted = usage_record(n, "vllm-rw")?;
    assert_eq!(counted.kind, "vllm");
    assert!(
        counted.usage.new_entries >= kernels.len() as u64,
        "{} new entries for {} C++ kernels built: {counted:#?}",
        counted.usage.new_entries,
        kernels.len()
    );
    Ok(())
}
