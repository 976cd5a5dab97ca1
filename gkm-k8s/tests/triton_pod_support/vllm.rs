//! A real vLLM cache root on the same node, deliverable as `ml/vllm-llama`:
//! written by a cold engine start on the host (`hack/vllm/engine_start.py`,
//! vLLM 0.32 on the CPU, `hack/ci/components.sh vllm`) of the tiny Llama
//! model (`hack/fixtures/vllm-models/llama`), built into an image and
//! extracted into the node store as the agent does, published once per
//! test binary. The root is compiled here rather than taken from
//! `hack/fixtures/vllm-roots`, whose C++ kernels fit only the CPU ISA of
//! the machine that wrote them. And the pod that starts real vLLM engines
//! against it.

// Only the vLLM test uses it; the Triton tests share the module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::{Component, find_binary, repo_root};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{NS, SCRATCH, TritonNode, node_with, store_tree, workload_pod};
use crate::csi_support::gkmcache;

/// The `GKMCache` the vLLM pods' volumes name.
pub const VLLM_CACHE: &str = "vllm-llama";
/// Where vLLM's virtualenv is, on the host and in the pod (its wrapper
/// links it there).
pub const VIRTUALENV_LINK: &str = "/tmp/gkm-vllm-0.32.0";

/// The cache root on the node.
pub struct VllmCache {
    /// Its verified tree in the store.
    pub entry: PathBuf,
    /// Where the cold start compiled it.
    pub built_at: PathBuf,
    /// The cold start's report.
    pub cold: Value,
}

static CACHE: OnceCell<Result<VllmCache, String>> = OnceCell::const_new();

/// The model directory of `arch` (`llama`, `qwen3`), at the same path on
/// the host and in the pod.
pub fn model(arch: &str) -> PathBuf {
    repo_root().join("hack/fixtures/vllm-models").join(arch)
}

/// The node of this test binary with the vLLM cache in its store,
/// published by the first caller (the others wait for it).
pub async fn vllm_node() -> (&'static TritonNode, &'static VllmCache) {
    node_with(&CACHE, "vLLM", publish).await
}

async fn publish(n: &TritonNode) -> anyhow::Result<VllmCache> {
    let python = find_binary(Component::Vllm)?;
    let work = n.store.with_file_name("vllm-build");
    let built_at = work.join("vllm-cache-root");
    let scratch = work.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let out = Command::new(&python)
        .arg(repo_root().join("hack/vllm/engine_start.py"))
        .arg("--model")
        .arg(model("llama"))
        .arg("--cache-root")
        .arg(&built_at)
        // The pod's environment, not the test runner's: nothing of the
        // user's caches reaches the engine, and PyTorch keys its caches on
        // variables such as `CI` (functorch's error_on_custom_op_aliasing
        // defaults to it), which the pod does not have.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &scratch)
        .env("TMPDIR", &scratch)
        .env("USER", "workload")
        .output()
        .context("running vllm-python")?;
    anyhow::ensure!(
        out.status.success(),
        "the cold engine start failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let cold = reports(&String::from_utf8_lossy(&out.stdout))
        .pop()
        .context("the cold engine start printed no report")?;
    let digest = store_tree(&work, &n.store, &built_at).await?;
    DeliveryIndex::new(&n.store).publish(
        &gkmcache(NS, VLLM_CACHE),
        &Delivery::deliverable(digest.clone()),
    )?;
    Ok(VllmCache {
        entry: n.store.join("sha256").join(digest.hex()),
        built_at,
        cold,
    })
}

/// The engine reports in `log`, in order: the lines that are
/// `engine_start.py`'s JSON.
pub fn reports(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("output_token_ids").is_some())
        .collect()
}

/// A non-root pod (uid 1000, fsGroup 1000) starting a real vLLM engine of
/// each model of `archs` in turn, each with `VLLM_CACHE_ROOT` at its
/// writable `ml/vllm-llama` cache volume mounted at `mount`, printing each
/// engine's report.
pub fn vllm_pod(n: &TritonNode, name: &str, mount: &Path, archs: &[&str]) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let venv = find_binary(Component::Vllm)?
        .parent()
        .and_then(Path::parent)
        .map(|tools| tools.join("vllm-0.32.0"))
        .context("the tools directory")?;
    let models = repo_root().join("hack/fixtures/vllm-models");
    let scripts = repo_root().join("hack/vllm");
    let volumes = vec![
        json!({"name": "vllm-cache", "csi": {
            "driver": "csi.gkm.io",
            "volumeAttributes": {"csi.gkm.io/GKMCache": VLLM_CACHE},
        }}),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "models", "hostPath": {"path": models, "type": "Directory"}}),
        json!({"name": "scripts", "hostPath": {"path": scripts, "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mounts = vec![
        json!({"name": "vllm-cache", "mountPath": mount}),
        json!({"name": "venv", "mountPath": VIRTUALENV_LINK, "readOnly": true}),
        json!({"name": "models", "mountPath": models, "readOnly": true}),
        json!({"name": "scripts", "mountPath": scripts, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    let starts: Vec<String> = archs
        .iter()
        .map(|arch| {
            format!(
                "{VIRTUALENV_LINK}/bin/python {}/engine_start.py --model {} --cache-root {mount}",
                scripts.display(),
                model(arch).display()
            )
        })
        .collect();
    // Inductor names its default directories after the user (getpass);
    // uid 1000 has no passwd entry here.
    let env = [("USER", "workload")];
    workload_pod(
        n,
        name,
        "vllm",
        json!(["/bin/sh", "-c", starts.join(" && ")]),
        &env,
        volumes,
        mounts,
    )
}
