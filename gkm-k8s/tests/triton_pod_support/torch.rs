//! The fixture's real Inductor cache (`fixtures/torch/inductor`) on the
//! same node, deliverable as `ml/torch-inductor`: built into an image and
//! extracted into the node store as the agent does, published once per test
//! binary. And the pod that runs real `torch.compile` against it
//! (`hack/fixtures/torch_model.py check`, PyTorch 2.11 from the host's
//! virtualenv, `hack/ci/components.sh torch`).

// Only the PyTorch tests use it; the Triton tests share the module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use gkm_k8s_node::delivery::{Delivery, DeliveryIndex};
use gkm_testenv::torch::{MODEL_SCRIPT, VIRTUALENV_LINK, fixture, model_dir, virtualenv};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{NS, SCRATCH, TritonNode, node_with, store_tree, workload_pod};
use crate::csi_support::gkmcache;

/// The `GKMCache` the PyTorch pods' volumes name.
pub const TORCH_CACHE: &str = "torch-inductor";

/// Where the pod sees the model's script.
const MODEL: &str = "/model";
/// Where the pod sees the fixture (its expected outputs).
const FIXTURE: &str = "/fixture";
/// The fixture's Inductor cache in the node store.
pub struct TorchCache {
    /// Its verified tree in the store.
    pub entry: PathBuf,
}

static CACHE: OnceCell<Result<TorchCache, String>> = OnceCell::const_new();

/// The node of this test binary with the Inductor cache in its store,
/// published by the first caller (the others wait for it).
pub async fn torch_node() -> (&'static TritonNode, &'static TorchCache) {
    node_with(&CACHE, "Inductor", publish).await
}

async fn publish(n: &TritonNode) -> anyhow::Result<TorchCache> {
    let fixture = fixture()?;
    let work = n.store.with_file_name("torch-layout");
    std::fs::create_dir_all(&work)?;
    let digest = store_tree(&work, &n.store, &fixture.inductor).await?;
    DeliveryIndex::new(&n.store).publish(
        &gkmcache(NS, TORCH_CACHE),
        &Delivery::deliverable(digest.clone()),
    )?;
    Ok(TorchCache {
        entry: n.store.join("sha256").join(digest.hex()),
    })
}

/// A non-root pod (uid 1000, fsGroup 1000) running real `torch.compile` on
/// the CPU against its `ml/torch-inductor` cache volume at `mount` (read-only
/// or not) as `TORCHINDUCTOR_CACHE_DIR`: the fixture's model for its two
/// input shapes (and one the cache never saw, with `new_shape`), printing
/// one JSON report.
pub fn torch_pod(
    n: &TritonNode,
    name: &str,
    mount: &Path,
    read_only: bool,
    new_shape: bool,
) -> anyhow::Result<Pod> {
    let mount = mount.display().to_string();
    let venv = virtualenv()?.display().to_string();
    let fixture_dir = fixture()?
        .expected
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let volumes = vec![
        json!({"name": "inductor", "csi": {
            "driver": "csi.gkm.io",
            "readOnly": read_only,
            "volumeAttributes": {"csi.gkm.io/GKMCache": TORCH_CACHE},
        }}),
        json!({"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}),
        json!({"name": "model", "hostPath": {
            "path": model_dir().display().to_string(), "type": "Directory"}}),
        json!({"name": "fixture", "hostPath": {
            "path": fixture_dir.display().to_string(), "type": "Directory"}}),
        json!({"name": "scratch", "emptyDir": {}}),
    ];
    let mounts = vec![
        json!({"name": "inductor", "mountPath": mount, "readOnly": read_only}),
        json!({"name": "venv", "mountPath": VIRTUALENV_LINK, "readOnly": true}),
        json!({"name": "model", "mountPath": MODEL, "readOnly": true}),
        json!({"name": "fixture", "mountPath": FIXTURE, "readOnly": true}),
        json!({"name": "scratch", "mountPath": SCRATCH}),
    ];
    let mut command: Vec<Value> = [
        format!("{VIRTUALENV_LINK}/bin/python"),
        format!("{MODEL}/{MODEL_SCRIPT}"),
        "check".into(),
        "--cache".into(),
        mount.clone(),
        "--expected".into(),
        format!("{FIXTURE}/expected.json"),
    ]
    .into_iter()
    .map(Value::from)
    .collect();
    if new_shape {
        command.push("--new-shape".into());
    }
    // Inductor names its default directories after the user (getpass);
    // uid 1000 has no passwd entry here.
    let env = [("USER", "workload")];
    workload_pod(
        n,
        name,
        "torch",
        Value::from(command),
        &env,
        volumes,
        mounts,
    )
}
