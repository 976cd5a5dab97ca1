//! `gkm-local`: gkm on a local control plane, no cluster needed.
//!
//! Starts etcd, kube-apiserver and an OCI registry on loopback (the same real
//! components the tests use, from `hack/components.sh`), installs gkm's CRDs,
//! prints how to reach them with kubectl, and runs until interrupted.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use gkm_testenv::{ControlPlane, ControlPlaneOptions, Registry, tools_bin_dir};

/// Run gkm on a local control plane.
#[derive(Parser)]
#[command(name = "gkm-local", version, about)]
struct Cli {
    /// Directory for the control plane's state (wiped at start).
    #[arg(long, default_value = ".gkm/local")]
    dir: PathBuf,
    /// Exit once everything is up instead of running until Ctrl-C.
    #[arg(long)]
    exit_when_ready: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let began = Instant::now();
    if cli.dir.exists() {
        std::fs::remove_dir_all(&cli.dir)?;
    }
    std::fs::create_dir_all(cli.dir.join("registry"))?;
    let dir = std::fs::canonicalize(&cli.dir)?;

    let plane = ControlPlane::start_in_dir(&dir, ControlPlaneOptions::default()).await?;
    eprintln!(
        "control plane ready in {:.1?} at {}",
        plane.started_in(),
        plane.url()
    );
    plane.install_crds(&gkm_k8s::crd::crds()).await?;
    eprintln!("gkm CRDs installed and Established");
    let registry = Registry::start_in_dir(&dir.join("registry"))?;
    eprintln!("OCI registry on http://{}", registry.addr());

    let kubeconfig = dir.join("kubeconfig");
    std::fs::copy(plane.kubeconfig(), &kubeconfig)?;
    println!(
        "\ngkm is up in {:.1?}. In another shell:\n\n  export PATH={}:$PATH KUBECONFIG={}\n  kubectl get crds\n  kubectl api-resources --api-group=gkm.io\n  kubectl get gkmcache,gkmcachenode -A\n\nregistry: {} (push with `gkm build DIR -t {}/NAME:TAG --insecure`)\n",
        began.elapsed(),
        tools_bin_dir().display(),
        kubeconfig.display(),
        registry.addr(),
        registry.addr(),
    );
    if cli.exit_when_ready {
        return Ok(());
    }
    eprintln!("Ctrl-C stops everything.");
    tokio::signal::ctrl_c().await?;
    eprintln!("stopping");
    Ok(())
}
