//! Manifest reads from a registry that stop at [`MAX_DOCUMENT_SIZE`] bytes.
//!
//! oci-client reads a manifest response whole before it returns it, so a
//! registry (or anything answering in its name) that sends an endless body
//! would make gkm allocate without bound before any size check could run.
//! Here oci-client still does the credential exchange, so every registry it
//! can talk to works the same, and the GET itself is made with the same
//! timeouts, read chunk by chunk, and abandoned as soon as the body outgrows
//! the cap (or declares a larger `Content-Length`).

use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};
use tokio::sync::Mutex;

use crate::error::{Error, Result};
use crate::labels::MANIFEST_TYPES;
use crate::repo::{CONNECT_TIMEOUT, MAX_DOCUMENT_SIZE, READ_TIMEOUT, read_at_most};

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

/// Capped manifest GETs for one registry repository.
pub(crate) struct ManifestGetter {
    http: reqwest::Client,
    scheme: &'static str,
    /// The credential of the last exchange, reused until the registry
    /// answers 401; `None` until the first exchange.
    credential: Mutex<Option<Credential>>,
}

impl ManifestGetter {
    /// A getter speaking plain HTTP when `insecure`, HTTPS otherwise.
    pub(crate) fn new(insecure: bool) -> Result<ManifestGetter> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| Error::Task(format!("cannot set up the registry client: {e}")))?;
        Ok(ManifestGetter {
            http,
            scheme: if insecure { "http" } else { "https" },
            credential: Mutex::new(None),
        })
    }

    /// GET the manifest `reference` names (its digest if it has one, else its
    /// tag), with the credentials `client` obtains for `auth`. Registry errors
    /// go through `registry_err`; a body over [`MAX_DOCUMENT_SIZE`] is an
    /// error of its own, raised before more than the cap is held in memory.
    pub(crate) async fn get(
        &self,
        client: &oci_client::Client,
        reference: &Reference,
        auth: &RegistryAuth,
        registry_err: impl Fn(OciDistributionError) -> Error,
    ) -> Result<FetchedManifest> {
        let url = manifest_url(self.scheme, reference);
        let mut response = self
            .send(&url, self.credential(client, reference, auth, false).await)
            .await;
        if matches!(&response, Ok(r) if r.status() == reqwest::StatusCode::UNAUTHORIZED) {
            // A cached token may have expired: exchange again, once.
            response = self
                .send(&url, self.credential(client, reference, auth, true).await)
                .await;
        }
        let response = response.map_err(&registry_err)?;
        let status = response.status();
        if !status.is_success() {
            return Err(registry_err(status_error(status, &url, response).await));
        }
        let claimed_digest = response
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bytes = read_capped(response)
            .await
            .map_err(|e| e.into_error(&registry_err))?;
        Ok(FetchedManifest {
            bytes,
            claimed_digest,
        })
    }

    async fn send(
        &self,
        url: &str,
        credential: std::result::Result<Credential, OciDistributionError>,
    ) -> std::result::Result<reqwest::Response, OciDistributionError> {
        let request = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, MANIFEST_TYPES.join(", "));
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
        client: &oci_client::Client,
        reference: &Reference,
        auth: &RegistryAuth,
        refresh: bool,
    ) -> std::result::Result<Credential, OciDistributionError> {
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
        let token = client
            .auth(reference, auth, RegistryOperation::Pull)
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

/// `<scheme>://<registry>/v2/<repository>/manifests/<digest or tag>`.
fn manifest_url(scheme: &str, reference: &Reference) -> String {
    format!(
        "{scheme}://{registry}/v2/{repository}/manifests/{selector}",
        registry = reference.resolve_registry(),
        repository = reference.repository(),
        selector = reference
            .digest()
            .or_else(|| reference.tag())
            .unwrap_or("latest"),
    )
}

/// The error for a non-success answer, with the start of its body.
async fn status_error(
    status: reqwest::StatusCode,
    url: &str,
    response: reqwest::Response,
) -> OciDistributionError {
    match status {
        reqwest::StatusCode::NOT_FOUND => OciDistributionError::ImageManifestNotFoundError(
            format!("{url} answered 404 Not Found"),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_urls_use_digest_before_tag() {
        let tagged: Reference = "registry.example:5000/team/cache:v1".parse().unwrap();
        assert_eq!(
            manifest_url("https", &tagged),
            "https://registry.example:5000/v2/team/cache/manifests/v1"
        );
        let pinned: Reference = format!("registry.example/team/cache:v1@sha256:{}", "a".repeat(64))
            .parse()
            .unwrap();
        assert_eq!(
            manifest_url("http", &pinned),
            format!(
                "http://registry.example/v2/team/cache/manifests/sha256:{}",
                "a".repeat(64)
            )
        );
    }

    #[test]
    fn docker_hub_names_resolve_to_its_registry_host() {
        let hub: Reference = "ubuntu".parse().unwrap();
        assert_eq!(
            manifest_url("https", &hub),
            "https://index.docker.io/v2/library/ubuntu/manifests/latest"
        );
    }
}
