//! The capture index, as the agent writes it for the CSI driver (which
//! reads no cluster object): `gkm-agent`, as its ServiceAccount with the
//! shipped RBAC against a real kube-apiserver, names every pending capture
//! of the cluster (the driver publishes capture volumes only for those),
//! says of each captured tree's capture whether it is open, over or gone,
//! and says it again as the capture ends.

use std::process::Command;
use std::time::Duration;

use gkm_k8s_api::crd::{CaptureSigning, GKMCacheCapture, GKMCacheCaptureSpec};
use gkm_k8s_node::captures::{CaptureIndex, CaptureName, CaptureState};
use gkm_testenv::{Process, free_port};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod support;

#[tokio::test]
async fn the_agent_writes_what_the_cluster_says_of_the_captured_trees() -> anyhow::Result<()> {
    let (plane, kubeconfig) = support::agent_plane().await?;
    let admin = plane.client().await?;
    let node = "agent-node-captures";
    let namespace = "capture-team";
    plane.ensure_node(node).await?;
    plane.ensure_namespace(namespace).await?;
    let elsewhere = "capture-elsewhere";
    plane.ensure_namespace(elsewhere).await?;
    let dir = gkm_testenv::temp_dir()?;
    let store = dir.path().join("store");
    std::fs::write(dir.path().join("gpus.yaml"), "gpus:\n  - profile: T4\n")?;

    // Trees the CSI driver made for two captures' workloads: one capture
    // is being captured on this node, the other never existed.
    for tree in ["warm/uid-warm-0", "deleted/uid-old-0"] {
        std::fs::create_dir_all(store.join("captures").join(namespace).join(tree))?;
    }
    let captures: Api<GKMCacheCapture> = Api::namespaced(admin.clone(), namespace);
    let capture = GKMCacheCapture::new(
        "warm",
        GKMCacheCaptureSpec {
            target_image: "registry.example.com/caches/warm:v1".into(),
            signing: CaptureSigning {
                secret_name: "cosign".into(),
                ..CaptureSigning::default()
            },
            ..GKMCacheCaptureSpec::default()
        },
    );
    let apply = PatchParams::apply("gkm-test").force();
    captures
        .patch("warm", &apply, &Patch::Apply(&capture))
        .await?;
    let set_phase = |phase: &'static str| {
        let captures = captures.clone();
        async move {
            captures
                .patch_status(
                    "warm",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"phase": phase, "node": node}})),
                )
                .await
        }
    };
    set_phase("Capturing").await?;
    // A capture of another namespace, pending, no tree on this node yet.
    let mut pending = capture.clone();
    pending.metadata.namespace = Some(elsewhere.into());
    Api::<GKMCacheCapture>::namespaced(admin.clone(), elsewhere)
        .patch("warm", &apply, &Patch::Apply(&pending))
        .await?;

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--node-name={node}"))
        .arg(format!("--store={}", store.display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!(
            "--simulate={}",
            dir.path().join("gpus.yaml").display()
        ))
        .arg(format!("--metrics-addr=127.0.0.1:{}", free_port()?))
        .arg("--start-jitter=0s")
        .env("GKM_LOG", "info");
    let agent = Process::spawn("gkm-agent", cmd, &dir.path().join("gkm-agent.log"))?;

    let index = CaptureIndex::new(&store);
    let (warm, deleted, other) = (
        CaptureName::new(namespace, "warm"),
        CaptureName::new(namespace, "deleted"),
        CaptureName::new(elsewhere, "warm"),
    );
    let says = |warm_state: CaptureState| {
        let (index, warm, deleted, other) =
            (index.clone(), warm.clone(), deleted.clone(), other.clone());
        move || {
            let index = index.clone();
            let (warm, deleted, other) = (warm.clone(), deleted.clone(), other.clone());
            async move {
                Ok(index.read()?.filter(|captures| {
                    captures.state(&warm) == Some(warm_state)
                        && captures.state(&deleted) == Some(CaptureState::Gone)
                        && captures.state(&other) == Some(CaptureState::Open)
                }))
            }
        }
    };
    let with_log = |e: anyhow::Error| e.context(format!("agent log:\n{}", agent.log_tail(40)));

    gkm_testenv::eventually(
        "the index says warm is open, deleted gone, the other pending",
        Duration::from_secs(30),
        says(CaptureState::Open),
    )
    .await
    .map_err(with_log)?;

    // The capture ends: the watch of this node's captures tells the agent.
    set_phase("Complete").await?;
    gkm_testenv::eventually(
        "the index says warm is over",
        Duration::from_secs(30),
        says(CaptureState::Over),
    )
    .await
    .map_err(with_log)?;
    Ok(())
}
