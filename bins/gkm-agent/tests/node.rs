//! `gkm-agent` as it is deployed: running as the `gkm-agent` ServiceAccount
//! with the shipped RBAC against a real kube-apiserver, for a node with
//! simulated GPUs. It becomes ready, labels its Node with the GPUs, serves
//! its metrics, looks again as soon as its Node is relabelled (not at each
//! kubelet status update) and stops on SIGTERM. Also what a user sees for
//! bad flags.

use std::process::Command;
use std::time::Duration;

use gkm_testenv::{Process, samples};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod support;

use gkm_testenv::{free_port, http_get as get};
use support::{until, until_some};

#[tokio::test]
async fn the_agent_labels_its_node_and_serves_health_and_metrics() -> anyhow::Result<()> {
    let (plane, kubeconfig) = support::agent_plane().await?;
    let admin = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;

    let node_name = "agent-node-t4";
    let nodes: Api<Node> = Api::all(admin.clone());
    plane.ensure_node(node_name).await?;
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(&gpus, "gpus:\n  - profile: T4\n    count: 2\n")?;

    let port = free_port()?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--node-name={node_name}"))
        .arg(format!("--store={}", dir.path().join("store").display()))
        .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
        .arg(format!("--simulate={}", gpus.display()))
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        // An hour: every pass after the first is woken by a watched change.
        .arg("--resync=1h");
    let mut agent = Process::spawn("gkm-agent", cmd, &dir.path().join("gkm-agent.log"))?;

    let labels = until_some(
        &mut agent,
        "the agent ready and its Node labelled",
        Duration::from_secs(30),
        || {
            let nodes = nodes.clone();
            async move {
                let ready = get(port, "/readyz").await.is_some_and(|(s, _)| s == 200);
                let labels = nodes
                    .get(node_name)
                    .await?
                    .metadata
                    .labels
                    .unwrap_or_default();
                Ok((ready && labels.contains_key("gkm.io/gpu.count")).then_some(labels))
            }
        },
    )
    .await?;
    assert_eq!(
        labels.get("gkm.io/gpu.count").map(String::as_str),
        Some("2")
    );
    assert_eq!(
        labels.get("gkm.io/gpu.vendor").map(String::as_str),
        Some("nvidia")
    );
    assert_eq!(
        labels.get("gkm.io/gpu.simulated").map(String::as_str),
        Some("true")
    );
    assert_eq!(get(port, "/healthz").await, Some((200, "ok\n".to_string())));
    let (status, metrics) = get(port, "/metrics").await.unwrap_or_default();
    assert_eq!(status, 200);
    let version = env!("CARGO_PKG_VERSION");
    let info = format!("gkm_build_info{{component=\"gkm-agent\",version=\"{version}\"}} 1");
    assert!(metrics.lines().any(|l| l == info), "{metrics}");

    // Its own labels come back through its watch of the Node; once that
    // settled, a status update and an annotation wake nothing, a new label
    // wakes one pass.
    let mut settled = passes(port).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = passes(port).await?;
        if now == settled {
            break;
        }
        settled = now;
    }
    let merge = |body| Patch::Merge(body);
    nodes
        .patch_status(
            node_name,
            &PatchParams::default(),
            &merge(json!({"status": {"allocatable": {"pods": "111"}}})),
        )
        .await?;
    nodes
        .patch(
            node_name,
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"example.com/heartbeat": "1"}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        passes(port).await?,
        settled,
        "a change to the Node's status or annotations woke the agent"
    );
    nodes
        .patch(
            node_name,
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"team": "ml"}}})),
        )
        .await?;
    until(
        &mut agent,
        "relabelling the Node waking the agent",
        Duration::from_secs(10),
        || async move { Ok(passes(port).await? > settled) },
    )
    .await?;

    let exit = agent.terminate(Duration::from_secs(15))?;
    assert!(exit.success(), "the agent exited with {exit}");
    Ok(())
}

/// The agent's passes so far, from its metrics.
async fn passes(port: u16) -> anyhow::Result<f64> {
    let (_, metrics) = get(port, "/metrics").await.unwrap_or_default();
    Ok(samples(&metrics)?
        .iter()
        .filter(|s| s.name == "gkm_agent_sync_passes_total")
        .map(|s| s.value)
        .sum())
}

#[test]
fn bad_flags_are_named() -> anyhow::Result<()> {
    let run = |args: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = Command::new(env!("CARGO_BIN_EXE_gkm-agent"))
            .args(args)
            .env_remove("NODE_NAME")
            .output()?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (ok, err) = run(&[])?;
    assert!(!ok);
    assert!(err.contains("--node-name"), "{err}");
    let (ok, err) = run(&["--node-name=n1", "--simulate=/nonexistent/gpus.yaml"])?;
    assert!(!ok);
    assert!(err.contains("--simulate /nonexistent/gpus.yaml"), "{err}");
    let (ok, err) = run(&["--node-name=n1", "--resync=0s"])?;
    assert!(!ok);
    assert!(err.contains("--resync"), "{err}");
    let (ok, err) = run(&["--node-name=n1", "--resync=10m", "--stall-after=5m"])?;
    assert!(!ok);
    assert!(
        err.contains("--stall-after") && err.contains("--resync"),
        "{err}"
    );
    let (ok, err) = run(&["--node-name=n1", "--extract-deadline=0s"])?;
    assert!(!ok);
    assert!(err.contains("--extract-deadline"), "{err}");
    let (ok, err) = run(&["--node-name=n1", "--resync=9999999999999999h"])?;
    assert!(!ok);
    assert!(
        err.contains("is not a duration") && !err.contains("panicked"),
        "{err}"
    );
    Ok(())
}
