//! `gkm-operator`: gkm's controller manager (the cache and capture
//! controllers and the admission webhooks). Flag parsing and wiring only;
//! the controllers, webhooks and the rules for their settings are
//! `gkm_k8s_operator`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use gkm_bin_support::daemon_args::DaemonArgs;
use gkm_bin_support::shutdown::{shutdown_signal, until_signal};
use gkm_k8s_api::crd::{SignatureMode, SignaturePolicy};
use gkm_k8s_api::served::ready_when_caches_listable;
use gkm_k8s_operator::admission::quota::QuotaOptions;
use gkm_k8s_operator::admission::{Endpoint, InvalidWebhook, Webhook, WebhookOptions};
use gkm_k8s_operator::cache::pvc::{FILL_HOSTS_ENV, PvcOptions};
use gkm_k8s_operator::capture::CaptureControllerOptions;
use gkm_k8s_operator::capture::decide::Retry;
use gkm_k8s_operator::capture::job::JobOptions;
use gkm_k8s_operator::job_pod::ImagePullPolicy;
use gkm_k8s_operator::{
    ImageVerifier, InvalidConfig, Metrics, OperatorCollector, OperatorConfig, PolicyFloor,
    RegistryVerifier, TenantSigners,
};
use gkm_k8s_runtime::leader::{LeaderElector, LeaseConfig, Outcome};
use gkm_k8s_runtime::metrics::{Sampled, register_build_info};
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::EndpointServer;
use gkm_oci::RegistryOptions;
use gkm_oci::mirrors::HostsConfig;
use prometheus_client::registry::Registry;

