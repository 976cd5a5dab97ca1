//! A real TVM-FFI cache built on this machine at the start of the test
//! binary (`gkm_testenv::tvm_ffi`: apache-tvm-ffi 0.1.12, the C++ module
//! `add_one` and the CUDA module `scale` for sm_90a, built without a GPU) on
//! the same node, deliverable as `ml/tvm-ffi-modules`: built into an image
//! and extracted into the node store as the agent does, published once per
//! test binary. And the pod that builds TVM-FFI modules against it
//! (`hack/fixtures/tvm_ffi_modules.py`, from the host's virtualenv mounted
//! at its own path: a module's `build.ninja` names that install).

// Only the TVM-FFI test uses it; the Triton tests share the module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::repo_root;
use gkm_testenv::tvm_ffi::{CXX, MODULES_SCRIPT, build_modules, cuda_home, virtualenv};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{NS, SCRATCH, TritonNode, node_with, store_tree, workload_pod};
use crate::csi_support::gkmcache;

/// The `GKMCache` the TVM-FFI pods' volumes name.
pub const TVM_FFI_CACHE: &str = "tvm-ffi-modules";
/// The modules the cache holds, and the architectures its CUDA ones were
/// built for (`TVM_FFI_CUDA_ARCH_LIST`).
pub const CACHED: [&str; 2] = ["add_one", "scale"];
pub const CUDA_ARCHS: &str = "9.0a";
/// Where the pod sees the modules' script.
const SCRIPTS: &str = "/scripts";

/// The TVM-FFI cache in the node store.
pub struct TvmFfiCache {
    /// Its verified tree in the store.
    pub entry: PathBuf,
    /// Where it was built: where a pod must mount it to find its modules.
    pub built_at: PathBuf,
}

static CACHE: OnceCell<Result<TvmFfiCache, String>> = OnceCell::const_new();

/// The node of this test binary with the TVM-FFI cache in its store,
/// published by the first caller (the others wait for it).
pub async fn tvm_ffi_node() -> (&'static TritonNode, &'static TvmFfiCache) {
    node_with(&CACHE, "TVM-FFI", publish).await
}

async fn publish(n: &TritonNode) -> anyhow::Result<TvmFfiCache> {
    let work = n.store.with_file_name("tvm-ffi-layout");
    std::fs::create_dir_all(&work)?;
    let built_at = work.join("cache");
    let cold = tokio::task::block_in_place(|| build_modules(&built_at, CUDA_ARCHS, &CACHED))?;
    for module in CACHED {
        anyhow::ensure!(cold["modules"][module] == "miss", "{cold:#}");
    }
    let digest = store_tree(&work, &n.store, &built_at).await?;
    DeliveryIndex::new(&n.store).publish(
        &gkmcache(NS, TVM_FFI_CACHE),
        &Delivery::deliverable(digest.clone()),
    )?;
    Ok(TvmFfiCache {
        entry: n.store.join("sha256").join(digest.hex()),
        built_at,
    })
}

/// A non-root pod (uid 1000, fsGroup 1000) building the TVM-FFI modules
/// `modules` with `TVM_FFI_CACHE_DIR` at its writable `ml/tvm-ffi-modules`
/// cache volume mounted at `mount`, with `attributes` on the volume
/// besides, printing the script's JSON: each module's hit or miss.
pub fn tvm_ffi_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    attributes: &[(&str, &str)],
    modules: &[&str],
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let venv = virtualenv()?;
    let mut attrs = serde_json::Map::new();
    attrs.insert("csi.gkm.io/GKMCache".into(), TVM_FFI_CACHE.into());
    for (key, value) in attributes {
        attrs.insert((*key).into(), (*value).into());
    }
    let volumes = vec![
        json!({"name": "tvm-ffi-cache", "csi": {"driver": "csi.gkm.io", "volumeAttributes": attrs}}),
        json!({"name": "scripts", "hostPath": {"path": repo_root().join("hack/fixtures"), "type": "Directory"}}),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mounts = vec![
        json!({"name": "tvm-ffi-cache", "mountPath": mount}),
        json!({"name": "scripts", "mountPath": SCRIPTS, "readOnly": true}),
        json!({"name": "venv", "mountPath": venv, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    let script = Path::new(SCRIPTS).join(Path::new(MODULES_SCRIPT).file_name().unwrap_or_default());
    let mut command: Vec<Value> = vec![
        venv.join("bin/python").display().to_string().into(),
        script.display().to_string().into(),
    ];
    command.extend(modules.iter().map(|m| Value::from(*m)));
    let cuda = cuda_home()?.display().to_string();
    let env = [
        ("TVM_FFI_CACHE_DIR", mount.as_str()),
        ("TVM_FFI_CUDA_ARCH_LIST", CUDA_ARCHS),
        ("CUDA_HOME", cuda.as_str()),
        ("CXX", CXX),
    ];
    workload_pod(n, name, "tvm-ffi", command.into(), &env, volumes, mounts)
}
