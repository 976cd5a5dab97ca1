//! Where signatures live next to an image: cosign's `sha256-<hex>.sig` tag,
//! the referrers API and its `sha256-<hex>` tag-schema index.

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_spec::image::ImageIndex;

use super::hints::{ReferrersAt, SignatureHints};
use crate::error::{Error, Result};
use crate::registry::reference::{ImageRef, Selector};
use crate::registry::repo::{RegistryOptions, Repo};
use gkm_core::digest::Digest;

/// The same repository as `image`, at `tag`.
pub fn tagged(image: &ImageRef, tag: &str) -> ImageRef {
    match image {
        ImageRef::Registry(r) => ImageRef::Registry(oci_client::Reference::with_tag(
            r.registry().to_string(),
            r.repository().to_string(),
            tag.to_string(),
        )),
        ImageRef::Layout { path, .. } => ImageRef::Layout {
            path: path.clone(),
            selector: Selector::Tag(tag.into()),
        },
    }
}

/// cosign's signature tag for `digest`: `sha256-<hex>.sig`.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// The referrers tag-schema tag for `digest`: `sha256-<hex>`.
pub fn referrers_tag(digest: &Digest) -> String {
    format!("sha256-{}", digest.hex())
}

/// The `registry/repository` name signatures record for `image`.
pub(crate) fn docker_reference(image: &ImageRef) -> String {
    match image {
        ImageRef::Registry(r) => format!("{}/{}", r.registry(), r.repository()),
        ImageRef::Layout { path, .. } => path.display().to_string(),
    }
}

/// The manifest at `tag`, or `None` when the tag does not exist.
pub async fn fetch_tag(
    image: &ImageRef,
    options: &RegistryOptions,
    tag: &str,
) -> Result<Option<crate::registry::repo::RawManifest>> {
    let at = tagged(image, tag);
    let repo = match Repo::open(&at, options) {
        Ok(r) => r,
        Err(Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    match repo.fetch_manifest().await {
        Ok(m) => Ok(Some(m)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(Error::Format { what, reason }) => Err(Error::Format {
            what: format!("{what} at {at}"),
            reason,
        }),
        Err(e) => Err(e),
    }
}

/// Whether `e` says the tag or manifest does not exist: gkm's own
/// `NotFound`, or a registry's `MANIFEST_UNKNOWN` / `NAME_UNKNOWN` answer.
fn is_not_found(e: &Error) -> bool {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode};
    match e {
        Error::NotFound { .. } => true,
        Error::Registry { source, .. } => match source.downcast_ref::<E>() {
            Some(E::RegistryError { envelope, .. }) => envelope.errors.iter().any(|err| {
                matches!(
                    err.code,
                    OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown
                )
            }),
            Some(E::ImageManifestNotFoundError(_)) => true,
            Some(E::ServerError { code: 404, .. }) => true,
            _ => false,
        },
        _ => false,
    }
}

/// The referrers of `digest`: from the registry's referrers API, or the
/// tag-schema index that clients write where there is none (a layout only
/// has the tag). The place `hints` names for the registry is read first,
/// the tag schema when they name none; the other only when the first holds
/// nothing. Where they were found is remembered in `hints`.
pub(crate) async fn referrers(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    hints: &SignatureHints,
) -> Result<ImageIndex> {
    let reference = match image {
        ImageRef::Registry(r) => r,
        ImageRef::Layout { .. } => return tag_schema_index(image, options, digest).await,
    };
    if hints.referrers(image) == Some(ReferrersAt::Api) {
        let index = referrers_api(image, reference, options, digest).await?;
        if !index.manifests().is_empty() {
            return Ok(index);
        }
        return tag_schema_index(image, options, digest).await;
    }
    // The tag schema first: a registry without the referrers API answers
    // in one request, and one with it costs a 404 once, as the hint then
    // names the API.
    let tagged = tag_schema_index(image, options, digest).await?;
    if !tagged.manifests().is_empty() {
        hints.found_referrers(image, ReferrersAt::TagSchema);
        return Ok(tagged);
    }
    let index = referrers_api(image, reference, options, digest).await?;
    if !index.manifests().is_empty() {
        // Not the tag schema's (just found empty): the API's.
        hints.found_referrers(image, ReferrersAt::Api);
    }
    Ok(index)
}

/// The referrers API's index of `digest`. oci-client falls back to the tag
/// schema itself where the API answers 404, and answers an empty index when
/// that is missing or unreadable: the callers read the tag schema
/// themselves to tell those apart.
async fn referrers_api(
    image: &ImageRef,
    reference: &oci_client::Reference,
    options: &RegistryOptions,
    digest: &Digest,
) -> Result<ImageIndex> {
    let client = oci_client::Client::new(ClientConfig {
        protocol: if options.insecure {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        ..Default::default()
    });
    let auth = options.credentials.resolve(reference.resolve_registry())?;
    let subject = oci_client::Reference::with_digest(
        reference.registry().to_string(),
        reference.repository().to_string(),
        digest.to_string(),
    );
    let index = crate::registry::repo::anonymous_first(
        &client,
        reference.resolve_registry(),
        &auth,
        || client.pull_referrers(&subject, None),
    )
    .await
    .map_err(|e| Error::registry(image, e))?;
    let json = serde_json::to_vec(&index).map_err(|e| Error::format("referrers index", e))?;
    serde_json::from_slice(&json).map_err(|e| Error::format("referrers index", e))
}

async fn tag_schema_index(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
) -> Result<ImageIndex> {
    match fetch_tag(image, options, &referrers_tag(digest)).await? {
        None => Ok(empty_index()),
        Some(m) => serde_json::from_slice(&m.bytes).map_err(|e| {
            Error::format(
                format!("referrers index at tag {}", referrers_tag(digest)),
                e,
            )
        }),
    }
}

fn empty_index() -> ImageIndex {
    ImageIndex::default()
}
