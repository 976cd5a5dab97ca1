//! One place to read and write images, whether in a registry or an OCI
//! image layout directory.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};
use oci_spec::image::{Descriptor, MediaType};

use crate::error::{Error, Result};
use crate::registry::auth::Credentials;
use crate::registry::host_reader::{HostReader, oci_client_for};
use crate::registry::layout::Layout;
use crate::registry::media_types::{OCI_INDEX, OCI_MANIFEST};
use crate::registry::mirrors::{Host, HostsConfig, Need, Role};
use crate::registry::reference::{ImageRef, Selector};
pub use crate::registry::request::{CONNECT_TIMEOUT, MAX_DOCUMENT_SIZE, READ_TIMEOUT};
use crate::registry::request::{read_at_most, registry_error};
use gkm_core::digest::Digest;

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Speak plain HTTP instead of HTTPS.
    pub insecure: bool,
    /// Credentials. Those given explicitly are sent only to the registry an
    /// image names; a mirror gets its own entry of Docker's `config.json`,
    /// if any.
    pub credentials: Credentials,
    /// Mirrors to read through ([`crate::registry::mirrors`]): reads of content by
    /// digest try them first; writes always go to the registry itself.
    pub hosts: HostsConfig,
}

/// A manifest as stored: its exact bytes, digest and media type.
#[derive(Debug, Clone)]
pub struct RawManifest {
    /// The manifest digest (the image digest).
    pub digest: Digest,
    /// Its media type.
    pub media_type: String,
    /// Its exact bytes.
    pub bytes: Vec<u8>,
}

/// Where blob bytes come from.
pub enum BlobSource {
    /// A file on disk (a layout blob): read directly.
    File(PathBuf),
    /// A stream of chunks (a registry blob).
    Stream(BoxStream<'static, io::Result<Bytes>>),
}

impl BlobSource {
    /// The blob as a stream of chunks.
    pub async fn into_stream(self) -> Result<BoxStream<'static, io::Result<Bytes>>> {
        match self {
            BlobSource::Stream(s) => Ok(s),
            BlobSource::File(path) => {
                let file = tokio::fs::File::open(&path)
                    .await
                    .map_err(|e| Error::io(&path, e))?;
                Ok(file_stream(file))
            }
        }
    }
}

enum Backend {
    Registry {
        /// Writes, and the registry's own credential exchange.
        client: Arc<oci_client::Client>,
        reference: Reference,
        auth: RegistryAuth,
        /// Where reads go, mirrors first, the registry (or its `server`)
        /// last.
        hosts: Vec<HostReader>,
    },
    Layout {
        layout: Layout,
        selector: Selector,
    },
}

/// Which host a blob is read from, in the order [`Repo::open_blob_from`]
/// tries them.
#[derive(Debug, Clone)]
pub struct BlobHost {
    /// Its position among the hosts that may serve blobs: the next try
    /// starts after it.
    pub index: usize,
    /// What errors name (the image, and the mirror).
    pub label: String,
    /// Whether it is the last host: its failure is the pull's.
    pub last: bool,
}

/// An image location opened for reading or writing.
pub struct Repo {
    backend: Backend,
    image: ImageRef,
}

impl Repo {
    /// Open `image` for reading; a layout must exist.
    pub fn open(image: &ImageRef, options: &RegistryOptions) -> Result<Repo> {
        Repo::connect(image, options, false)
    }

    /// Open `image` for writing; a layout is created if missing.
    pub fn create(image: &ImageRef, options: &RegistryOptions) -> Result<Repo> {
        Repo::connect(image, options, true)
    }

