//! Agents started together, as a DaemonSet rollout or a cluster restart
//! starts them, against a real kube-apiserver: their first passes (and so
//! their first writes) are spread over a window instead of all landing on
//! the apiserver at once.

use std::process::Command;
use std::time::Duration;

use gkm_k8s_api::crd::ClusterGKMCacheNode;
use gkm_testenv::{ControlPlane, Process};
use kube::api::Api;

#[tokio::test(flavor = "multi_thread")]
async fn agents_started_together_spread_their_first_writes() -> anyhow::Result<()> {
    let plane = ControlPlane::shared().await?;
    plane.install_crds(&gkm_k8s_api::crd::crds()).await?;
    let client = plane.client().await?;
    let dir = gkm_testenv::temp_dir()?;
    let gpus = dir.path().join("gpus.yaml");
    std::fs::write(&gpus, "gpus:\n  - profile: T4\n")?;
    let nodes: Vec<String> = (0..6).map(|i| format!("stampede-node-{i}")).collect();
    for node in &nodes {
        plane.ensure_node(node).await?;
    }

    // All started at once, with the default flags.
    let mut agents = Vec::new();
    for node in &nodes {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-agent"));
        cmd.arg(format!("--kubeconfig={}", plane.kubeconfig().display()))
            .arg(format!("--node-name={node}"))
            .arg(format!("--store={}", dir.path().join(node).display()))
            .arg(gkm_testenv::AGENT_KEEP_FREE_ARG)
            .arg(format!("--simulate={}", gpus.display()))
            .arg("--metrics-addr=127.0.0.1:0");
        agents.push(Process::spawn(
            node,
            cmd,
            &dir.path().join(format!("{node}.log")),
        )?);
    }

    // Each agent's first pass creates its node's cluster report.
    let reports: Api<ClusterGKMCacheNode> = Api::all(client);
    let waited = gkm_testenv::eventually(
        "every agent's first report",
        Duration::from_secs(60),
        || {
            let running: anyhow::Result<()> =
                agents.iter_mut().try_for_each(Process::check_running);
            let (reports, nodes) = (reports.clone(), nodes.clone());
            async move {
                running?;
                let mut created = Vec::new();
                for node in &nodes {
                    if let Some(report) = reports.get_opt(node).await? {
                        created.extend(report.metadata.creation_timestamp.map(|t| t.0));
                    }
                }
                Ok((created.len() == nodes.len()).then_some(created))
            }
        },
    )
    .await;
    let created = waited.map_err(|e| e.context(format!("log:\n{}", agents[0].log_tail(20))))?;
    let first = created.iter().min().copied().unwrap_or_default();
    let last = created.iter().max().copied().unwrap_or_default();
    let spread = last.duration_since(first);
    assert!(
        spread.as_secs() >= 3,
        "6 agents started together wrote their first reports within {spread:?} of each other: {created:?}"
    );
    for agent in &mut agents {
        agent.terminate(Duration::from_secs(15))?;
    }
    Ok(())
}
