//! `gkm-scheduler-extender`: the kube-scheduler extender (filter,
//! prioritize, bind) for GPU fit, shared GPUs, GPU-model quotas, packing and
//! cache-aware placement. Flag parsing and wiring only; the extender is
//! `gkm_k8s_extender`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gkm_bin_support::daemon_args::DaemonArgs;
use gkm_bin_support::shutdown::until_signal;
use gkm_k8s_extender::{self as extender, IndexConfig};
use gkm_k8s_runtime::endpoints::Endpoints;
use gkm_k8s_runtime::metrics::register_build_info;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::{EndpointServer, TlsAcceptor, mtls_acceptor, tls_acceptor};
use prometheus_client::registry::Registry;

/// gkm scheduler extender: serves `POST /scheduler/filter`,
/// `/scheduler/prioritize` and `/scheduler/bind` to kube-scheduler (over
/// mutual TLS: only a caller with a client certificate of --client-ca-file),
/// and `/healthz`, `/readyz` and `/metrics`.
#[derive(Parser)]
#[command(name = "gkm-scheduler-extender", version)]
struct Cli {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Where to serve the extender's verbs and the health and metrics endpoints.
    #[arg(long, env = "GKM_EXTENDER_ADDR", default_value = "0.0.0.0:8888")]
    address: SocketAddr,
    /// Also serve the health and metrics endpoints (not the verbs) here, over
    /// plain HTTP: for probes and scrapers, so that a NetworkPolicy can admit
    /// only the scheduler to --address.
    #[arg(long)]
    metrics_address: Option<SocketAddr>,
    /// An extended resource counted as whole GPUs (repeat for several; e.g.
    /// the device plugin's passthrough resources).
    #[arg(long = "whole-gpu-resource", default_values = ["nvidia.com/gpu", "amd.com/gpu"])]
    whole_gpu_resources: Vec<String>,
    /// The node label naming the GPU model that quotas count by.
    #[arg(long, default_value = extender::DEFAULT_MODEL_LABEL)]
    model_label: String,
    /// How often quota use is written to GKMGPUQuota status (when it changed).
    #[arg(long, default_value = "2s", value_parser = gkm_bin_support::duration)]
    quota_status_interval: Duration,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key-file);
    /// the scheduler's extender entry then sets `enableHTTPS: true` and
    /// `tlsConfig.caData` or `tlsConfig.caFile`.
    #[arg(long, requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// Serve the verbs only to callers presenting a client certificate that
    /// a CA in this PEM file signed: kube-scheduler, with
    /// `tlsConfig.certFile` and `tlsConfig.keyFile`. Any other caller fails
    /// the TLS handshake. Needs --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    client_ca_file: Option<PathBuf>,
    /// Serve the verbs without client certificates, to every caller that
    /// reaches --address: any of them may then bind pods to any node with
    /// the extender's rights. Without it, the extender does not start
    /// without --client-ca-file.
    #[arg(long, conflicts_with = "client_ca_file")]
    insecure_no_client_auth: bool,
}

/// How the verbs are served, from the TLS flags: over mutual TLS, or (only
/// with --insecure-no-client-auth) to any caller, over HTTPS or plain HTTP.
fn tls(cli: &Cli) -> anyhow::Result<Option<TlsAcceptor>> {
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    match (&cli.tls_cert_file, &cli.tls_key_file, &cli.client_ca_file) {
        (Some(cert), Some(key), Some(ca)) => mtls_acceptor(&read(cert)?, &read(key)?, &read(ca)?)
            .map(Some)
            .map_err(|e| {
                anyhow::anyhow!(
                    "--tls-cert-file {} with --client-ca-file {}: {e}",
                    cert.display(),
                    ca.display()
                )
            }),
        _ if !cli.insecure_no_client_auth => anyhow::bail!(
            "refusing to serve /scheduler/bind to callers without a client certificate: \
             bind places pods with the extender's rights. Give --tls-cert-file, \
             --tls-key-file and --client-ca-file (the CA of kube-scheduler's client \
             certificate), or --insecure-no-client-auth to let every caller that \
             reaches --address bind pods"
        ),
        (Some(cert), Some(key), None) => tls_acceptor(&read(cert)?, &read(key)?)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--tls-cert-file {}: {e}", cert.display())),
        _ => Ok(None),
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let tls = tls(&cli)?;
    if cli.insecure_no_client_auth {
        tracing::warn!(
            address = %cli.address,
            "--insecure-no-client-auth: every caller that reaches the address may bind pods"
        );
    }
    let client = gkm_k8s_runtime::client::connect(cli.daemon.kubeconfig.as_deref()).await?;
    let config = IndexConfig {
        whole_resources: cli.whole_gpu_resources,
        model_label: cli.model_label,
    };
    let readiness = Readiness::default();
    let (extender, work) = extender::start(client, config, &readiness, cli.quota_status_interval);
    // The metrics are shared handles: each registry serves the same values.
    let registry = || {
        let mut registry = Registry::with_prefix("gkm");
        extender.register_metrics(&mut registry);
        register_build_info(
            &mut registry,
            "gkm-scheduler-extender",
            env!("CARGO_PKG_VERSION"),
        );
        registry
    };
    let endpoints = Endpoints::new(registry(), readiness.clone()).with_routes(extender.clone());
    let server = EndpointServer::start_endpoints(cli.address, endpoints, tls)
        .await
        .with_context(|| format!("listening on --address {}", cli.address))?;
    let metrics = match cli.metrics_address {
        Some(addr) => Some(
            EndpointServer::start_endpoints(addr, Endpoints::new(registry(), readiness), None)
                .await
                .with_context(|| format!("listening on --metrics-address {addr}"))?,
        ),
        None => None,
    };
    tracing::info!(address = %cli.address, "serving the extender");
    until_signal(work, Duration::from_secs(1)).await;
    server.stop().await.context("the extender server")?;
    if let Some(metrics) = metrics {
        metrics.stop().await.context("the metrics server")?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.daemon.init_logging();
    gkm_bin_support::exit_code("gkm-scheduler-extender", run(cli).await)
}
