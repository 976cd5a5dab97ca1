//! Many node agents in one process: the real agent library
//! (`gkm_k8s_agent::run`), one instance per node, each with a client of its
//! own, as the `gkm-agent` binary would run it on every node. Used by
//! `hack/bench/operator.sh`, where a thousand agent processes would not fit
//! one machine.
//!
//! Every directory under `NODES_DIR` is one node, named after it, holding
//! `gpus.yaml` (its simulated GPU inventory) and `store/`.
//!
//! ```sh
//! cargo run -p gkm-agent --example agents -- KUBECONFIG NODES_DIR
//! ```
//!
//! Differences from the binary: no GPU telemetry and no endpoints server
//! (nothing scrapes them here); registries are spoken to over plain HTTP.
//! Runs until SIGTERM or Ctrl-C.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The node directories under `dir`, sorted by name.
fn node_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.join("gpus.yaml").is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    anyhow::ensure!(
        !dirs.is_empty(),
        "no node directories (with gpus.yaml) under {}",
        dir.display()
    );
    Ok(dirs)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let usage = "usage: agents KUBECONFIG NODES_DIR";
    let kubeconfig = args.next().context(usage)?;
    let nodes_dir = args.next().context(usage)?;
    gkm_bin_support::init_logging(false, "warn");

    let mut agents = tokio::task::JoinSet::new();
    for dir in node_dirs(&nodes_dir)? {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{}: not a node name", dir.display()))?
            .to_string();
        let client = gkm_k8s_runtime::client::connect(Some(&kubeconfig)).await?;
        let mut config = gkm_k8s_agent::AgentConfig::new(&name, dir.join("store"));
        config.discovery.simulate = Some(dir.join("gpus.yaml"));
        config.registry.insecure = true;
        // A fixed reserve, as the test ground's agents keep
        // (gkm_testenv::AGENT_KEEP_FREE_ARG says why).
        config.extract_policy.free_space_reserve = gkm_oci::FreeSpaceReserve::bytes(1 << 30);
        agents.spawn(async move {
            gkm_k8s_agent::run(client, config, gkm_bin_support::shutdown::shutdown_signal())
                .await
                .with_context(|| format!("the agent of node {name}"))
        });
    }
    eprintln!("{} agents running", agents.len());
    // Each agent returns when the process is asked to stop; the first
    // failure ends them all.
    while let Some(result) = agents.join_next().await {
        result??;
    }
    Ok(())
}
