//! The operator's admission webhooks, each with its decision (pure) and its
//! server and configuration together, on one HTTPS server with one
//! certificate:
//!
//! - `pvc_mutation` ([`configuration`]): the `gkm.io/pvc-mutation` pod webhook for
//!   ReadWriteOnce caches: a labelled pod whose claim names the cache is
//!   pointed at the claim of its node;
//! - `image_volume`: the `image-volume.gkm.io` pod webhook;
//! - [`quota`]: the `gpu-quota.gkm.io` validating webhook.
//!
//! What they share: the AdmissionReview envelope (`review`), one dispatch
//! (`routes`: each webhook an `AdmissionHook`, `hook`, in one route table), the
//! certificates ([`certs`], [`shared_ca`]) and how the apiserver reaches
//! them ([`Endpoint`]).
//!
//! Without cert-manager every replica serves a certificate signed by one CA
//! they share through a Secret ([`shared_ca`]: created once, rotated in the
//! last third of its life, the replaced CA trusted until it expires), and
//! keeps the MutatingWebhookConfiguration's `caBundle` to that Secret's
//! bundle. With cert-manager, the operator serves the certificate files it
//! mounts and leaves `caBundle` to cert-manager's CA injector.
//!
//! Who owns the configuration follows from how the apiserver reaches the
//! webhook: behind a Service ([`Endpoint::Service`], the chart's way) the
//! chart renders the configuration along with the Service, so disabling
//! the webhook or uninstalling removes both, and the operator only writes
//! `caBundle` into it, never creating it; at a URL ([`Endpoint::Url`], an
//! operator outside a chart) the operator creates it when it is missing.
//!
//! The same server answers the `image-volume.gkm.io` pod webhook
//! (`image_volume`), whose configuration is owned the same way.
//!
//! The same server answers the GPU-quota webhooks ([`quota`]) at their own
//! paths, with the same certificate: their ValidatingWebhookConfiguration is
//! always someone else's (the chart's, or an administrator's at a URL), and
//! the operator keeps only its `caBundle` to the same bundle.
//!
//! Who may ask, and what asking may cost: with
//! [`WebhookOptions::client_ca`] only a client presenting a certificate
//! that CA signed (the apiserver, from its admission configuration)
//! completes the TLS handshake, since the answers describe whatever
//! namespace a request names. Every path caps its body before decoding it
//! ([`POD_REVIEW_MAX_BYTES`], [`BINDING_REVIEW_MAX_BYTES`]), decodes it into
//! the review of its object type, and a replica answers at most
//! [`MAX_REVIEWS_IN_FLIGHT`] at once. A body must arrive within
//! [`REVIEW_BODY_READ_TIMEOUT`], and one being read holds no permit, only
//! the bytes it sent (bounded together): holding connections open slowly
//! starves no review the apiserver sends. The claim-read-only webhook, the
//! one that fails open, has a ValidatingAdmissionPolicy behind it
//! (`gkm-claim-read-only`) that the apiserver evaluates itself.

pub mod certs;
mod endpoint;
mod hook;
mod image_volume;
pub(crate) mod pvc_mutation;
pub mod quota;
mod review;
mod routes;
pub mod shared_ca;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use tracing::{info, warn};

pub use endpoint::{BadEndpoint, Endpoint};
pub use hook::{BINDING_REVIEW_MAX_BYTES, POD_REVIEW_MAX_BYTES};
pub use pvc_mutation::{CONFIGURATION_NAME, MUTATE_PATH, configuration};

use gkm_k8s_runtime::endpoints::Endpoints;
use gkm_k8s_runtime::readiness::Readiness;
use gkm_k8s_runtime::server::{EndpointServer, TlsError};
use routes::AdmissionRoutes;
pub use routes::{MAX_REVIEWS_IN_FLIGHT, REVIEW_BODY_READ_TIMEOUT};

