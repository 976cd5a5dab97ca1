//! The `gkm.io/pvc-mutation` pod webhook the operator serves for
//! ReadWriteOnce caches: a labelled pod whose claim names the cache is
//! pointed at the claim of its node ([`crate::pvc::mutation`]).
//!
//! Without cert-manager the operator issues its own CA and serving
//! certificate, writes the CA into the MutatingWebhookConfiguration's
//! `caBundle`, and rotates both in the last third of their validity (the
//! bundle holds the old and the new CA while the serving certificate
//! changes, so no call fails across a rotation). With cert-manager, the
//! operator serves the certificate files it mounts and leaves `caBundle` to
//! cert-manager's CA injector.

pub mod certs;
pub mod config;
pub mod review;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

pub use config::{CONFIGURATION_NAME, Endpoint, MUTATE_PATH, configuration};

use gkm_k8s_runtime::endpoints::Endpoints;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::{EndpointServer, TlsError};

/// How the operator serves the webhook.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Where to listen (HTTPS).
    pub listen: SocketAddr,
    /// How the apiserver reaches it.
    pub endpoint: Endpoint,
    /// The names and addresses its certificate is for.
    pub hosts: Vec<String>,
    /// How long an issued certificate is valid (whole days).
    pub validity: Duration,
    /// A certificate and key to serve instead (cert-manager's `tls.crt`
    /// and `tls.key`); the CA bundle is then cert-manager's to inject.
    pub cert_files: Option<(PathBuf, PathBuf)>,
    /// A ClusterRole of the installation (the operator's own) to own the
    /// webhook configuration, so that uninstalling gkm (`helm uninstall`,
    /// `kubectl delete -f install.yaml`) removes the webhook with it instead
    /// of leaving a webhook nobody serves. `None`, or a ClusterRole that does
    /// not exist, leaves the configuration unowned.
    pub owner: Option<String>,
}

/// The running webhook.
pub struct Webhook {
    server: EndpointServer,
    rotation: Option<tokio::task::JoinHandle<()>>,
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// A certificate or key file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate or key cannot serve TLS.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The `MutatingWebhookConfiguration` could not be applied.
    #[error("applying MutatingWebhookConfiguration {CONFIGURATION_NAME}: {0}")]
    Configuration(#[source] kube::Error),
    /// The listen address could not be bound.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

impl Webhook {
    /// Applies the webhook configuration and starts serving.
    pub async fn start(client: Client, options: WebhookOptions) -> Result<Webhook, WebhookError> {
        let (cert, issued) = match &options.cert_files {
            Some((cert, key)) => {
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p).map_err(|source| WebhookError::Read {
                        path: p.clone(),
                        source,
                    })
                };
                (certs::RotatingCert::new(&read(cert)?, &read(key)?)?, None)
            }
            None => {
                let issued = certs::issue(&options.hosts, options.validity)?;
                let cert = certs::RotatingCert::new(&issued.cert_pem, &issued.key_pem)?;
                (cert, Some(issued))
            }
        };
        let bundle = issued.as_ref().map(|i| i.ca_pem.clone());
        apply_configuration(&client, &options, bundle.as_deref()).await?;
        let endpoints = Endpoints::new(Registry::default(), Readiness::default())
            .with_routes(Arc::new(review::MutationRoutes::new(client.clone())));
        let server =
            EndpointServer::start_endpoints(options.listen, endpoints, Some(cert.acceptor()?))
                .await
                .map_err(|source| WebhookError::Listen {
                    addr: options.listen,
                    source,
                })?;
        info!(listen = %options.listen, endpoint = ?options.endpoint, "serving the pvc-mutation webhook");
        let rotation =
            issued.map(|issued| tokio::spawn(rotate(client, options.clone(), cert, issued)));
        Ok(Webhook { server, rotation })
    }

    /// Stops serving.
    pub async fn stop(self) {
        if let Some(task) = self.rotation {
            task.abort();
        }
        if let Err(e) = self.server.stop().await {
            warn!(error = %e, "stopping the webhook server");
        }
    }
}

async fn apply_configuration(
    client: &Client,
    options: &WebhookOptions,
    bundle: Option<&str>,
) -> Result<(), WebhookError> {
    let mut body = configuration(&options.endpoint, bundle);
    if let Some(owner) = &options.owner {
        match Api::<ClusterRole>::all(client.clone()).get_opt(owner).await {
            Ok(Some(role)) => {
                body["metadata"]["ownerReferences"] = serde_json::json!([{
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRole",
                    "name": owner,
                    "uid": role.metadata.uid,
                }]);
            }
            Ok(None) => {
                warn!(clusterrole = %owner, "no such ClusterRole: the webhook configuration stays unowned")
            }
            Err(e) => {
                warn!(clusterrole = %owner, error = %e, "reading the owner ClusterRole; the webhook configuration stays unowned")
            }
        }
    }
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            CONFIGURATION_NAME,
            &PatchParams::apply(crate::pvc::FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map(|_| ())
        .map_err(WebhookError::Configuration)
}

/// Checks hourly (or sooner for short validities) and rotates when due:
/// first the bundle gains the new CA, then the new certificate is served,
/// and the old CA leaves the bundle at the next check.
async fn rotate(
    client: Client,
    options: WebhookOptions,
    cert: Arc<certs::RotatingCert>,
    mut current: certs::Issued,
) {
    let period = (options.validity / 24).clamp(Duration::from_secs(60), Duration::from_secs(3600));
    loop {
        tokio::time::sleep(period).await;
        // The bundle is rewritten at each check too, so a configuration
        // edited or recreated by someone else is put right.
        let due = certs::due(current.not_after, Timestamp::now(), options.validity);
        let next = if due {
            match certs::issue(&options.hosts, options.validity) {
                Ok(next) => Some(next),
                Err(e) => {
                    warn!(error = %e, "issuing the next webhook certificate");
                    None
                }
            }
        } else {
            None
        };
        let bundle = match &next {
            Some(next) => format!("{}{}", next.ca_pem, current.ca_pem),
            None => current.ca_pem.clone(),
        };
        if let Err(e) = apply_configuration(&client, &options, Some(&bundle)).await {
            warn!(error = %e, "keeping the webhook's CA bundle current");
            continue;
        }
        if let Some(next) = next {
            match cert.replace(&next.cert_pem, &next.key_pem) {
                Ok(()) => {
                    info!(not_after = %next.not_after, "rotated the webhook certificate");
                    current = next;
                }
                Err(e) => warn!(error = %e, "serving the rotated webhook certificate"),
            }
        }
    }
}
