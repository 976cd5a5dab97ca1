//! The real CuTe DSL cache of `fixtures/cutedsl`'s kernels, compiled on this
//! machine at the start of the test binary (`gkm_testenv::cutedsl`: CuTe
//! DSL 4.8.1, `add` and `mul` for sm_90a, without a GPU) on the same node,
//! deliverable as `ml/cutedsl-kernels`: built into an image and extracted
//! into the node store as the agent does, published once per test binary.
//! And the pod that compiles CuTe DSL kernels against it
//! (`hack/fixtures/cutedsl_kernels.py`), with the DSL's virtualenv and the
//! script at the same paths as on the host: CuTe DSL's key holds both.

// Only the CuTe DSL test uses it; the Triton tests share the module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::cutedsl::{KERNELS_SCRIPT, compile_kernels};
use gkm_testenv::{Component, find_binary, repo_root};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{NS, SCRATCH, TritonNode, node_with, store_tree, workload_pod};
use crate::csi_support::gkmcache;

/// The `GKMCache` the CuTe DSL pods' volumes name.
pub const CUTEDSL_CACHE: &str = "cutedsl-kernels";
/// The kernels the cache holds, compiled for [`ARCH`].
pub const CACHED: [&str; 2] = ["add", "mul"];
/// The architecture they were compiled for (`CUTE_DSL_ARCH`).
pub const ARCH: &str = "sm_90a";
/// The virtualenvs the DSL runs from: its own, at its real path (the path
/// of the library it links is in its key), and the torch one it imports
/// through a `.pth`, at the path that names.
const VIRTUALENV: &str = "cutedsl-4.8.1";
const TORCH: (&str, &str) = ("torch-2.11.0", "/tmp/gkm-torch-2.11.0");

/// The CuTe DSL cache in the node store.
pub struct CuteDslCache {
    /// Its verified tree in the store.
    pub entry: PathBuf,
}

static CACHE: OnceCell<Result<CuteDslCache, String>> = OnceCell::const_new();

/// The node of this test binary with the CuTe DSL cache in its store,
/// published by the first caller (the others wait for it).
pub async fn cutedsl_node() -> (&'static TritonNode, &'static CuteDslCache) {
    node_with(&CACHE, "CuTe DSL", publish).await
}

async fn publish(n: &TritonNode) -> anyhow::Result<CuteDslCache> {
    let work = n.store.with_file_name("cutedsl-layout");
    std::fs::create_dir_all(&work)?;
    let tree = work.join("cache");
    let cold = tokio::task::block_in_place(|| compile_kernels(&tree, ARCH, &CACHED))?;
    for kernel in CACHED {
        anyhow::ensure!(cold["kernels"][kernel] == "miss", "{cold:#}");
    }
    let digest = store_tree(&work, &n.store, &tree).await?;
    DeliveryIndex::new(&n.store).publish(
        &gkmcache(NS, CUTEDSL_CACHE),
        &Delivery::deliverable(digest.clone()),
    )?;
    Ok(CuteDslCache {
        entry: n.store.join("sha256").join(digest.hex()),
    })
}

/// A non-root pod (uid 1000, fsGroup 1000) compiling the CuTe DSL kernels
/// `kernels` for [`ARCH`] with `CUTE_DSL_CACHE_DIR` at its
/// `ml/cutedsl-kernels` cache volume (read-only or not) mounted at `mount`,
/// printing the script's JSON: each kernel's hit or miss.
pub fn cutedsl_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    read_only: bool,
    kernels: &[&str],
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let tools = find_binary(Component::CuteDsl)?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("the tools directory")?;
    let venv = tools.join(VIRTUALENV);
    let script = repo_root().join(KERNELS_SCRIPT);
    let scripts = script.parent().context("the scripts' directory")?;
    let volumes = vec![
        json!({"name": "cutedsl-cache", "csi": {
            "driver": "csi.gkm.io",
            "readOnly": read_only,
            "volumeAttributes": {"csi.gkm.io/GKMCache": CUTEDSL_CACHE},
        }}),
        json!({"name": "scripts", "hostPath": {"path": scripts, "type": "Directory"}}),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "torch", "hostPath": {"path": tools.join(TORCH.0), "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mounts = vec![
        json!({"name": "cutedsl-cache", "mountPath": mount, "readOnly": read_only}),
        json!({"name": "scripts", "mountPath": scripts, "readOnly": true}),
        json!({"name": "venv", "mountPath": venv, "readOnly": true}),
        json!({"name": "torch", "mountPath": TORCH.1, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    let mut command: Vec<Value> = vec![
        venv.join("bin/python").display().to_string().into(),
        script.display().to_string().into(),
        ARCH.into(),
    ];
    command.extend(kernels.iter().map(|k| Value::from(*k)));
    let env = [("CUTE_DSL_CACHE_DIR", mount.as_str())];
    workload_pod(n, name, "cutedsl", command.into(), &env, volumes, mounts)
}
