//! cosign v2 signatures: the `sha256-<hex>.sig` tag, one simple-signing
//! payload per layer, the signature (and certificate) in layer annotations.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gkm_core::policy::{Format, Rejection};
use oci_spec::image::ImageManifest;

use super::candidate::Candidate;
use super::location::{fetch_tag, signature_tag};
use crate::error::Result;
use crate::registry::reference::ImageRef;
use crate::registry::repo::{RegistryOptions, Repo};
use gkm_core::digest::Digest;

/// The media type of a simple-signing payload layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The layer annotation holding the PEM signing certificate.
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// The layer annotation holding the Rekor entry and its signed entry timestamp.
pub const REKOR_BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
/// The layer annotation holding the PEM certificate chain.
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";

const FORMAT: Format = Format::CosignV2;

fn malformed(reason: impl Into<String>) -> Rejection {
    Rejection::Malformed {
        format: FORMAT,
        reason: reason.into(),
    }
}

/// The cosign v2 signatures of `digest`: one entry per layer of the `.sig`
/// manifest, or a refusal when a layer cannot be read as a signature.
pub(crate) async fn find(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
) -> Result<Vec<std::result::Result<Candidate, Rejection>>> {
    let tag = signature_tag(digest);
    let Some(manifest) = fetch_tag(image, options, &tag).await? else {
        return Ok(Vec::new());
    };
    let manifest: ImageManifest = match serde_json::from_slice(&manifest.bytes) {
        Ok(m) => m,
        Err(e) => {
            return Ok(vec![Err(malformed(format!(
                "the manifest at tag {tag} is not an image manifest: {e}"
            )))]);
        }
    };
    let repo = Repo::open(&super::location::tagged(image, &tag), options)?;
    let mut out = Vec::new();
    for layer in manifest.layers() {
        if layer.media_type().to_string() != SIMPLE_SIGNING_MEDIA_TYPE {
            continue;
        }
        let annotations = layer.annotations().clone().unwrap_or_default();
        let Some(sig_b64) = annotations.get(SIGNATURE_ANNOTATION) else {
            out.push(Err(malformed(format!(
                "a layer of {tag} has no {SIGNATURE_ANNOTATION} annotation"
            ))));
            continue;
        };
        let signature = match BASE64.decode(sig_b64.trim()) {
            Ok(s) => s,
            Err(e) => {
                out.push(Err(malformed(format!(
                    "the signature annotation is not base64: {e}"
                ))));
                continue;
            }
        };
        let certificate = match annotations
            .get(CERTIFICATE_ANNOTATION)
            .filter(|c| !c.trim().is_empty())
        {
            None => None,
            Some(pem) => match gkm_core::policy::pem_block(pem, "CERTIFICATE") {
                Ok(der) => Some(der),
                Err(e) => {
                    out.push(Err(malformed(format!("the certificate annotation: {e}"))));
                    continue;
                }
            },
        };
        let layer_digest: Digest = layer.digest().to_string().parse()?;
        let payload = repo.fetch_small_blob(&layer_digest).await?;
        out.push(Ok(Candidate {
            format: FORMAT,
            signed_digest: payload_digest(&payload),
            message: payload,
            signature,
            certificate,
            key_hint: None,
            tlog: annotations
                .get(REKOR_BUNDLE_ANNOTATION)
                .and_then(|b| super::tlog::from_cosign_annotation(b).ok())
                .into_iter()
                .collect(),
        }));
    }
    Ok(out)
}

/// The `critical.image.docker-manifest-digest` of a simple-signing payload.
fn payload_digest(payload: &[u8]) -> std::result::Result<String, String> {
    let value: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the simple-signing payload is not JSON: {e}"))?;
    value
        .pointer("/critical/image/docker-manifest-digest")
        .and_then(|d| d.as_str())
        .map(str::to_string)
        .ok_or_else(|| {
            "the simple-signing payload names no critical.image.docker-manifest-digest".to_string()
        })
}

/// The simple-signing payload cosign signs for `digest` of `docker_reference`.
pub(crate) fn payload(docker_reference: &str, digest: &Digest) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": digest.as_str()},
            "type": "cosign container image signature"
        },
        "optional": null
    }))
    .unwrap_or_default()
}