/// How the operator serves the webhook.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// Where to listen (HTTPS).
    pub listen: SocketAddr,
    /// How the apiserver reaches it.
    pub endpoint: Endpoint,
    /// The names and addresses its certificate is for.
    pub hosts: Vec<String>,
    /// How long an issued CA is valid (whole days).
    pub validity: Duration,
    /// A certificate and key to serve instead (cert-manager's `tls.crt`
    /// and `tls.key`); the CA bundle is then cert-manager's to inject.
    pub cert_files: Option<(PathBuf, PathBuf)>,
    /// The operator's namespace, where the shared CA's Secret lives.
    pub namespace: String,
    /// How often each replica reads the shared CA again (rotating it when
    /// due and publishing its bundle); a new CA is in the bundle this long
    /// before any running replica serves a certificate it signed.
    pub check_interval: Duration,
    /// How the GPU-quota webhook reads pods and nodes.
    pub quota: quota::QuotaOptions,
    /// A PEM file of the CA that signed the apiserver's webhook client
    /// certificate (its admission configuration's `kubeConfigFile`): with
    /// it, only clients presenting a certificate it signed complete the TLS
    /// handshake, so nothing but the apiserver can ask the webhooks about
    /// a namespace. Without it, any client that reaches the port may.
    pub client_ca: Option<PathBuf>,
}

/// [`WebhookOptions`] the webhook cannot run with, naming the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidWebhook {
    /// `validity` is shorter than a day.
    #[error("must be at least {min:?}, not {got:?} (the certificate validity)")]
    Validity {
        /// The shortest allowed.
        min: Duration,
        /// What was given.
        got: Duration,
    },
    /// `check_interval` is outside what the webhook accepts.
    #[error("must be from {min:?} to {max:?}, not {got:?} (the CA check interval)")]
    CheckInterval {
        /// The shortest allowed.
        min: Duration,
        /// The longest allowed.
        max: Duration,
        /// What was given.
        got: Duration,
    },
}

impl WebhookOptions {
    /// The shortest CA validity: the CA is issued in whole days.
    pub const MIN_VALIDITY: Duration = Duration::from_secs(86_400);
    /// The shortest interval between reads of the shared CA.
    pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);
    /// The longest interval between reads of the shared CA.
    pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(86_400);

    /// Checks what [`Webhook::start`] relies on; the binary's flags go
    /// through this too.
    pub fn validate(&self) -> Result<(), InvalidWebhook> {
        if self.validity < Self::MIN_VALIDITY {
            return Err(InvalidWebhook::Validity {
                min: Self::MIN_VALIDITY,
                got: self.validity,
            });
        }
        let (min, max) = (Self::MIN_CHECK_INTERVAL, Self::MAX_CHECK_INTERVAL);
        if !(min..=max).contains(&self.check_interval) {
            return Err(InvalidWebhook::CheckInterval {
                min,
                max,
                got: self.check_interval,
            });
        }
        Ok(())
    }
}

