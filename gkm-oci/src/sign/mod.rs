//! Signing cache images: sigstore bundles (default) and cosign v2 signatures.
//!
//! [`sign`] signs an image digest with a [`SigningKey`] and stores the
//! signature next to it in the format cosign reads:
//!
//! - [`SignFormat::Bundle`]: a sigstore v0.3 bundle (DSSE envelope over an
//!   in-toto statement naming the digest) pushed as an OCI 1.1 referrer of the
//!   image, and listed in the `sha256-<hex>` tag-schema index for registries
//!   without the referrers API;
//! - [`SignFormat::CosignV2`]: a simple-signing payload layer added to the
//!   `sha256-<hex>.sig` manifest.
//!
//! No transparency log entry is written (the signature is made offline).
//!
//! ```no_run
//! use gkm_oci::sign::{SignFormat, SigningKey, sign};
//! use gkm_oci::{ImageRef, RegistryOptions, Repo};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let image: ImageRef = "registry.local:5000/caches/vector-add:cuda".parse()?;
//! let options = RegistryOptions::default();
//! let digest = Repo::open(&image, &options)?.fetch_manifest().await?.digest;
//! let key = SigningKey::from_pem(&std::fs::read_to_string("cosign.key")?, b"password")?;
//! let signed = sign(&image, &options, &digest, &key, SignFormat::Bundle).await?;
//! println!("{}", signed.location);
//! # Ok(()) }
//! ```

mod key;

pub use key::SigningKey;

use crate::error::{Error, Result};
use crate::registry::media_types::{OCI_INDEX, OCI_MANIFEST};
use crate::registry::reference::ImageRef;
use crate::registry::repo::{BlobSource, RawManifest, RegistryOptions, Repo};
use crate::verify::location::{docker_reference, fetch_tag, referrers_tag, signature_tag, tagged};
use crate::verify::{BUNDLE_MEDIA_TYPE, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};
use gkm_core::digest::Digest;

/// How to store a signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SignFormat {
    /// A sigstore bundle as an OCI 1.1 referrer (cosign v3's default).
    #[default]
    Bundle,
    /// cosign v2's `sha256-<hex>.sig` tag.
    CosignV2,
}

/// Where a signature was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The image digest signed.
    pub digest: Digest,
    /// The reference of the signature manifest (the `.sig` tag, or the
    /// referrer's digest).
    pub location: String,
}

const EMPTY_JSON_TYPE: &str = "application/vnd.oci.empty.v1+json";

async fn put_json_blob(repo: &Repo, bytes: Vec<u8>) -> Result<(Digest, u64)> {
    let digest = Digest::of(&bytes);
    let size = bytes.len() as u64;
    if !repo.has_blob(&digest).await? {
        let chunk: std::io::Result<bytes::Bytes> = Ok(bytes::Bytes::from(bytes));
        let stream = futures::stream::once(async move { chunk });
        repo.put_blob(&digest, size, BlobSource::Stream(Box::pin(stream)))
            .await?;
    }
    Ok((digest, size))
}

fn manifest_bytes(value: &serde_json::Value) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::format("signature manifest", e))
}

/// Sign `digest` of `image`'s repository with `key`, storing the signature
/// in `format`.
pub async fn sign(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    key: &SigningKey,
    format: SignFormat,
) -> Result<Signed> {
    let subject = Repo::open(image, options)?
        .fetch_manifest_digest(digest)
        .await?;
    match format {
        SignFormat::CosignV2 => sign_v2(image, options, digest, key).await,
        SignFormat::Bundle => sign_bundle(image, options, &subject, key).await,
    }
}

