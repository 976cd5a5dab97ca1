//! Starting `gkm-operator` as deployed (its ServiceAccount, the shipped
//! RBAC) with the chart's GPU-quota webhook configuration pointing at it,
//! for the tests that call its admission webhooks.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gkm_k8s_operator::admission::Endpoint;
use gkm_k8s_operator::admission::quota::{QUOTA_CONFIGURATION_NAME, quota_configuration};
use gkm_testenv::{ControlPlane, Process, free_port, http_get};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::Api;

/// gkm's namespace.
pub const SYSTEM: &str = "gkm-system";

/// A running operator serving the admission webhooks.
pub struct Operator {
    /// The process (its log under the directory it was started with).
    pub process: Process,
    /// Its metrics and health port on 127.0.0.1.
    pub metrics_port: u16,
    /// The caBundle it wrote into the quota webhook configuration: its
    /// serving CA.
    pub ca_bundle: Vec<u8>,
}

/// Applies the quota webhook configuration for `https://{listen}` and
/// starts the operator there as its ServiceAccount (leader identity
/// `identity`, `extra` flags, its log in `dir`); waits until it is ready
/// and has written the configuration's caBundle, and a second more for the
/// apiserver to see it.
pub async fn start_operator(
    plane: &ControlPlane,
    admin: &kube::Client,
    identity: &str,
    listen: &str,
    extra: &[String],
    dir: &Path,
) -> anyhow::Result<Operator> {
    let url = format!("https://{listen}");
    // The administrator's configuration (the chart's, at a URL): the
    // operator only writes its caBundle.
    plane
        .apply_object(
            &quota_configuration(&Endpoint::Url(url.clone()), SYSTEM, None),
            false,
        )
        .await?;
    let metrics_port = free_port()?;
    let kubeconfig = plane.kubeconfig_for_service_account(SYSTEM, "gkm-operator")?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gkm-operator"));
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--leader-elect")
        .arg(format!("--leader-identity={identity}"))
        .arg(format!("--metrics-addr=127.0.0.1:{metrics_port}"))
        .arg(format!("--webhook-listen={listen}"))
        .arg(format!("--webhook-url={url}"))
        .args(extra)
        .env("GKM_LOG", "info");
    let mut process = Process::spawn("operator", cmd, &dir.join("operator.log"))?;
    let configs = Api::<ValidatingWebhookConfiguration>::all(admin.clone());
    let waited = gkm_testenv::eventually(
        "the operator ready with the quota webhook's caBundle written",
        Duration::from_secs(30),
        || {
            let running = process.check_running();
            let configs = &configs;
            async move {
                running?;
                let ready = http_get(metrics_port, "/readyz")
                    .await
                    .is_some_and(|(s, _)| s == 200);
                let bundle = configs
                    .get_opt(QUOTA_CONFIGURATION_NAME)
                    .await?
                    .and_then(|c| c.webhooks?.into_iter().next())
                    .and_then(|w| w.client_config.ca_bundle);
                Ok(bundle.filter(|_| ready))
            }
        },
    )
    .await;
    let ca_bundle = match waited {
        Ok(bundle) => bundle.0,
        Err(e) => anyhow::bail!("{e}; log:\n{}", process.log_tail(30)),
    };
    // The apiserver's own view of webhook configurations follows a watch.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(Operator {
        process,
        metrics_port,
        ca_bundle,
    })
}