/// The running webhook.
pub struct Webhook {
    server: EndpointServer,
    rotation: Option<tokio::task::JoinHandle<()>>,
    enforcement: tokio::task::JoinHandle<()>,
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
    /// The `MutatingWebhookConfiguration` could not be written.
    #[error("writing the caBundle of MutatingWebhookConfiguration {CONFIGURATION_NAME}: {0}")]
    Configuration(#[source] kube::Error),
    /// The image-volume webhook's `MutatingWebhookConfiguration` could not be written.
    #[error(
        "writing the caBundle of MutatingWebhookConfiguration {name}: {0}",
        name = image_volume::IMAGE_VOLUME_CONFIGURATION_NAME
    )]
    ImageVolumeConfiguration(#[source] kube::Error),
    /// The quota webhook's `ValidatingWebhookConfiguration` could not be written.
    #[error(
        "writing the caBundle of ValidatingWebhookConfiguration {name}: {0}",
        name = quota::QUOTA_CONFIGURATION_NAME
    )]
    QuotaConfiguration(#[source] kube::Error),
    /// The shared CA's Secret could not be read or written.
    #[error(
        "the webhook CA Secret {namespace}/{}: {source}",
        shared_ca::SECRET_NAME
    )]
    Secret {
        /// Its namespace.
        namespace: String,
        /// Why.
        source: kube::Error,
    },
    /// The shared CA's Secret holds something else.
    #[error("in namespace {namespace}: {source}")]
    BadSecret {
        /// Its namespace.
        namespace: String,
        /// What is wrong.
        source: shared_ca::BadSecret,
    },
    /// The options do not [validate](WebhookOptions::validate).
    #[error(transparent)]
    Invalid(#[from] InvalidWebhook),
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
    /// Joins the shared CA (creating it when this is the first replica),
    /// publishes its bundle and starts serving.
    pub async fn start(client: Client, options: WebhookOptions) -> Result<Webhook, WebhookError> {
        options.validate()?;
        let client_ca = match &options.client_ca {
            Some(path) => Some(std::fs::read(path).map_err(|source| WebhookError::Read {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        let (cert, shared) = match &options.cert_files {
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
                let store = CaStore::new(&client, &options);
                let shared = store.current().await?;
                publish_bundle(&client, &options, &shared.bundle(Timestamp::now())).await?;
                let leaf = certs::issue_leaf(&shared.signing, &options.hosts)?;
                let cert = certs::RotatingCert::new(&leaf.cert_pem, &leaf.key_pem)?;
                (cert, Some((store, shared)))
            }
        };
        let endpoints = Endpoints::new(Registry::default(), Readiness::default()).with_routes(
            Arc::new(AdmissionRoutes::new(client.clone(), options.quota.clone())),
        );
        let server = EndpointServer::start_endpoints(
            options.listen,
            endpoints,
            Some(cert.acceptor(client_ca.as_deref())?),
        )
        .await
        .map_err(|source| WebhookError::Listen {
            addr: options.listen,
            source,
        })?;
        info!(listen = %options.listen, endpoint = ?options.endpoint,
              client_certificates = if client_ca.is_some() { "required" } else { "not asked for" },
              "serving the pvc-mutation, image-volume and GPU-quota webhooks");
        // Each GKMGPUQuota says whether these webhooks judge its namespace.
        let enforcement = tokio::spawn(quota::enforcement::keep(
            client.clone(),
            options.namespace.clone(),
            options.check_interval,
        ));
        let rotation = shared.map(|(store, shared)| {
            tokio::spawn(keep_current(client, options.clone(), store, cert, shared))
        });
        Ok(Webhook {
            server,
            rotation,
            enforcement,
        })
    }

    /// Stops serving.
    pub async fn stop(self) {
        if let Some(task) = self.rotation {
            task.abort();
        }
        self.enforcement.abort();
        if let Err(e) = self.server.stop().await {
            warn!(error = %e, "stopping the webhook server");
        }
    }
}

/// The shared CA's Secret.
struct CaStore {
    api: Api<Secret>,
    configurations: Api<MutatingWebhookConfiguration>,
    namespace: String,
    validity: Duration,
}

impl CaStore {
    fn new(client: &Client, options: &WebhookOptions) -> CaStore {
        CaStore {
            api: Api::namespaced(client.clone(), &options.namespace),
            configurations: Api::all(client.clone()),
            namespace: options.namespace.clone(),
            validity: options.validity,
        }
    }

    /// The Secret's owner: the webhook configuration the chart installs, so
    /// that uninstalling the chart (or disabling the webhook) removes the CA
    /// with it. None while there is no configuration (an operator reached at
    /// a URL creates its own after the CA).
    async fn owner(&self) -> Result<Option<Vec<OwnerReference>>, WebhookError> {
        let configuration = self
            .configurations
            .get_opt(CONFIGURATION_NAME)
            .await
            .map_err(WebhookError::Configuration)?;
        Ok(configuration.and_then(|c| {
            Some(vec![OwnerReference {
                api_version: "admissionregistration.k8s.io/v1".into(),
                kind: "MutatingWebhookConfiguration".into(),
                name: CONFIGURATION_NAME.into(),
                uid: c.metadata.uid?,
                ..OwnerReference::default()
            }])
        }))
    }

    fn secret_err(&self, source: kube::Error) -> WebhookError {
        WebhookError::Secret {
            namespace: self.namespace.clone(),
            source,
        }
    }

    fn parse(&self, secret: &Secret) -> Result<shared_ca::SharedCa, WebhookError> {
        let data = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        shared_ca::SharedCa::from_data(&data).map_err(|source| WebhookError::BadSecret {
            namespace: self.namespace.clone(),
            source,
        })
    }

    fn secret(
        &self,
        shared: &shared_ca::SharedCa,
        resource_version: Option<String>,
        owner_references: Option<Vec<OwnerReference>>,
    ) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(shared_ca::SECRET_NAME.into()),
                namespace: Some(self.namespace.clone()),
                resource_version,
                owner_references,
                labels: Some(
                    [
                        ("app.kubernetes.io/name", "gkm-operator"),
                        ("app.kubernetes.io/part-of", "gkm"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: Some(
                shared
                    .to_data()
                    .into_iter()
                    .map(|(k, v)| (k, ByteString(v.into_bytes())))
                    .collect(),
            ),
            type_: Some("Opaque".into()),
            ..Secret::default()
        }
    }

    /// The shared CA, created when there is none (the first writer wins:
    /// a replica that loses the race reads the winner's) and rotated when
    /// due (one rotation wins: the update is conditional on the version read).
    async fn current(&self) -> Result<shared_ca::SharedCa, WebhookError> {
        loop {
            let Some(secret) = self
                .api
                .get_opt(shared_ca::SECRET_NAME)
                .await
                .map_err(|e| self.secret_err(e))?
            else {
                let first =
                    shared_ca::SharedCa::new(certs::issue_ca(self.validity)?, Timestamp::now());
                match self
                    .api
                    .create(
                        &PostParams::default(),
                        &self.secret(&first, None, self.owner().await?),
                    )
                    .await
                {
                    Ok(_) => {
                        info!(not_after = %first.signing.not_after, "issued the shared webhook CA");
                        return Ok(first);
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(self.secret_err(e)),
                }
            };
            let shared = self.parse(&secret)?;
            let now = Timestamp::now();
            if !shared.due(now, self.validity) {
                return Ok(shared);
            }
            let next = shared.rotated(certs::issue_ca(self.validity)?, now);
            let version = secret.metadata.resource_version.clone();
            match self
                .api
                .replace(
                    shared_ca::SECRET_NAME,
                    &PostParams::default(),
                    &self.secret(&next, version, secret.metadata.owner_references.clone()),
                )
                .await
            {
                Ok(_) => {
                    info!(not_after = %next.signing.not_after, "rotated the shared webhook CA");
                    return Ok(next);
                }
                // Another replica rotated (or it was deleted) meanwhile: read again.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
                Err(e) => return Err(self.secret_err(e)),
            }
        }
    }
}

/// Writes `bundle` into the `caBundle` of both webhooks' configurations;
/// see [`publish_mutation_bundle`] and [`publish_quota_bundle`].
async fn publish_bundle(
    client: &Client,
    options: &WebhookOptions,
    bundle: &str,
) -> Result<(), WebhookError> {
    publish_mutation_bundle(client, options, bundle, &PVC_MUTATION)
        .await
        .map_err(WebhookError::Configuration)?;
    publish_mutation_bundle(client, options, bundle, &IMAGE_VOLUME)
        .await
        .map_err(WebhookError::ImageVolumeConfiguration)?;
    publish_quota_bundle(client, bundle).await
}

/// Writes `bundle` into the quota webhook's `caBundle` (a strategic merge
/// of that field only). The configuration is never the operator's to
/// create: a missing one (the webhook disabled, gkm being uninstalled, an
/// operator outside the chart whose administrator has not made it) is
/// left missing.
async fn publish_quota_bundle(client: &Client, bundle: &str) -> Result<(), WebhookError> {
    let api = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    let patch = serde_json::json!({"webhooks": [
        {"name": quota::QUOTA_WEBHOOK_NAME, "clientConfig": {"caBundle": encoded}},
        {"name": quota::QUOTA_BINDING_WEBHOOK_NAME, "clientConfig": {"caBundle": encoded}},
    ]});
    let params = PatchParams {
        field_manager: Some(crate::names::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch(
            quota::QUOTA_CONFIGURATION_NAME,
            &params,
            &Patch::Strategic(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            warn!(
                configuration = quota::QUOTA_CONFIGURATION_NAME,
                "no GPU-quota webhook configuration; nothing to write the CA into"
            );
            Ok(())
        }
        Err(e) => Err(WebhookError::QuotaConfiguration(e)),
    }
}

/// A MutatingWebhookConfiguration of the operator's: its name, its
/// webhooks' names and its whole body.
struct Mutating {
    name: &'static str,
    webhooks: &'static [&'static str],
    body: fn(&Endpoint, Option<&str>) -> serde_json::Value,
}

/// The `gkm.io/pvc-mutation` webhook's configuration.
const PVC_MUTATION: Mutating = Mutating {
    name: CONFIGURATION_NAME,
    webhooks: &[
        pvc_mutation::WEBHOOK_NAME,
        pvc_mutation::READ_ONLY_WEBHOOK_NAME,
    ],
    body: configuration,
};

/// The `image-volume.gkm.io` webhook's configuration.
const IMAGE_VOLUME: Mutating = Mutating {
    name: image_volume::IMAGE_VOLUME_CONFIGURATION_NAME,
    webhooks: &[image_volume::IMAGE_VOLUME_WEBHOOK_NAME],
    body: image_volume::configuration,
};

/// Writes `bundle` into the `caBundle` of `which`. Behind a Service
/// the configuration is the chart's: only `caBundle` is patched, and a
/// missing configuration (the webhook disabled, gkm being uninstalled) is
/// left missing. At a URL the operator applies the whole configuration.
async fn publish_mutation_bundle(
    client: &Client,
    options: &WebhookOptions,
    bundle: &str,
    which: &Mutating,
) -> Result<(), kube::Error> {
    let api = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let encoded = base64::engine::general_purpose::STANDARD.encode(bundle);
    // Strategic merge: each webhook is matched by name, so nothing but its
    // caBundle changes (and a configuration without it is refused, not
    // given a webhook of ours).
    let webhooks: Vec<_> = which
        .webhooks
        .iter()
        .map(|name| serde_json::json!({"name": name, "clientConfig": {"caBundle": encoded}}))
        .collect();
    let patch = serde_json::json!({ "webhooks": webhooks });
    let params = PatchParams {
        field_manager: Some(crate::names::FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    match api
        .patch(which.name, &params, &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => match &options.endpoint {
            Endpoint::Url(_) => api
                .patch(
                    which.name,
                    &PatchParams::apply(crate::names::FIELD_MANAGER).force(),
                    &Patch::Apply(&(which.body)(&options.endpoint, Some(bundle))),
                )
                .await
                .map(|_| ()),
            Endpoint::Service { .. } => {
                warn!(
                    configuration = which.name,
                    "no webhook configuration (the chart installs it with the webhook enabled); nothing to write the CA into"
                );
                Ok(())
            }
        },
        Err(e) => Err(e),
    }
}

/// Every check interval: reads the shared CA (rotating it when due),
/// publishes its bundle (which also puts right a configuration edited by
/// someone else), and moves the serving certificate to a new signing CA
/// once that CA has been in the bundle for a full interval.
async fn keep_current(
    client: Client,
    options: WebhookOptions,
    store: CaStore,
    cert: Arc<certs::RotatingCert>,
    mut serving: shared_ca::SharedCa,
) {
    loop {
        tokio::time::sleep(options.check_interval).await;
        let shared = match store.current().await {
            Ok(shared) => shared,
            Err(e) => {
                warn!(error = %e, "reading the shared webhook CA");
                continue;
            }
        };
        let now = Timestamp::now();
        if let Err(e) = publish_bundle(&client, &options, &shared.bundle(now)).await {
            warn!(error = %e, "keeping the webhook's CA bundle current");
            continue;
        }
        if shared.signing == serving.signing || !shared.may_move_to(now, options.check_interval) {
            continue;
        }
        let moved = certs::issue_leaf(&shared.signing, &options.hosts)
            .and_then(|leaf| cert.replace(&leaf.cert_pem, &leaf.key_pem));
        match moved {
            Ok(()) => {
                info!(not_after = %shared.signing.not_after, "serving a certificate of the new webhook CA");
                serving = shared;
            }
            Err(e) => warn!(error = %e, "serving a certificate of the new webhook CA"),
        }
    }
}

/// Asserts the chart's operator manifest registers `webhook` with the
/// `condition` the code sends pods under (whitespace aside).
#[cfg(test)]
pub(crate) fn assert_chart_sends(webhook: &str, condition: &str) {
    let chart = include_str!("../../../../deploy/helm/gkm/templates/manifests/operator.yaml");
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words(chart).contains(&words(condition)),
        "the chart's {webhook} matchConditions differ from {condition}"
    );
    assert!(chart.contains(webhook), "the chart has no {webhook}");
}
