//! Real vLLM reuses its own compile cache: the engine of
//! `hack/vllm/engine_start.py` (vLLM 0.32 on the CPU, installed by
//! `hack/ci/components.sh vllm`) starts twice on the tiny Llama model of
//! `hack/fixtures/vllm-models/llama` (a hand-written `config.json`, seeded
//! dummy weights) with one `VLLM_CACHE_ROOT`. The first start compiles the
//! model (an AOTAutograd cache miss, Inductor C++ kernels built) and writes
//! `torch_compile_cache/torch_aot_compile/<hash>/` under the root; the
//! second one reuses it: Inductor builds no C++ kernel again, and both
//! generate the same tokens.
//!
//! vLLM 0.32 on the CPU does not load its own saved AOT compiled model
//! (`'function' object has no attribute 'finalize_loading'`): the second
//! start traces the model again, and AOTAutograd's key differs from the
//! first process's (a miss again), but every C++ kernel Inductor generates
//! is found in the root's `inductor_cache/` by its source's hash. The test
//! asserts that reuse, which is what makes the second start faster.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gkm_testenv::{Component, find_binary, repo_root};
use serde_json::Value;

/// `vllm-python`, or a failure naming the command that installs it.
fn vllm_python() -> PathBuf {
    find_binary(Component::Vllm).unwrap_or_else(|e| panic!("{e:#}"))
}

/// One engine start on `model` with `cache_root`: the script's JSON report.
fn engine_start(model: &Path, cache_root: &Path, scratch: &Path) -> Value {
    let script = repo_root().join("hack/vllm/engine_start.py");
    let out = Command::new(vllm_python())
        .arg(&script)
        .arg("--model")
        .arg(model)
        .arg("--cache-root")
        .arg(cache_root)
        // Nothing of the user's caches reaches the engine.
        .env("HOME", scratch)
        .env("TMPDIR", scratch)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("TORCHINDUCTOR_CACHE_DIR")
        .env_remove("TRITON_CACHE_DIR")
        .output()
        .expect("run vllm-python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "engine_start.py failed ({}):\n{stdout}\n{}",
        out.status,
        tail(&stderr, 60)
    );
    let line = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("engine_start.py printed no JSON ({e}): {line}"));
    println!(
        "engine start on {}: init engine {} s, wall {} s, aot_autograd {}, C++ kernels built {}",
        cache_root.display(),
        report["init_engine_s"],
        report["engine_wall_s"],
        report["counters"]["aot_autograd"],
        report["cpp_kernels_built"],
    );
    report
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// An AOTAutograd counter of a report (0 when absent).
fn autograd(report: &Value, counter: &str) -> u64 {
    report["counters"]["aot_autograd"][counter]
        .as_u64()
        .unwrap_or(0)
}

#[test]
fn a_second_vllm_engine_start_on_the_same_cache_root_compiles_nothing_and_generates_the_same_tokens()
 {
    let work = tempfile::tempdir().expect("tempdir");
    let root = work.path().join("vllm-cache");
    let scratch = work.path().join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let model = repo_root().join("hack/fixtures/vllm-models/llama");

    let cold = engine_start(&model, &root, &scratch);
    assert!(
        autograd(&cold, "autograd_cache_miss") >= 1 && autograd(&cold, "autograd_cache_hit") == 0,
        "the first start on an empty root should compile: {}",
        cold["counters"]
    );
    assert!(
        cold["cpp_kernels_built"].as_u64().unwrap_or(0) >= 1,
        "the first start built no C++ kernel: {cold}"
    );
    let aot = root.join("torch_compile_cache/torch_aot_compile");
    let entries: Vec<_> = std::fs::read_dir(&aot)
        .unwrap_or_else(|e| panic!("no {} after the first start: {e}", aot.display()))
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "one compiled model under {}",
        aot.display()
    );

    let warm = engine_start(&model, &root, &scratch);
    assert_eq!(
        warm["cpp_kernels_built"], 0,
        "the second start built C++ kernels again: {}",
        warm["cpp_builds"]
    );
    assert_eq!(
        warm["output_token_ids"], cold["output_token_ids"],
        "the second start generated other tokens"
    );
}