/// How long the controllers get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// gkm operator: resolves cache images to digests, verifies their signatures
/// and rolls node reports up into each cache's status.
#[derive(Parser)]
#[command(name = "gkm-operator", version)]
struct Cli {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// Where to serve /healthz, /readyz and /metrics (port 0 picks a free one).
    #[arg(long, env = "GKM_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run the controllers only while holding a Lease, so that replicas stand by.
    #[arg(long)]
    leader_elect: bool,
    /// The operator's namespace: its Lease's, the webhook CA Secret's and
    /// that of the Secrets and ConfigMaps --required-signers names.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gkm-system")]
    lease_namespace: String,
    /// The Lease's name.
    #[arg(long, default_value = "gkm-operator")]
    lease_name: String,
    /// This replica's identity in the Lease [default: $POD_NAME, else $HOSTNAME, else gkm-operator-PID].
    #[arg(long, env = "POD_NAME")]
    leader_identity: Option<String>,
    /// How long a Lease not renewed stays valid (e.g. 15s; at least 3s). The
    /// leader renews every 2/15 of it and gives up after 2/3 without renewal.
    #[arg(long, default_value = "15s", value_parser = gkm_bin_support::duration)]
    lease_duration: Duration,
    /// How often tags are resolved again when a cache does not say (e.g. 5m, 1h30m).
    #[arg(long, default_value = "5m", value_parser = gkm_bin_support::duration)]
    resolve_interval: Duration,
    /// Speak plain HTTP to registries (local test registries only).
    #[arg(long, env = "GKM_INSECURE_REGISTRY")]
    insecure_registry: bool,
    /// Registry mirrors for PVC fill Jobs: a directory of containerd-style
    /// host files (<dir>/<registry>/hosts.toml); the file of a Job's image
    /// registry is handed to the Job. A missing directory means no
    /// mirrors. The operator itself resolves tags and verifies signatures
    /// at the registry an image names.
    #[arg(long, env = "GKM_REGISTRY_CONFIG_DIR", default_value = gkm_oci::mirrors::DEFAULT_CONFIG_DIR)]
    registry_config_dir: PathBuf,
    /// The administrator's signature policy (YAML or JSON, the shape of a
    /// cache's `spec.signature`): for caches that set none, and the signers
    /// of every cache whose own signers do not count
    /// (--tenant-signer-namespaces). Without it such caches are never
    /// verified, so never delivered.
    #[arg(long)]
    default_policy: Option<PathBuf>,
    /// Namespaces whose GKMCaches' own `spec.signature` signers count
    /// (comma-separated). In every other namespace only the administrator's
    /// signers (--default-policy, --required-signers) do; a ClusterGKMCache's
    /// own signers always count.
    #[arg(long, value_delimiter = ',', value_name = "NAMESPACES")]
    tenant_signer_namespaces: Vec<String>,
    /// The signature modes a cache (or the default policy) may choose; any
    /// other is tightened to Enforce (comma-separated: Enforce, Audit, Off).
    #[arg(long, value_delimiter = ',', default_value = "Enforce")]
    allowed_signature_modes: Vec<SignatureMode>,
    /// Signers every cache image must be signed by, whatever its policy
    /// says (YAML or JSON, the shape of `spec.signature`: `signers`,
    /// `trustedRoot`, `requireTlog`; references in the operator's namespace).
    #[arg(long)]
    required_signers: Option<PathBuf>,
    /// How long a verified image stays verified before its signatures are
    /// checked again, even when nothing changed (e.g. 1h).
    #[arg(long, default_value = "1h", value_parser = gkm_bin_support::duration)]
    reverify_interval: Duration,
    /// The image of PVC fill Jobs: one whose entrypoint is `gkm-operator`
    /// (they run `gkm-operator fill`).
    #[arg(long, default_value = "ghcr.io/gkm-rs/gkm-operator:v0.1.0")]
    job_image: String,
    /// The fill Jobs' imagePullPolicy (Always, IfNotPresent, Never).
    #[arg(long, default_value = "IfNotPresent")]
    job_image_pull_policy: ImagePullPolicy,
    /// Run fill Jobs in their node's network namespace, for registries only
    /// the nodes themselves reach (a node-local mirror).
    #[arg(long)]
    job_host_network: bool,
    /// Run the capture controller: a GKMCacheCapture's workload that ended
    /// gets a capture Job (--capture-job-image running `gkm capture`) in
    /// its namespace, on its node. `false` when the GKMCacheCapture CRD is
    /// not installed.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    capture: bool,
    /// The image of capture Jobs: one whose entrypoint is the `gkm`
    /// command line (they run `gkm capture`). They use
    /// --job-image-pull-policy and --job-host-network as fill Jobs do.
    #[arg(long, default_value = "ghcr.io/gkm-rs/gkm:v0.1.0")]
    capture_job_image: String,
    /// Capture Jobs run at most per capture when the registry fails (with
    /// exponential backoff from 10s up to 5m); other failures are final.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..=100))]
    capture_attempts: i32,
    /// Make the PersistentVolumes of PVC-mode caches (hostPath, under this
    /// directory on the nodes) instead of leaving them to a provisioner, for
    /// clusters without one for the cache's StorageClass. ReadWriteOnce
    /// volumes are pinned to their node; ReadOnlyMany ones need the directory
    /// to be shared storage mounted at the same path on every node.
    #[arg(long, value_name = "DIR")]
    pvc_volume_dir: Option<PathBuf>,
    /// The size PVC-mode claims request (and gkm-made volumes offer).
    #[arg(long, default_value = "1Gi")]
    pvc_size: String,
    /// Serve the gkm.io/pvc-mutation pod webhook (HTTPS) here; without it
    /// the webhook is off and ReadWriteOnce caches' pods are left unchanged.
    #[arg(long, value_name = "ADDR")]
    webhook_listen: Option<SocketAddr>,
    /// How the apiserver reaches the webhook: a Service, NAMESPACE/NAME:PORT.
    #[arg(
        long,
        default_value = "gkm-system/gkm-operator-webhook:443",
        conflicts_with = "webhook_url"
    )]
    webhook_service: String,
    /// How the apiserver reaches the webhook: a URL (https://HOST:PORT), instead of a Service.
    #[arg(long)]
    webhook_url: Option<String>,
    /// How long the webhook's self-issued CA is valid (whole days; rotated
    /// in the last third). Every replica shares it through the Secret
    /// gkm-operator-webhook-ca in the operator's namespace.
    #[arg(long, default_value = "720h", value_parser = gkm_bin_support::duration)]
    webhook_cert_validity: Duration,
    /// How often each replica reads the shared webhook CA again (rotating
    /// it when due and writing its bundle into the webhook configuration);
    /// a new CA is trusted this long before replicas serve certificates it
    /// signed (e.g. 1m).
    #[arg(long, default_value = "1m", value_parser = gkm_bin_support::duration)]
    webhook_ca_check_interval: Duration,
    /// Serve this certificate (cert-manager's tls.crt) instead of a
    /// self-issued one; cert-manager's CA injector then fills caBundle.
    #[arg(long, requires = "webhook_key_file")]
    webhook_cert_file: Option<PathBuf>,
    /// The key of --webhook-cert-file (tls.key).
    #[arg(long, requires = "webhook_cert_file")]
    webhook_key_file: Option<PathBuf>,
    /// Answer the webhooks only over TLS connections presenting a client
    /// certificate that a CA in this PEM file signed: the apiserver's, from
    /// its admission configuration (docs/security.md, "Admission
    /// webhooks"). Without it any client reaching --webhook-listen may ask.
    #[arg(long, value_name = "PEM")]
    webhook_client_ca: Option<PathBuf>,
    /// For the GPU-quota webhook: an extended resource counted as whole
    /// GPUs (repeat for several); the scheduler extender's list.
    #[arg(long = "whole-gpu-resource", default_values = ["nvidia.com/gpu", "amd.com/gpu"])]
    whole_gpu_resources: Vec<String>,
    /// For the GPU-quota webhook: the node label naming the GPU model that
    /// quotas count by; the scheduler extender's.
    #[arg(long, default_value = "gkm.io/gpu.product")]
    model_label: String,
    /// Give each cache a DeviceClass (`gkm-cache.<namespace>.<name>`,
    /// `gkm-clustercache.<name>`) selecting the gpu.gkm.io DRA devices its
    /// kernels fit. Needs DRA and the chart's rights on DeviceClasses (set
    /// by the chart with dra.enabled).
    #[arg(long)]
    dra_device_classes: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

