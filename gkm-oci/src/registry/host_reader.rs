//! Reads from one registry host (the registry itself, or a mirror): capped
//! manifest GETs and streamed blob GETs, at the URLs [`Host`] builds.
//!
//! oci-client reads a manifest response whole before it returns it, so a
//! registry (or anything answering in its name) that sends an endless body
//! would make gkm allocate without bound before any size check could run;
//! and it builds every URL itself, with no room for a mirror's path or the
//! `ns` parameter mirrors use. Here oci-client still does the credential
//! exchange, so every registry it can talk to works the same, and the GETs
//! themselves are made with the same timeouts, a manifest read chunk by
//! chunk and abandoned as soon as the body outgrows the cap (or declares a
//! larger `Content-Length`).

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};
use tokio::sync::Mutex;

use crate::error::{Error, Result};
use crate::registry::media_types::MANIFEST_TYPES;
use crate::registry::mirrors::{Host, Role};
use crate::registry::request::{
    CONNECT_TIMEOUT, MAX_DOCUMENT_SIZE, READ_TIMEOUT, read_at_most, registry_error,
};
use gkm_core::digest::Digest;

/// How much of an error response's body is kept for the error message.
const ERROR_BODY_LIMIT: usize = 4 << 10;

/// What to send in `Authorization`, as learnt from the registry.
#[derive(Clone)]
enum Credential {
    None,
    Bearer(String),
    Basic(String, String),
}

/// A manifest response body and the digest the registry claims for it.
pub(crate) struct FetchedManifest {
    /// The body, at most [`MAX_DOCUMENT_SIZE`] bytes.
    pub bytes: Vec<u8>,
    /// The `Docker-Content-Digest` header, when the registry sent one.
    pub claimed_digest: Option<String>,
}

/// Reads of one repository from one host.
pub(crate) struct HostReader {
    /// Where, and what it may be asked for.
    pub host: Host,
    /// What errors name: the image, and the mirror it was asked of.
    pub label: String,
    http: reqwest::Client,
    /// Does the credential exchange.
    client: Arc<oci_client::Client>,
    /// The image as this host's credential exchange sees it.
    reference: Reference,
    auth: RegistryAuth,
    /// The credential of the last exchange, reused until the host answers
    /// 401; `None` until the first exchange.
    credential: Mutex<Option<Credential>>,
}

/// An oci-client client for `host`'s credential exchange (and, for the
/// registry itself, writes).
pub(crate) fn oci_client_for(host: &Host) -> oci_client::Client {
    oci_client::Client::new(ClientConfig {
        protocol: if host.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        accept_invalid_certificates: host.skip_verify,
        connect_timeout: Some(host.dial_timeout.unwrap_or(CONNECT_TIMEOUT)),
        read_timeout: Some(READ_TIMEOUT),
        ..Default::default()
    })
}

impl HostReader {
    /// A reader of `image`'s repository from `host`, exchanging `auth`
    /// through `client` when the host asks for credentials.
    pub(crate) fn new(
        host: Host,
        image: &Reference,
        client: Arc<oci_client::Client>,
        auth: RegistryAuth,
    ) -> Result<HostReader> {
        let http = reqwest::Client::builder()
            .connect_timeout(host.dial_timeout.unwrap_or(CONNECT_TIMEOUT))
            .read_timeout(READ_TIMEOUT)
            .danger_accept_invalid_certs(host.skip_verify)
            .build()
            .map_err(|e| Error::Task(format!("cannot set up the registry client: {e}")))?;
        let whole = image.whole();
        let (reference, label) = match host.role {
            Role::Server if host.authority == image.resolve_registry() => (image.clone(), whole),
            _ => (
                Reference::with_tag(
                    host.authority.clone(),
                    image.repository().to_string(),
                    "latest".into(),
                ),
                format!("{whole} from {host}"),
            ),
        };
        Ok(HostReader {
            host,
            label,
            http,
            client,
            reference,
            auth,
            credential: Mutex::new(None),
        })
    }

    /// GET the manifest `selector` (a tag or a digest) names. A body over
    /// [`MAX_DOCUMENT_SIZE`] is an error of its own, raised before more
    /// than the cap is held in memory.
    pub(crate) async fn manifest(&self, selector: &str) -> Result<FetchedManifest> {
        let url = self
            .host
            .manifest_url(self.reference.repository(), selector);
        let response = self.get(&url, true, "manifest").await?;
        let claimed_digest = response
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = read_capped(response)
            .await
            .map_err(|e| e.into_error(|e| registry_error(&self.label, e)))?;
        Ok(FetchedManifest {
            bytes,
            claimed_digest,
        })
    }

