//! `gkm explain` as a user runs it, on caches real Triton 3.6
//! (`hack/ci/components.sh triton`) compiles for an H100 without a GPU: a
//! cache compiled with `num_warps=4` is pushed to a real registry; the
//! workload compiles the same kernels with `num_warps=8`, one kernel with
//! the cache's options, and one kernel the cache never had. Every miss
//! names its kernel and `num_warps` 8 against 4; the kernel compiled alike
//! is no miss; the new kernel is to be captured. Real `torch.compile` of the
//! fixture's model for a new input shape: the graph it compiled is
//! explained by that shape.

// A test panics with what went wrong: its helpers unwrap as its body does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use gkm_testenv::{Component, Registry, find_binary};
use serde_json::Value;

mod support;

use support::{gkm_in as gkm, text};

/// The kernels: `add_kernel` and `scale_kernel` compiled with the
/// `num_warps` given, `copy_kernel` always with 4, and `mul_kernel` only
/// when asked. Usage: `SCRIPT CACHE_DIR NUM_WARPS [new]`.
const KERNELS: &str = r#"
import os, sys
os.environ["TRITON_CACHE_DIR"] = os.path.abspath(sys.argv[1])
warps = int(sys.argv[2])
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


@triton.jit
def mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * tl.load(y_ptr + offs, mask=m), mask=m)


two = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
three = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
compiles = [(add_kernel, three, warps), (scale_kernel, two, warps), (copy_kernel, two, 4)]
if sys.argv[3:] == ["new"]:
    compiles.append((mul_kernel, three, 4))
for fn, signature, num_warps in compiles:
    source = ASTSource(fn=fn, signature=signature, constexprs={"BLOCK": 1024})
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
"#;

/// Compiles the kernels into `cache` with real Triton.
fn compile(script: &Path, cache: &Path, num_warps: u32, new: bool) {
    let python = find_binary(Component::Triton).unwrap_or_else(|e| panic!("{e:#}"));
    let mut command = Command::new(python);
    command
        .arg(script)
        .arg(cache)
        .arg(num_warps.to_string())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", cache.parent().unwrap());
    if new {
        command.arg("new");
    }
    let out = command.output().expect("run triton-python");
    assert!(
        out.status.success(),
        "compiling the kernels: {}",
        text(&out)
    );
}