/// A mode other than running the controllers.
#[derive(clap::Subcommand)]
enum Command {
    /// Fill a PVC with a cache image (what fill Jobs run): extracts the
    /// image, pinned to a digest, into the mounted volume, replacing what it held.
    Fill {
        /// The image, `REPO@sha256:…`.
        #[arg(long)]
        image: String,
        /// Where the claim is mounted.
        #[arg(long)]
        into: PathBuf,
        /// Speak plain HTTP to the registry.
        #[arg(long)]
        insecure_registry: bool,
        /// The registry's host file (hosts.toml text): mirrors to read
        /// through, every byte checked against the image's digests.
        #[arg(long, env = FILL_HOSTS_ENV, hide_env_values = true)]
        registry_hosts: Option<String>,
    },
}

/// How the webhook is served, from the flags; `None` when it is off.
fn webhook_options(cli: &Cli) -> anyhow::Result<Option<WebhookOptions>> {
    let Some(listen) = cli.webhook_listen else {
        return Ok(None);
    };
    let endpoint = match &cli.webhook_url {
        Some(url) => Endpoint::parse_url(url).context("--webhook-url")?,
        None => Endpoint::parse_service(&cli.webhook_service).context("--webhook-service")?,
    };
    let options = WebhookOptions {
        listen,
        hosts: endpoint.hosts(),
        endpoint,
        validity: cli.webhook_cert_validity,
        cert_files: cli
            .webhook_cert_file
            .clone()
            .zip(cli.webhook_key_file.clone()),
        namespace: cli.lease_namespace.clone(),
        check_interval: cli.webhook_ca_check_interval,
        quota: QuotaOptions {
            whole_resources: cli.whole_gpu_resources.clone(),
            model_label: cli.model_label.clone(),
        },
        client_ca: cli.webhook_client_ca.clone(),
    };
    options.validate().map_err(|e| {
        let flag = match e {
            InvalidWebhook::Validity { .. } => "--webhook-cert-validity",
            InvalidWebhook::CheckInterval { .. } => "--webhook-ca-check-interval",
            _ => "the webhook's flags",
        };
        anyhow::anyhow!("{flag} {e}")
    })?;
    Ok(Some(options))
}

async fn fill(
    image: &str,
    into: &Path,
    insecure: bool,
    hosts: Option<&String>,
) -> anyhow::Result<()> {
    let reference: gkm_oci::ImageRef = image
        .parse()
        .with_context(|| format!("--image {image:?}"))?;
    let registry = RegistryOptions {
        insecure,
        hosts: hosts.map_or(HostsConfig::None, |text| HostsConfig::Text(text.clone())),
        ..RegistryOptions::default()
    };
    let stats = gkm_k8s_operator::cache::pvc::fill(&reference, into, &registry)
        .await
        .with_context(|| format!("filling {} from {image}", into.display()))?;
    println!(
        "filled {} from {image}: {} files, {} bytes",
        into.display(),
        stats.files,
        stats.bytes
    );
    Ok(())
}

fn read_policy(flag: &str, path: &Path) -> anyhow::Result<SignaturePolicy> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading --{flag} {}", path.display()))?;
    serde_yaml::from_str(&text)
        .with_context(|| format!("--{flag} {}: not a signature policy", path.display()))
}

/// The flag that sets what `e` names.
fn flag_of(e: &InvalidConfig) -> &'static str {
    match e {
        InvalidConfig::ResolveInterval { .. } => "--resolve-interval",
        InvalidConfig::ReverifyInterval { .. } => "--reverify-interval",
        InvalidConfig::NoRequiredSigner => "--required-signers",
        InvalidConfig::NoAllowedMode => "--allowed-signature-modes",
        _ => "the operator's flags",
    }
}

