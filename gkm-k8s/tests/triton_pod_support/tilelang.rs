//! The real TileLang cache of `fixtures/tilelang` (GEMM kernels TileLang
//! 0.1.15 compiled without a GPU, `hack/fixtures/tilelang.sh`) on the same
//! node, deliverable as `ml/tilelang-gemm`: built into an image and
//! extracted into the node store as the agent does, published once per
//! test binary. And the pod that compiles TileLang kernels against it
//! (`hack/fixtures/tilelang_kernels.py`, TileLang from the host's
//! virtualenv with the torch one it imports, `hack/ci/components.sh
//! tilelang`).

// Only the TileLang test uses it; the Triton tests share the module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::{Component, copy_tree, find_binary, repo_root};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{NS, SCRATCH, TritonNode, node_with, store_tree, workload_pod};
use crate::csi_support::gkmcache;

/// The `GKMCache` the TileLang pods' volumes name.
pub const TILELANG_CACHE: &str = "tilelang-gemm";
/// Where TileLang's virtualenv is, on the host and in the pod (its
/// wrapper links it there), and the torch one it imports through a `.pth`.
const VIRTUALENVS: [(&str, &str); 2] = [
    ("tilelang-0.1.15", "/tmp/gkm-tilelang-0.1.15"),
    ("torch-2.11.0", "/tmp/gkm-torch-2.11.0"),
];
/// TileLang's staging directories in a cache of version 0.1.15 on
/// x86-64 Linux (`KernelCache._create_dirs`, `BinaryCache.save`).
const STAGING_DIRS: [&str; 2] = [
    "0.1.15/linux-x86_64/.staging",
    "0.1.15/.staging/cuda-binaries",
];
/// Where the pod sees the kernels' script.
const SCRIPTS: &str = "/scripts";

/// The fixture's TileLang cache in the node store.
pub struct TileLangCache {
    /// Its verified tree in the store.
    pub entry: PathBuf,
}

static CACHE: OnceCell<Result<TileLangCache, String>> = OnceCell::const_new();

/// The node of this test binary with the TileLang cache in its store,
/// published by the first caller (the others wait for it).
pub async fn tilelang_node() -> (&'static TritonNode, &'static TileLangCache) {
    node_with(&CACHE, "TileLang", publish).await
}

async fn publish(n: &TritonNode) -> anyhow::Result<TileLangCache> {
    let work = n.store.with_file_name("tilelang-layout");
    std::fs::create_dir_all(&work)?;
    // The fixture as TileLang left it: with its staging directories, empty
    // once every entry was renamed into place, which git does not keep.
    // TileLang creates them when it starts, so a read-only view needs them.
    let tree = work.join("cache");
    copy_tree(&repo_root().join("fixtures/tilelang/cache"), &tree)?;
    for staging in STAGING_DIRS {
        std::fs::create_dir_all(tree.join(staging))?;
    }
    let digest = store_tree(&work, &n.store, &tree).await?;
    DeliveryIndex::new(&n.store).publish(
        &gkmcache(NS, TILELANG_CACHE),
        &Delivery::deliverable(digest.clone()),
    )?;
    Ok(TileLangCache {
        entry: n.store.join("sha256").join(digest.hex()),
    })
}

/// A non-root pod (uid 1000, fsGroup 1000) compiling the TileLang kernels
/// `kernels` for `arch` with `TILELANG_CACHE_DIR` at its `ml/tilelang-gemm`
/// cache volume (read-only or not) mounted at `mount`, printing the
/// script's JSON: each kernel's hit or miss.
pub fn tilelang_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    read_only: bool,
    arch: &str,
    kernels: &[&str],
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let tools = find_binary(Component::TileLang)?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("the tools directory")?;
    let scripts = repo_root().join("hack/fixtures");
    let mut volumes = vec![
        json!({"name": "tilelang-cache", "csi": {
            "driver": "csi.gkm.io",
            "readOnly": read_only,
            "volumeAttributes": {"csi.gkm.io/GKMCache": TILELANG_CACHE},
        }}),
        json!({"name": "scripts", "hostPath": {"path": scripts, "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "tilelang-cache", "mountPath": mount, "readOnly": read_only}),
        json!({"name": "scripts", "mountPath": SCRIPTS, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    for (i, (dir, link)) in VIRTUALENVS.iter().enumerate() {
        let name = format!("venv-{i}");
        volumes.push(
            json!({"name": name, "hostPath": {"path": tools.join(dir), "type": "Directory"}}),
        );
        mounts.push(json!({"name": name, "mountPath": link, "readOnly": true}));
    }
    let mut command: Vec<Value> = vec![
        format!("{}/bin/python", VIRTUALENVS[0].1).into(),
        format!("{SCRIPTS}/tilelang_kernels.py").into(),
        arch.into(),
    ];
    command.extend(kernels.iter().map(|k| Value::from(*k)));
    let env = [
        ("TILELANG_CACHE_DIR", mount.as_str()),
        ("TILELANG_PRINT_ON_COMPILATION", "0"),
    ];
    workload_pod(n, name, "tilelang", command.into(), &env, volumes, mounts)
}

/// The script's JSON report in `log`: which kernels hit.
pub fn report(log: &str) -> anyhow::Result<Value> {
    super::json_report(log, "kernels")
}