#[test]
fn every_miss_of_a_cache_built_with_other_options_names_the_difference() {
    let registry = Registry::shared().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let script = dir.join("kernels.py");
    std::fs::write(&script, KERNELS).expect("write the kernels");
    let (cached, workload) = (dir.join("cached"), dir.join("workload"));
    compile(&script, &cached, 4, false);
    compile(&script, &workload, 8, true);
    let image = format!("{}/explain/h100:warps4", registry.addr());
    let built = gkm(
        &[
            "build",
            &cached.display().to_string(),
            "-t",
            &image,
            "--insecure",
        ],
        dir,
    );
    assert!(built.status.success(), "gkm build: {}", text(&built));

    let tree = workload.display().to_string();
    let out = gkm(&["explain", &tree, &image, "--insecure", "--json"], dir);
    assert_eq!(out.status.code(), Some(5), "misses exit 5: {}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["entries"], 4, "{doc:#}");
    assert_eq!(doc["delivered"], 1, "copy_kernel is delivered: {doc:#}");
    let misses = doc["misses"].as_array().expect("misses");
    let mut kernels: Vec<&str> = misses
        .iter()
        .map(|m| m["kernel"].as_str().unwrap())
        .collect();
    kernels.sort();
    assert_eq!(
        kernels,
        ["add_kernel", "mul_kernel", "scale_kernel"],
        "{doc:#}"
    );
    for miss in misses {
        let kernel = miss["kernel"].as_str().unwrap();
        let advice = miss["advice"].as_str().unwrap();
        if kernel == "mul_kernel" {
            assert_eq!(miss["nearest"], Value::Null, "{miss:#}");
            assert_eq!(
                advice, "no cached entry of kernel mul_kernel: capture this workload",
                "{miss:#}"
            );
            continue;
        }
        let differences = miss["nearest"]["differences"]
            .as_array()
            .expect("differences");
        let fields: Vec<&str> = differences
            .iter()
            .map(|d| d["field"].as_str().unwrap())
            .collect();
        assert_eq!(fields, ["num_warps"], "only num_warps differs: {miss:#}");
        assert_eq!(differences[0]["workload"], 8, "{miss:#}");
        assert_eq!(differences[0]["delivered"], 4, "{miss:#}");
        assert!(
            advice.contains(kernel) && advice.contains("num_warps=8 (cached 4)"),
            "{advice}"
        );
    }

    // A local directory serves as the cache too; the text names each miss.
    let out = gkm(&["explain", &tree, &cached.display().to_string()], dir);
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("4 entries, 1 delivered"), "{shown}");
    assert!(
        shown.contains("num_warps: 8 here, 4 in the cache"),
        "{shown}"
    );

    // The cache against itself: nothing missed, exit 0.
    let out = gkm(
        &[
            "explain",
            &cached.display().to_string(),
            &image,
            "--insecure",
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_tree_that_is_not_a_cache_is_refused_naming_it() {
    let work = tempfile::tempdir().expect("tempdir");
    let dir = work.path();
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    std::fs::write(empty.join("notes.txt"), b"not a kernel").expect("write");
    let out = gkm(
        &[
            "explain",
            &empty.display().to_string(),
            &empty.display().to_string(),
        ],
        dir,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not a kernel cache") && stderr.contains("empty"),
        "{stderr}"
    );
}

/// Real `torch.compile` (`hack/ci/components.sh torch`) of the fixture's
/// model for an input shape the fixture never saw, into a copy of the
/// fixture: the graph it compiled is the miss whose shape `gkm explain`
/// names, against the fixture's graph of the same kernels.
#[test]
fn a_graph_compiled_for_another_input_shape_is_explained_by_that_shape() {
    let fixture = gkm_testenv::torch::fixture().unwrap_or_else(|e| panic!("{e:#}"));
    let work = tempfile::tempdir().expect("tempdir");
    let workload = work.path().join("inductor");
    gkm_testenv::copy_tree(&fixture.inductor, &workload).expect("copy the fixture");
    let report = gkm_testenv::torch::torch_check(gkm_testenv::torch::Check {
        cache: &workload,
        mega_cache: None,
        new_shape: true,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(
        report.fxgraph_cache_miss, 1,
        "one new shape, one miss: {report:?}"
    );

    let cached = fixture.inductor.display().to_string();
    let tree = workload.display().to_string();
    let out = gkm(&["explain", &tree, &cached, "--json"], work.path());
    assert_eq!(out.status.code(), Some(5), "misses exit 5: {}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let misses = doc["misses"].as_array().expect("misses");
    let graph = misses
        .iter()
        .find(|m| {
            m["kernel"]
                .as_str()
                .is_some_and(|k| k.starts_with("graph("))
        })
        .unwrap_or_else(|| panic!("no graph among the misses: {doc:#}"));
    let differences = graph["nearest"]["differences"]
        .as_array()
        .unwrap_or_else(|| panic!("the graph has no nearest cached graph: {graph:#}"));
    let fields: Vec<&str> = differences
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    assert!(
        !fields.is_empty() && fields.iter().all(|f| f.starts_with("shape.")),
        "only input shapes differ: {graph:#}"
    );
    assert!(
        differences.iter().any(|d| d["workload"] == "(3, 64)"),
        "the new shape, 3x64: {graph:#}"
    );
    let advice = graph["advice"].as_str().unwrap();
    eprintln!(
        "{} entries, {} delivered; the new graph: {advice}",
        doc["entries"], doc["delivered"]
    );
    assert!(
        advice.contains("of size (3, 64)") && advice.contains("dynamic shapes"),
        "{advice}"
    );
}