    /// GET the blob `digest` as a stream of chunks; the caller checks the
    /// digest.
    pub(crate) async fn blob(
        &self,
        digest: &Digest,
    ) -> Result<BoxStream<'static, io::Result<Bytes>>> {
        let url = self.host.blob_url(self.reference.repository(), digest);
        let response = self.get(&url, false, &format!("blob {digest}")).await?;
        Ok(response.bytes_stream().map_err(io::Error::other).boxed())
    }

    /// A successful answer to a GET of `url`, with the credentials the
    /// host asks for; `what` names the content in a not-found error.
    async fn get(&self, url: &str, manifest: bool, what: &str) -> Result<reqwest::Response> {
        let mut response = self.send(url, manifest, self.credential(false).await).await;
        if matches!(&response, Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED) {
            // A cached token may have expired: exchange again, once.
            response = self.send(url, manifest, self.credential(true).await).await;
        }
        let response = response.map_err(|e| registry_error(&self.label, e))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(Error::NotFound {
                what: what.to_string(),
                location: self.label.clone(),
            });
        }
        if !status.is_success() {
            return Err(registry_error(
                &self.label,
                status_error(status, url, response).await,
            ));
        }
        Ok(response)
    }

    async fn send(
        &self,
        url: &str,
        manifest: bool,
        credential: std::result::Result<Credential, OciDistributionError>,
    ) -> std::result::Result<reqwest::Response, OciDistributionError> {
        let mut request = self.http.get(url);
        if manifest {
            request = request.header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "));
        }
        let request = match credential? {
            Credential::None => request,
            Credential::Bearer(token) => request.bearer_auth(token),
            Credential::Basic(user, password) => request.basic_auth(user, Some(password)),
        };
        Ok(request.send().await?)
    }

    /// The credential to send: the cached one unless `refresh`, none at
    /// first for an anonymous read, else a new exchange through oci-client
    /// (which handles the registry's challenge).
    async fn credential(
        &self,
        refresh: bool,
    ) -> std::result::Result<Credential, OciDistributionError> {
        let auth = &self.auth;
        let mut cached = self.credential.lock().await;
        if let (false, Some(credential)) = (refresh, cached.as_ref()) {
            return Ok(credential.clone());
        }
        // Anonymous reads first try without an exchange, which would cost
        // a `/v2/` request of its own: a registry that wants a token
        // answers 401, and the exchange follows then. Credentials are
        // never sent before the registry has asked for them.
        if !refresh && matches!(auth, RegistryAuth::Anonymous) {
            *cached = Some(Credential::None);
            return Ok(Credential::None);
        }
        let token = self
            .client
            .auth(&self.reference, auth, RegistryOperation::Pull)
            .await?;
        let credential = match (token, auth) {
            (Some(token), _) => Credential::Bearer(token),
            (None, RegistryAuth::Basic(user, password)) => {
                Credential::Basic(user.clone(), password.clone())
            }
            (None, RegistryAuth::Bearer(token)) => Credential::Bearer(token.clone()),
            (None, RegistryAuth::Anonymous) => Credential::None,
        };
        *cached = Some(credential.clone());
        Ok(credential)
    }
}

/// The error for a non-success answer, with the start of its body.
async fn status_error(
    status: reqwest::StatusCode,
    url: &str,
    response: reqwest::Response,
) -> OciDistributionError {
    match status {
        reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN => {
            OciDistributionError::UnauthorizedError {
                url: url.to_string(),
            }
        }
        _ => {
            let message = match read_at_most(response.bytes_stream(), ERROR_BODY_LIMIT).await {
                Ok(body) => String::from_utf8_lossy(&body).into_owned(),
                Err(e) => format!("(body unreadable: {e})"),
            };
            OciDistributionError::ServerError {
                code: status.as_u16(),
                url: url.to_string(),
                message,
            }
        }
    }
}

/// Why reading a manifest body stopped.
enum ReadError {
    Transport(reqwest::Error),
    TooLarge(String),
}

impl ReadError {
    fn into_error(self, registry_err: impl Fn(OciDistributionError) -> Error) -> Error {
        match self {
            ReadError::Transport(e) => registry_err(e.into()),
            ReadError::TooLarge(why) => Error::format("manifest", why),
        }
    }
}

/// The body, refused once it declares or reaches more than the cap.
async fn read_capped(response: reqwest::Response) -> std::result::Result<Vec<u8>, ReadError> {
    if let Some(declared) = response.content_length()
        && declared > MAX_DOCUMENT_SIZE as u64
    {
        return Err(ReadError::TooLarge(format!(
            "the registry declares {declared} bytes, more than the 4 MiB a manifest may have"
        )));
    }
    let body = read_at_most(response.bytes_stream(), MAX_DOCUMENT_SIZE + 1)
        .await
        .map_err(ReadError::Transport)?;
    if body.len() > MAX_DOCUMENT_SIZE {
        return Err(ReadError::TooLarge(
            "larger than 4 MiB (reading stopped there)".into(),
        ));
    }
    Ok(body)
}
