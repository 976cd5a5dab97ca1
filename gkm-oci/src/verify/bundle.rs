//! Sigstore bundles (cosign v3) attached to an image as OCI 1.1 referrers.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gkm_core::policy::{Format, Rejection};
use oci_spec::image::ImageManifest;
use serde::{Deserialize, Serialize};

use super::candidate::Candidate;
use super::hints::SignatureHints;
use super::location::referrers;
use crate::error::Result;
use crate::registry::reference::ImageRef;
use crate::registry::repo::{RegistryOptions, Repo};
use gkm_core::digest::Digest;

/// The media type (and referrer artifact type) of a v0.3 sigstore bundle.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The DSSE payload type of an in-toto statement.
pub const DSSE_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto statement type cosign writes.
pub const IN_TOTO_STATEMENT_V1: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of cosign's image signatures.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";

const BUNDLE_PREFIX: &str = "application/vnd.dev.sigstore.bundle";
const FORMAT: Format = Format::SigstoreBundle;

fn malformed(reason: impl Into<String>) -> Rejection {
    Rejection::Malformed {
        format: FORMAT,
        reason: reason.into(),
    }
}

/// A sigstore bundle (the parts gkm reads and writes).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Bundle {
    pub media_type: String,
    pub verification_material: Material,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsse_envelope: Option<Envelope>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_signature: Option<MessageSignature>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Material {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key: Option<KeyHint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<RawBytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x509_certificate_chain: Option<Chain>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tlog_entries: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_verification_data: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KeyHint {
    #[serde(default)]
    pub hint: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RawBytes {
    pub raw_bytes: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Chain {
    pub certificates: Vec<RawBytes>,
}

/// A DSSE envelope.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Envelope {
    pub payload: String,
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EnvelopeSignature {
    pub sig: String,
    #[serde(default)]
    pub keyid: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MessageSignature {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_digest: Option<MessageDigest>,
    pub signature: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MessageDigest {
    pub algorithm: String,
    pub digest: String,
}

/// DSSE's pre-authentication encoding: what a DSSE signature covers.
///
/// ```
/// let pae = gkm_oci::verify::pae("t", b"ab");
/// assert_eq!(pae, b"DSSEv1 1 t 2 ab");
/// ```
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The bundles referring to `digest`, each as a candidate signature or the
/// reason it cannot be one; the referrers are looked up as `hints` say.
pub(crate) async fn find(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    hints: &SignatureHints,
) -> Result<Vec<std::result::Result<Candidate, Rejection>>> {
    let index = referrers(image, options, digest, hints).await?;
    let repo = Repo::open(image, options)?;
    let mut out = Vec::new();
    for desc in index.manifests() {
        let is_bundle = desc
            .artifact_type()
            .as_ref()
            .is_some_and(|t| t.to_string().starts_with(BUNDLE_PREFIX));
        if !is_bundle {
            continue;
        }
        let manifest_digest: Digest = desc.digest().to_string().parse()?;
        let raw = repo.fetch_manifest_digest(&manifest_digest).await?;
        let manifest: ImageManifest = match serde_json::from_slice(&raw.bytes) {
            Ok(m) => m,
            Err(e) => {
                out.push(Err(malformed(format!(
                    "referrer {manifest_digest} is not an image manifest: {e}"
                ))));
                continue;
            }
        };
        let Some(layer) = manifest
            .layers()
            .iter()
            .find(|l| l.media_type().to_string().starts_with(BUNDLE_PREFIX))
        else {
            out.push(Err(malformed(format!(
                "referrer {manifest_digest} has no bundle layer"
            ))));
            continue;
        };
        let layer_digest: Digest = layer.digest().to_string().parse()?;
        let bytes = repo.fetch_small_blob(&layer_digest).await?;
        let bundle: Bundle = match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => {
                out.push(Err(malformed(format!(
                    "bundle {layer_digest} is not a sigstore bundle: {e}"
                ))));
                continue;
            }
        };
        let manifest = if bundle.dsse_envelope.is_none() && bundle.message_signature.is_some() {
            repo.fetch_manifest_digest(digest).await?.bytes
        } else {
            Vec::new()
        };
        out.push(candidate(&bundle, digest, manifest));
    }
    Ok(out)
}

/// The candidate signature of a parsed bundle over `digest`: its DSSE
/// envelope, else its message signature over `manifest` (the image
/// manifest's bytes, used only then).
pub(crate) fn candidate(
    bundle: &Bundle,
    digest: &Digest,
    manifest: Vec<u8>,
) -> std::result::Result<Candidate, Rejection> {
    match (&bundle.dsse_envelope, &bundle.message_signature) {
        (Some(envelope), _) => from_envelope(bundle, envelope, digest),
        (None, Some(message)) => from_message(bundle, message, manifest),
        (None, None) => Err(malformed(
            "the bundle has neither a DSSE envelope nor a message signature",
        )),
    }
}

fn tlog_entries(material: &Material) -> Vec<super::tlog::Entry> {
    material
        .tlog_entries
        .iter()
        .filter_map(|e| super::tlog::from_bundle_entry(e).ok())
        .collect()
}

fn certificate(material: &Material) -> std::result::Result<Option<Vec<u8>>, Rejection> {
    let raw = match (&material.certificate, &material.x509_certificate_chain) {
        (Some(c), _) => &c.raw_bytes,
        (None, Some(chain)) => match chain.certificates.first() {
            Some(c) => &c.raw_bytes,
            None => return Err(malformed("the certificate chain is empty")),
        },
        (None, None) => return Ok(None),
    };
    BASE64
        .decode(raw)
        .map(Some)
        .map_err(|e| malformed(format!("the certificate is not base64: {e}")))
}

fn from_envelope(
    bundle: &Bundle,
    envelope: &Envelope,
    digest: &Digest,
) -> std::result::Result<Candidate, Rejection> {
    if envelope.payload_type != DSSE_PAYLOAD_TYPE {
        return Err(malformed(format!(
            "DSSE payload type {:?}, expected {DSSE_PAYLOAD_TYPE}",
            envelope.payload_type
        )));
    }
    let payload = BASE64
        .decode(&envelope.payload)
        .map_err(|e| malformed(format!("DSSE payload is not base64: {e}")))?;
    let sig = envelope
        .signatures
        .first()
        .ok_or_else(|| malformed("the DSSE envelope has no signature"))?;
    let signature = BASE64
        .decode(&sig.sig)
        .map_err(|e| malformed(format!("DSSE signature is not base64: {e}")))?;
    Ok(Candidate {
        format: FORMAT,
        message: pae(&envelope.payload_type, &payload),
        signature,
        signed_digest: statement_digest(&payload, digest),
        certificate: certificate(&bundle.verification_material)?,
        key_hint: bundle
            .verification_material
            .public_key
            .as_ref()
            .map(|k| k.hint.clone()),
        tlog: tlog_entries(&bundle.verification_material),
    })
}

/// The subject digest of an in-toto statement: `digest` itself when a
/// subject names it, else the first subject's. Only cosign's signature
/// predicate is a signature: a provenance or scan attestation by the same
/// key says something else about the image, and is refused.
fn statement_digest(payload: &[u8], digest: &Digest) -> std::result::Result<String, String> {
    let statement: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the in-toto statement is not JSON: {e}"))?;
    match statement.get("predicateType").and_then(|t| t.as_str()) {
        Some(COSIGN_SIGN_PREDICATE) => {}
        other => {
            return Err(format!(
                "the in-toto statement's predicate type is {}, not a signature ({COSIGN_SIGN_PREDICATE})",
                other.map_or_else(|| "missing".to_string(), |t| format!("{t:?}"))
            ));
        }
    }
    let subjects = statement
        .get("subject")
        .and_then(|s| s.as_array())
        .ok_or_else(|| "the in-toto statement has no subject".to_string())?;
    let digests: Vec<&str> = subjects
        .iter()
        .filter_map(|s| s.pointer("/digest/sha256").and_then(|d| d.as_str()))
        .collect();
    if digests.contains(&digest.hex()) {
        return Ok(digest.to_string());
    }
    digests
        .first()
        .map(|d| format!("sha256:{d}"))
        .ok_or_else(|| "no in-toto subject has a sha256 digest".into())
}

fn from_message(
    bundle: &Bundle,
    message: &MessageSignature,
    manifest: Vec<u8>,
) -> std::result::Result<Candidate, Rejection> {
    let signature = BASE64
        .decode(&message.signature)
        .map_err(|e| malformed(format!("message signature is not base64: {e}")))?;
    let signed_digest = match &message.message_digest {
        Some(d) if d.algorithm == "SHA2_256" => BASE64
            .decode(&d.digest)
            .map(|h| format!("sha256:{}", hex::encode(h)))
            .map_err(|e| format!("message digest is not base64: {e}")),
        Some(d) => Err(format!(
            "unsupported message digest algorithm {:?}",
            d.algorithm
        )),
        None => Err("the message signature names no digest".into()),
    };
    Ok(Candidate {
        format: FORMAT,
        message: manifest,
        signature,
        signed_digest,
        certificate: certificate(&bundle.verification_material)?,
        key_hint: bundle
            .verification_material
            .public_key
            .as_ref()
            .map(|k| k.hint.clone()),
        tlog: tlog_entries(&bundle.verification_material),
    })
}

/// The bundle gkm writes: a DSSE envelope over the in-toto statement naming
/// `digest` of `name`, signed by a key (hinted by its SHA-256).
pub(crate) fn key_bundle(
    name: &str,
    digest: &Digest,
    key_der: &[u8],
    sign: impl FnOnce(&[u8]) -> Result<Vec<u8>>,
) -> Result<Bundle> {
    use sha2::Digest as _;
    let statement = serde_json::json!({
        "_type": IN_TOTO_STATEMENT_V1,
        "subject": [{"name": name, "digest": {"sha256": digest.hex()}}],
        "predicateType": COSIGN_SIGN_PREDICATE,
        "predicate": {}
    });
    let payload = serde_json::to_vec(&statement).unwrap_or_default();
    let signature = sign(&pae(DSSE_PAYLOAD_TYPE, &payload))?;
    Ok(Bundle {
        media_type: BUNDLE_MEDIA_TYPE.into(),
        verification_material: Material {
            public_key: Some(KeyHint {
                hint: BASE64.encode(sha2::Sha256::digest(key_der)),
            }),
            ..Material::default()
        },
        dsse_envelope: Some(Envelope {
            payload: BASE64.encode(&payload),
            payload_type: DSSE_PAYLOAD_TYPE.into(),
            signatures: vec![EnvelopeSignature {
                sig: BASE64.encode(signature),
                keyid: String::new(),
            }],
        }),
        message_signature: None,
    })
}