fn identity(flag: Option<String>) -> String {
    flag.filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| format!("gkm-operator-{}", std::process::id()))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(Command::Fill {
        image,
        into,
        insecure_registry,
        registry_hosts,
    }) = &cli.command
    {
        return fill(image, into, *insecure_registry, registry_hosts.as_ref()).await;
    }
    let registry_hosts = HostsConfig::Dir(cli.registry_config_dir.clone());
    for problem in registry_hosts.problems() {
        tracing::warn!(%problem, "--registry-config-dir: fill Jobs read this registry without mirrors");
    }
    let webhook = webhook_options(&cli)?;
    let tenant_signers =
        TenantSigners::parse_namespaces(cli.tenant_signer_namespaces.iter().map(String::as_str))
            .context("--tenant-signer-namespaces")?;
    let identity = identity(cli.leader_identity);
    let default_policy = cli
        .default_policy
        .as_deref()
        .map(|p| read_policy("default-policy", p))
        .transpose()?;
    let required = cli
        .required_signers
        .as_deref()
        .map(|p| read_policy("required-signers", p))
        .transpose()?;
    let capture = cli.capture.then(|| CaptureControllerOptions {
        job: JobOptions {
            image: cli.capture_job_image.clone(),
            image_pull_policy: cli.job_image_pull_policy,
            host_network: cli.job_host_network,
        },
        retry: Retry {
            max_attempts: cli.capture_attempts,
            ..Retry::default()
        },
        poll: CaptureControllerOptions::DEFAULT_POLL,
    });
    let config = OperatorConfig {
        registry: RegistryOptions {
            insecure: cli.insecure_registry,
            ..RegistryOptions::default()
        },
        default_policy,
        tenant_signers,
        resolve_interval: cli.resolve_interval,
        floor: PolicyFloor {
            allowed_modes: cli.allowed_signature_modes,
            required,
        },
        reverify_interval: cli.reverify_interval,
        instance: identity.clone(),
        device_classes: cli.dra_device_classes,
        pvc: PvcOptions {
            job_image: cli.job_image,
            job_image_pull_policy: cli.job_image_pull_policy,
            job_host_network: cli.job_host_network,
            insecure_registry: cli.insecure_registry,
            volume_dir: cli.pvc_volume_dir,
            claim_size: cli.pvc_size,
            registry_hosts,
        },
        capture,
    };
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("{} {e}", flag_of(&e)))?;
    let client = gkm_k8s_runtime::client::connect(cli.daemon.kubeconfig.as_deref()).await?;
    // Every replica serves the webhook, leader or not: the Service may send
    // a pod to any of them.
    let webhook = match webhook {
        Some(options) => Some(
            Webhook::start(client.clone(), options)
                .await
                .map_err(|e| anyhow::anyhow!("the admission webhooks: {e}"))?,
        ),
        None => None,
    };

    let metrics = Arc::new(Metrics::default());
    let readiness = Readiness::default();
    let mut registry = Registry::with_prefix("gkm");
    registry.register_collector(Box::new(OperatorCollector(metrics.clone())));
    register_build_info(&mut registry, "gkm-operator", env!("CARGO_PKG_VERSION"));
    let elector = cli.leader_elect.then(|| {
        let lease = LeaseConfig::new(&cli.lease_namespace, &cli.lease_name, &identity)
            .with_lease_duration(cli.lease_duration);
        LeaderElector::new(client.clone(), lease)
    });
    if let Some(elector) = &elector {
        let help = "1 while this replica holds the operator's Lease and runs the controllers";
        registry.register_collector(Box::new(Sampled::flag("leader", help, elector.leading())));
    }

    let server = EndpointServer::start(cli.metrics_addr, registry, readiness.clone())
        .await
        .with_context(|| format!("listening on --metrics-addr {}", cli.metrics_addr))?;
    ready_when_caches_listable(&client, &readiness);

    let verifier: Arc<dyn ImageVerifier> = Arc::new(
        RegistryVerifier::new(
            client.clone(),
            config.registry.clone(),
            &cli.lease_namespace,
        )
        .with_metrics(metrics.clone()),
    );
    let controllers = until_signal(
        gkm_k8s_operator::run(client, config, verifier, metrics),
        SHUTDOWN_GRACE,
    );
    let result = match elector {
        None => match controllers.await {
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        },
        Some(elector) => match elector.run(shutdown_signal(), controllers).await {
            Outcome::Completed(Some(Err(e))) => Err(e.into()),
            Outcome::Completed(_) | Outcome::ShutDown => Ok(()),
            Outcome::LeadershipLost { holder } => Err(anyhow::anyhow!(
                "lost the Lease {}/{} (held by {}); exiting so that a restart stands by",
                cli.lease_namespace,
                cli.lease_name,
                holder
                    .as_deref()
                    .unwrap_or("nobody: it could not be renewed")
            )),
        },
    };
    server.stop().await.context("the endpoints server")?;
    if let Some(webhook) = webhook {
        webhook.stop().await;
    }
    result
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.daemon.init_logging();
    gkm_bin_support::exit_code("gkm-operator", run(cli).await)
}