async fn sign_v2(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    key: &SigningKey,
) -> Result<Signed> {
    let tag = signature_tag(digest);
    let at = tagged(image, &tag);
    let repo = Repo::create(&at, options)?;
    let payload = crate::verify::cosign_v2_payload(&docker_reference(image), digest);
    let signature = key.sign(&payload)?;
    let (payload_digest, payload_size) = put_json_blob(&repo, payload).await?;
    let layer = serde_json::json!({
        "mediaType": SIMPLE_SIGNING_MEDIA_TYPE,
        "size": payload_size,
        "digest": payload_digest.as_str(),
        "annotations": {SIGNATURE_ANNOTATION: base64_encode(&signature)}
    });
    // Keep the signatures already there, as cosign does.
    let mut layers: Vec<serde_json::Value> = match fetch_tag(image, options, &tag).await? {
        Some(existing) => serde_json::from_slice::<serde_json::Value>(&existing.bytes)
            .ok()
            .and_then(|m| m.get("layers").and_then(|l| l.as_array()).cloned())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    layers.retain(|l| l != &layer);
    layers.push(layer);
    let diff_ids: Vec<&str> = layers
        .iter()
        .filter_map(|l| l.get("digest").and_then(|d| d.as_str()))
        .collect();
    let config = serde_json::json!({
        "architecture": "", "os": "", "created": "0001-01-01T00:00:00Z",
        "config": {}, "rootfs": {"type": "layers", "diff_ids": diff_ids}
    });
    let (config_digest, config_size) = put_json_blob(&repo, manifest_bytes(&config)?).await?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": config_size, "digest": config_digest.as_str()},
        "layers": layers
    });
    let bytes = manifest_bytes(&manifest)?;
    repo.put_manifest(&RawManifest {
        digest: Digest::of(&bytes),
        media_type: OCI_MANIFEST.into(),
        bytes,
    })
    .await?;
    Ok(Signed {
        digest: digest.clone(),
        location: at.to_string(),
    })
}

async fn sign_bundle(
    image: &ImageRef,
    options: &RegistryOptions,
    subject: &RawManifest,
    key: &SigningKey,
) -> Result<Signed> {
    let digest = &subject.digest;
    let bundle = crate::verify::key_bundle(
        &docker_reference(image),
        digest,
        key.public_key().der(),
        |m| key.sign(m),
    )?;
    let bundle_bytes =
        serde_json::to_vec(&bundle).map_err(|e| Error::format("sigstore bundle", e))?;
    let repo = Repo::create(image, options)?;
    let (empty_digest, empty_size) = put_json_blob(&repo, b"{}".to_vec()).await?;
    let (bundle_digest, bundle_size) = put_json_blob(&repo, bundle_bytes).await?;
    let created = httpdate_now();
    let annotations = serde_json::json!({
        "dev.sigstore.bundle.content": "dsse-envelope",
        "dev.sigstore.bundle.predicateType": crate::verify::COSIGN_SIGN_PREDICATE,
        "org.opencontainers.image.created": created
    });
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_JSON_TYPE, "size": empty_size, "digest": empty_digest.as_str()},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "size": bundle_size, "digest": bundle_digest.as_str()}],
        "subject": {"mediaType": subject.media_type, "size": subject.bytes.len(), "digest": digest.as_str()},
        "annotations": annotations
    });
    let bytes = manifest_bytes(&manifest)?;
    let referrer = RawManifest {
        digest: Digest::of(&bytes),
        media_type: OCI_MANIFEST.into(),
        bytes,
    };
    let referrer_ref = image.with_digest(&referrer.digest);
    Repo::create(&referrer_ref, options)?
        .put_manifest(&referrer)
        .await?;

    // The tag-schema index, for registries without the referrers API.
    let tag = referrers_tag(digest);
    let mut entries: Vec<serde_json::Value> = match fetch_tag(image, options, &tag).await? {
        Some(existing) => serde_json::from_slice::<serde_json::Value>(&existing.bytes)
            .ok()
            .and_then(|m| m.get("manifests").and_then(|l| l.as_array()).cloned())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let entry = serde_json::json!({
        "mediaType": OCI_MANIFEST,
        "size": referrer.bytes.len(),
        "digest": referrer.digest.as_str(),
        "artifactType": BUNDLE_MEDIA_TYPE,
        "annotations": annotations
    });
    entries.retain(|e| e.get("digest") != entry.get("digest"));
    entries.push(entry);
    let index =
        serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries});
    let bytes = manifest_bytes(&index)?;
    Repo::create(&tagged(image, &tag), options)?
        .put_manifest(&RawManifest {
            digest: Digest::of(&bytes),
            media_type: OCI_INDEX.into(),
            bytes,
        })
        .await?;
    Ok(Signed {
        digest: digest.clone(),
        location: referrer_ref.to_string(),
    })
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The current time as RFC 3339 UTC seconds.
fn httpdate_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
