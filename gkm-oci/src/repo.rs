//! One place to read and write images, whether in a registry or an OCI
//! image layout directory.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};
use oci_spec::image::{Descriptor, MediaType};

use crate::auth::Credentials;
use crate::error::{Error, Result};
use crate::labels::OCI_MANIFEST;
use crate::layout::Layout;
use crate::manifest_get::ManifestGetter;
use crate::reference::{ImageRef, Selector};
use gkm_core::digest::Digest;

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Speak plain HTTP instead of HTTPS.
    pub insecure: bool,
    /// Credentials.
    pub credentials: Credentials,
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

/// The largest manifest or config gkm reads into memory.
pub const MAX_DOCUMENT_SIZE: usize = 4 << 20;

/// How long connecting to a registry may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a registry may stay silent in the middle of an answer.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

enum Backend {
    Registry {
        client: Arc<oci_client::Client>,
        reference: Reference,
        auth: RegistryAuth,
        manifests: Box<ManifestGetter>,
    },
    Layout {
        layout: Layout,
        selector: Selector,
    },
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
                let config = ClientConfig {
                    protocol: if options.insecure {
                        ClientProtocol::Http
                    } else {
                        ClientProtocol::Https
                    },
                    connect_timeout: Some(CONNECT_TIMEOUT),
                    read_timeout: Some(READ_TIMEOUT),
                    ..Default::default()
                };
                let auth = options.credentials.resolve(reference.resolve_registry())?;
                Backend::Registry {
                    client: Arc::new(oci_client::Client::new(config)),
                    reference: reference.clone(),
                    auth,
                    manifests: Box::new(ManifestGetter::new(options.insecure)?),
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
        use oci_client::errors::OciDistributionError as E;
        match &e {
            E::ImageManifestNotFoundError(_) => Error::NotFound {
                what: "manifest".into(),
                location: self.image.to_string(),
            },
            E::ServerError { code: 404, .. } => Error::NotFound {
                what: "manifest or blob".into(),
                location: self.image.to_string(),
            },
            _ => Error::registry(&self.image, e),
        }
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
                client,
                reference,
                auth,
                manifests,
            } => {
                let reference = match digest {
                    Some(d) => Reference::with_digest(
                        reference.registry().to_string(),
                        reference.repository().to_string(),
                        d.to_string(),
                    ),
                    None => reference.clone(),
                };
                let fetched = manifests
                    .get(client, &reference, auth, |e| self.registry_err(e))
                    .await?;
                let bytes = fetched.bytes;
                let media_type = media_type_of(&bytes)?;
                let actual = Digest::of(&bytes);
                if let Some(claimed) = fetched.claimed_digest
                    && let Ok(claimed) = claimed.parse::<Digest>()
                    && claimed != actual
                {
                    return Err(Error::DigestMismatch {
                        what: format!("manifest of {}", self.image),
                        expected: claimed.to_string(),
                        actual: actual.to_string(),
                    });
                }
                RawManifest {
                    digest: actual,
                    media_type,
                    bytes,
                }
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
            Backend::Registry { .. } => {
                let stream = match self.open_blob(digest).await? {
                    BlobSource::Stream(s) => s,
                    BlobSource::File(_) => {
                        return Err(Error::Task("unexpected file source".into()));
                    }
                };
                let out = read_at_most(stream, MAX_DOCUMENT_SIZE + 1)
                    .await
                    .map_err(|e| Error::io(self.image.to_string(), e))?;
                if out.len() > MAX_DOCUMENT_SIZE {
                    return Err(Error::format(format!("blob {digest}"), "larger than 4 MiB"));
                }
                out
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

    /// Open a blob for streaming. The caller checks the digest.
    pub async fn open_blob(&self, digest: &Digest) -> Result<BlobSource> {
        match &self.backend {
            Backend::Layout { layout, .. } => {
                let path = layout.blob_path(digest);
                if !path.is_file() {
                    return Err(Error::NotFound {
                        what: format!("blob {digest}"),
                        location: layout.root().display().to_string(),
                    });
                }
                Ok(BlobSource::File(path))
            }
            Backend::Registry {
                client,
                reference,
                auth,
                ..
            } => {
                let sized = anonymous_first(client, reference.resolve_registry(), auth, || {
                    client.pull_blob_stream(reference, digest.as_str())
                })
                .await
                .map_err(|e| self.registry_err(e))?;
                Ok(BlobSource::Stream(sized.stream))
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
        match &self.backend {
            Backend::Layout { layout, selector } => {
                let layout = layout.clone();
                let manifest = manifest.clone();
                let selector = selector.clone();
                tokio::task::spawn_blocking(move || -> Result<()> {
                    let digest = layout.write_blob(&manifest.bytes)?;
                    if let Selector::Tag(tag) = selector {
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
                client
                    .push_manifest_raw(reference, manifest.bytes.clone(), content_type)
                    .await
                    .map_err(|e| self.registry_err(e))?;
                Ok(())
            }
        }
    }
}

/// The `mediaType` a manifest declares, or what its shape says it is.
/// At most `limit` bytes of `stream`; reading stops there, so a source that
/// never ends costs no more memory than the limit.
pub(crate) async fn read_at_most<E>(
    stream: impl futures::Stream<Item = std::result::Result<Bytes, E>>,
    limit: usize,
) -> std::result::Result<Vec<u8>, E> {
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(chunk) = stream.next().await else {
            break;
        };
        let chunk = chunk?;
        let room = limit - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out)
}

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
        None if probe.manifests.is_some() => crate::labels::OCI_INDEX.to_string(),
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