    fn connect(image: &ImageRef, options: &RegistryOptions, create: bool) -> Result<Repo> {
        let backend = match image {
            ImageRef::Registry(reference) => {
                let origin = reference.resolve_registry();
                let auth = options.credentials.resolve(origin)?;
                let client = Arc::new(oci_client_for(&Host::origin(origin, options.insecure)));
                let hosts = options
                    .hosts
                    .hosts_for(reference.registry(), origin, options.insecure)?
                    .into_iter()
                    .map(|host| {
                        let (client, auth) = if host.role == Role::Server
                            && host.authority == origin
                            && host.plain_http == options.insecure
                        {
                            (client.clone(), auth.clone())
                        } else {
                            (
                                Arc::new(oci_client_for(&host)),
                                mirror_auth(&options.credentials, &host.authority)?,
                            )
                        };
                        HostReader::new(host, reference, client, auth)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Backend::Registry {
                    client,
                    reference: reference.clone(),
                    auth,
                    hosts,
                }
            }
            ImageRef::Layout { path, selector } => Backend::Layout {
                layout: if create {
                    Layout::create(path)?
                } else {
                    Layout::open(path)?
                },
                selector: selector.clone(),
            },
        };
        Ok(Repo {
            backend,
            image: image.clone(),
        })
    }

    /// The reference this repo was opened with.
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    fn registry_err(&self, e: oci_client::errors::OciDistributionError) -> Error {
        registry_error(&self.image, e)
    }

    /// The first answer of `read` from the hosts that may be asked for
    /// `need`, in order; a host that fails is logged and the next one
    /// tried, and the last one's failure is the result.
    async fn first_host<'a, T, F, Fut>(
        hosts: &'a [HostReader],
        need: Need,
        what: &str,
        read: F,
    ) -> Result<T>
    where
        F: Fn(&'a HostReader) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let able = able(hosts, need);
        let Some((last, before)) = able.split_last() else {
            return Err(no_host(hosts, need, what));
        };
        for host in before {
            match read(host).await {
                Ok(value) => return Ok(value),
                Err(e) => tracing::warn!(
                    host = %host.host, what, error = %e,
                    "a registry mirror failed; trying the next host"
                ),
            }
        }
        read(last).await
    }

    /// Fetch the manifest the reference selects (which may be an index).
    pub async fn fetch_manifest(&self) -> Result<RawManifest> {
        self.fetch_manifest_at(None).await
    }

    /// Fetch the manifest `digest` of this repository.
    pub async fn fetch_manifest_digest(&self, digest: &Digest) -> Result<RawManifest> {
        self.fetch_manifest_at(Some(digest)).await
    }

    async fn fetch_manifest_at(&self, digest: Option<&Digest>) -> Result<RawManifest> {
        let expected = digest.cloned().or_else(|| self.image.pinned_digest());
        let raw = match &self.backend {
            Backend::Registry {
                reference, hosts, ..
            } => {
                let pinned = digest.map(Digest::to_string);
                let (selector, need) = match pinned.as_deref().or(reference.digest()) {
                    Some(d) => (d, Need::Pull),
                    None => (reference.tag().unwrap_or("latest"), Need::Resolve),
                };
                let what = format!("manifest {selector}");
                Repo::first_host(hosts, need, &what, move |host| async move {
                    let raw = fetched_manifest(host, selector).await?;
                    // Bytes named by a digest are those bytes, whoever
                    // serves them: a host serving others is refused here,
                    // so the next one is tried.
                    if need == Need::Pull && raw.digest.as_str() != selector {
                        return Err(Error::DigestMismatch {
                            what: format!("manifest of {}", host.label),
                            expected: selector.to_string(),
                            actual: raw.digest.to_string(),
                        });
                    }
                    Ok(raw)
                })
                .await?
            }
            Backend::Layout { layout, selector } => {
                let selector = match digest {
                    Some(d) => Selector::Digest(d.clone()),
                    None => selector.clone(),
                };
                let desc = layout.resolve(&selector)?;
                let digest: Digest = desc.digest().to_string().parse()?;
                let bytes = layout.read_blob(&digest)?;
                let media_type =
                    media_type_of(&bytes).unwrap_or_else(|_| desc.media_type().to_string());
                RawManifest {
                    digest,
                    media_type,
                    bytes,
                }
            }
        };
        if let Some(expected) = expected
            && expected != raw.digest
        {
            return Err(Error::DigestMismatch {
                what: format!("manifest of {}", self.image),
                expected: expected.to_string(),
                actual: raw.digest.to_string(),
            });
        }
        Ok(raw)
    }

    /// Read a small blob (a config) whole, checking its digest and size.
    pub async fn fetch_small_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let bytes = match &self.backend {
            Backend::Layout { layout, .. } => layout.read_blob(digest)?,
            Backend::Registry { hosts, .. } => {
                let what = format!("blob {digest}");
                return Repo::first_host(hosts, Need::Pull, &what, move |host| async move {
                    let stream = host.blob(digest).await?;
                    let out = read_at_most(stream, MAX_DOCUMENT_SIZE + 1)
                        .await
                        .map_err(|e| Error::io(&host.label, e))?;
                    if out.len() > MAX_DOCUMENT_SIZE {
                        return Err(Error::format(
                            format!("blob {digest} of {}", host.label),
                            "larger than 4 MiB",
                        ));
                    }
                    verified(&out, digest, &host.label)?;
                    Ok(out)
                })
                .await;
            }
        };
        let actual = Digest::of(&bytes);
        if &actual != digest {
            return Err(Error::DigestMismatch {
                what: format!("blob of {}", self.image),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(bytes)
    }

    /// Open a blob for streaming, from the first host that answers. The
    /// caller checks the digest.
    pub async fn open_blob(&self, digest: &Digest) -> Result<BlobSource> {
        Ok(self.open_blob_from(digest, 0).await?.0)
    }

    /// Open a blob for streaming from the first host that answers among
    /// those that may serve blobs, starting at the `start`-th: a caller
    /// whose check of the bytes failed starts again after the host that
    /// served them ([`BlobHost::index`]), until [`BlobHost::last`]. The
    /// caller checks the digest.
    pub async fn open_blob_from(
        &self,
        digest: &Digest,
        start: usize,
    ) -> Result<(BlobSource, BlobHost)> {
        match &self.backend {
            Backend::Layout { layout, .. } => {
                let path = layout.blob_path(digest);
                if !path.is_file() {
                    return Err(Error::NotFound {
                        what: format!("blob {digest}"),
                        location: layout.root().display().to_string(),
                    });
                }
                let from = BlobHost {
                    index: 0,
                    label: self.image.to_string(),
                    last: true,
                };
                Ok((BlobSource::File(path), from))
            }
            Backend::Registry { hosts, .. } => {
                let able = able(hosts, Need::Pull);
                if able.len() <= start {
                    return Err(no_host(hosts, Need::Pull, &format!("blob {digest}")));
                }
                for (index, host) in able.iter().enumerate().skip(start) {
                    let last = index + 1 == able.len();
                    match host.blob(digest).await {
                        Ok(stream) => {
                            let from = BlobHost {
                                index,
                                label: host.label.clone(),
                                last,
                            };
                            return Ok((BlobSource::Stream(stream), from));
                        }
                        Err(e) if !last => tracing::warn!(
                            host = %host.host, %digest, error = %e,
                            "a registry mirror failed; trying the next host"
                        ),
                        Err(e) => return Err(e),
                    }
                }
                Err(no_host(hosts, Need::Pull, &format!("blob {digest}")))
            }
        }
    }

    /// Whether the repository already holds the blob.
    pub async fn has_blob(&self, digest: &Digest) -> Result<bool> {
        match &self.backend {
            Backend::Layout { layout, .. } => Ok(layout.has_blob(digest)),
            Backend::Registry {
                client,
                reference,
                auth,
                ..
            } => {
                client
                    .auth(reference, auth, RegistryOperation::Pull)
                    .await
                    .map_err(|e| self.registry_err(e))?;
                client
                    .blob_exists(reference, digest.as_str())
                    .await
                    .map_err(|e| self.registry_err(e))
            }
        }
    }

    /// Store a blob of `size` bytes named `digest` from `source`.
    pub async fn put_blob(&self, digest: &Digest, size: u64, source: BlobSource) -> Result<()> {
        match &self.backend {
            Backend::Layout { layout, .. } => {
                let layout = layout.clone();
                match source {
                    BlobSource::File(path) => {
                        let digest = digest.clone();
                        tokio::task::spawn_blocking(move || -> Result<()> {
                            let mut w = layout.blob_writer()?;
                            let mut f =
                                std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
                            std::io::copy(&mut f, &mut w).map_err(|e| Error::io(&path, e))?;
                            w.commit(Some(&digest)).map(|_| ())
                        })
                        .await?
                    }
                    BlobSource::Stream(mut stream) => {
                        let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(16);
                        let expected = digest.clone();
                        let writer = tokio::task::spawn_blocking(move || -> Result<()> {
                            use std::io::Write;
                            let mut w = layout.blob_writer()?;
                            for chunk in rx {
                                w.write_all(&chunk)
                                    .map_err(|e| Error::io(layout.root(), e))?;
                            }
                            w.commit(Some(&expected)).map(|_| ())
                        });
                        while let Some(chunk) = stream.next().await {
                            let chunk = chunk.map_err(|e| Error::io(self.image.to_string(), e))?;
                            if tx.send(chunk).is_err() {
                                break;
                            }
                        }
                        drop(tx);
                        writer.await?
                    }
                }
            }
            Backend::Registry {
                client,
                reference,
                auth,
                ..
            } => {
                client
                    .auth(reference, auth, RegistryOperation::Push)
                    .await
                    .map_err(|e| self.registry_err(e))?;
                let stream: BoxStream<'static, oci_client::errors::Result<Bytes>> = source
                    .into_stream()
                    .await?
                    .map(|r| r.map_err(Into::into))
                    .boxed();
                client
                    .push_blob_stream(reference, stream, digest.as_str(), Some(size))
                    .await
                    .map_err(|e| self.registry_err(e))?;
                Ok(())
            }
        }
    }

    /// Store a manifest and point the reference's tag at it (a layout
    /// reference by digest records no tag).
    pub async fn put_manifest(&self, manifest: &RawManifest) -> Result<()> {
        self.put_manifest_as(manifest, false).await
    }

    /// Store a manifest under its digest only, leaving the reference's tag
    /// where it is: a variant of a multi-target image, stored before the
    /// index that lists it.
    pub async fn put_manifest_by_digest(&self, manifest: &RawManifest) -> Result<()> {
        self.put_manifest_as(manifest, true).await
    }

    async fn put_manifest_as(&self, manifest: &RawManifest, by_digest: bool) -> Result<()> {
        match &self.backend {
            Backend::Layout { layout, selector } => {
                let layout = layout.clone();
                let manifest = manifest.clone();
                let selector = selector.clone();
                tokio::task::spawn_blocking(move || -> Result<()> {
                    let digest = layout.write_blob(&manifest.bytes)?;
                    if let (Selector::Tag(tag), false) = (selector, by_digest) {
                        let d: oci_spec::image::Digest = digest
                            .as_str()
                            .parse()
                            .map_err(|e| Error::format("digest", e))?;
                        let desc = Descriptor::new(
                            MediaType::from(manifest.media_type.as_str()),
                            manifest.bytes.len() as u64,
                            d,
                        );
                        layout.tag(&tag, &desc)?;
                    }
                    Ok(())
                })
                .await?
            }
            Backend::Registry {
                client,
                reference,
                auth,
                ..
            } => {
                client
                    .auth(reference, auth, RegistryOperation::Push)
                    .await
                    .map_err(|e| self.registry_err(e))?;
                let content_type = http::HeaderValue::from_str(&manifest.media_type)
                    .unwrap_or(http::HeaderValue::from_static(OCI_MANIFEST));
                let pinned;
                let target = if by_digest {
                    pinned = Reference::with_digest(
                        reference.registry().to_string(),
                        reference.repository().to_string(),
                        manifest.digest.to_string(),
                    );
                    &pinned
                } else {
                    reference
                };
                client
                    .push_manifest_raw(target, manifest.bytes.clone(), content_type)
                    .await
                    .map_err(|e| self.registry_err(e))?;
                Ok(())
            }
        }
    }
}

/// The credentials a mirror (or a `server` other than the registry) gets:
/// its own entry of Docker's `config.json`, never the credentials given
/// for the registry an image names.
fn mirror_auth(credentials: &Credentials, authority: &str) -> Result<RegistryAuth> {
    match credentials {
        Credentials::DockerConfig => credentials.resolve(authority),
        Credentials::Anonymous | Credentials::Basic { .. } => Ok(RegistryAuth::Anonymous),
    }
}

/// The hosts that may be asked for `need`, in the order to try them.
fn able(hosts: &[HostReader], need: Need) -> Vec<&HostReader> {
    hosts
        .iter()
        .filter(|h| h.host.capabilities.allows(need))
        .collect()
}

/// No host of the configuration may be asked for `need`.
fn no_host(hosts: &[HostReader], need: Need, what: &str) -> Error {
    let listed = hosts
        .iter()
        .map(|h| h.host.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let capability = match need {
        Need::Pull => "pull",
        Need::Resolve => "resolve",
    };
    Error::NotFound {
        what: what.to_string(),
        location: format!("any host with the {capability} capability (hosts: {listed})"),
    }
}

/// The manifest `selector` from `host`, its bytes checked against the
/// digest the host claims for them.
async fn fetched_manifest(host: &HostReader, selector: &str) -> Result<RawManifest> {
    let fetched = host.manifest(selector).await?;
    let bytes = fetched.bytes;
    let media_type = media_type_of(&bytes)?;
    let actual = Digest::of(&bytes);
    if let Some(claimed) = fetched.claimed_digest
        && let Ok(claimed) = claimed.parse::<Digest>()
        && claimed != actual
    {
        return Err(Error::DigestMismatch {
            what: format!("manifest of {}", host.label),
            expected: claimed.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(RawManifest {
        digest: actual,
        media_type,
        bytes,
    })
}

/// `bytes` when they hash to `digest`, else a mismatch naming `from`.
fn verified(bytes: &[u8], digest: &Digest, from: &str) -> Result<()> {
    let actual = Digest::of(bytes);
    if &actual != digest {
        return Err(Error::DigestMismatch {
            what: format!("blob of {from}"),
            expected: digest.to_string(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}

/// The `mediaType` a manifest declares, or what its shape says it is.
fn media_type_of(bytes: &[u8]) -> Result<String> {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default, rename = "mediaType")]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| Error::format("manifest", e))?;
    Ok(match probe.media_type {
        Some(m) => m,
        None if probe.manifests.is_some() => OCI_INDEX.to_string(),
        None => OCI_MANIFEST.to_string(),
    })
}

/// A file as a stream of 1 MiB chunks.
fn file_stream(file: tokio::fs::File) -> BoxStream<'static, io::Result<Bytes>> {
    use tokio::io::AsyncReadExt;
    futures::stream::unfold(Some(file), |state| async move {
        let mut file = state?;
        let mut buf = vec![0u8; 1 << 20];
        match file.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(file)))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

/// Runs the read `op` with `client`: an anonymous one first without an
/// exchange (which would cost a `/v2/` request of its own), as manifests are
/// read; a registry that wants a token answers 401, and `op` runs again
/// after the exchange. Other credentials are exchanged first.
pub(crate) async fn anonymous_first<T, F, Fut>(
    client: &oci_client::Client,
    registry: &str,
    auth: &RegistryAuth,
    op: F,
) -> std::result::Result<T, OciDistributionError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, OciDistributionError>>,
{
    let anonymous = matches!(auth, RegistryAuth::Anonymous);
    if !anonymous {
        client.store_auth_if_needed(registry, auth).await;
    }
    match op().await {
        Err(OciDistributionError::UnauthorizedError { .. }) if anonymous => {
            client.store_auth_if_needed(registry, auth).await;
            op().await
        }
        done => done,
    }
}
