//! Signature verification of cache images: cosign v2 signatures and sigstore bundles.
//!
//! [`verify`] finds every signature of an image digest, in both formats,
//! and accepts the first one that a signer of the [`Policy`] made over that
//! digest:
//!
//! - cosign v2: the `sha256-<hex>.sig` tag, one simple-signing payload per
//!   layer whose `docker-manifest-digest` must equal the image digest, signed
//!   by a key or by a certificate (annotations `dev.sigstore.cosign/certificate`);
//! - sigstore bundles (cosign v3): OCI 1.1 referrers of the image found
//!   through the referrers API, or the `sha256-<hex>` tag-schema index where
//!   the registry has none; a DSSE envelope whose in-toto statement subject
//!   must be the image digest, or a message signature over the manifest.
//!
//! Only the registry is contacted; the trust material comes from the policy.
//! [`verify_with_hints`] looks first where earlier verifications on the same
//! registry found signatures ([`SignatureHints`]), saving the requests that
//! would find nothing.
//!
//! The outcome is a [`Verified`] saying what was proven, or a [`Rejection`]
//! saying why not ([`VerifyError::Rejected`]); a registry that cannot be read
//! is a [`VerifyError::Image`] instead, so callers can retry it.
//!
//! ```no_run
//! use gkm_core::policy::{Policy, PublicKey};
//! use gkm_oci::{Digest, ImageRef, RegistryOptions};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let image: ImageRef = "registry.local:5000/caches/vector-add:cuda".parse()?;
//! let options = RegistryOptions::default();
//! let digest: Digest = gkm_oci::Repo::open(&image, &options)?.fetch_manifest().await?.digest;
//! let key = PublicKey::from_pem(&std::fs::read_to_string("cosign.pub")?)?;
//! let policy = Policy::keys(vec![key])?;
//! match gkm_oci::verify::verify(&image, &options, &digest, &policy).await {
//!     Ok(verified) => println!("{verified}"),
//!     Err(gkm_oci::verify::VerifyError::Rejected(why)) => println!("refused: {why}"),
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok(()) }
//! ```

pub(crate) mod bundle;
mod candidate;
pub(crate) mod certificate;
mod cosign_v2;
pub(crate) mod crypto;
mod hints;
pub mod location;
pub(crate) mod sct;
mod tlog;

use gkm_core::policy::{Format, Policy, PublicKey, Rejection, SignedBy, Signer, Verified};

use crate::registry::reference::ImageRef;
use crate::registry::repo::RegistryOptions;
use candidate::Candidate;
use gkm_core::digest::Digest;

pub(crate) use bundle::key_bundle;
pub use bundle::{
    BUNDLE_MEDIA_TYPE, COSIGN_SIGN_PREDICATE, DSSE_PAYLOAD_TYPE, IN_TOTO_STATEMENT_V1, pae,
};
pub use certificate::{OID_ISSUER_V1, OID_ISSUER_V2};
pub(crate) use cosign_v2::payload as cosign_v2_payload;
pub use cosign_v2::{
    CERTIFICATE_ANNOTATION, CHAIN_ANNOTATION, REKOR_BUNDLE_ANNOTATION, SIGNATURE_ANNOTATION,
    SIMPLE_SIGNING_MEDIA_TYPE,
};
pub use hints::SignatureHints;
pub use location::{referrers_tag, signature_tag};
pub use sct::OID_SCT_LIST;

/// Why [`verify`] gave no [`Verified`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Signatures were read and refused, or there were none.
    #[error("signature refused: {0}")]
    Rejected(#[from] Rejection),
    /// The registry or layout could not be read (unreachable, garbage,
    /// digest mismatches): nothing was decided about the signatures.
    #[error("reading signatures: {0}")]
    Image(#[from] crate::Error),
}

/// Verify the signatures of `digest` in `image`'s repository against
/// `policy`. The policy's mode is not applied here: see
/// [`gkm_core::policy::Mode::admits`].
pub async fn verify(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    policy: &Policy,
) -> Result<Verified, VerifyError> {
    verify_with_hints(image, options, digest, policy, &SignatureHints::default()).await
}

/// Where [`verify_with_hints`] looks for signatures.
#[derive(Debug, Clone, Copy)]
enum Lookup {
    /// cosign v2's `.sig` tag.
    CosignV2,
    /// Sigstore bundles among the referrers.
    Bundles,
}

/// [`verify`], looking first where `hints` say signatures were found on
/// the image's registry before, and remembering there where this one was:
/// the format that proved the policy last is looked up first (cosign v2's
/// without a hint), and the referrers where they were found last. The
/// outcome is [`verify`]'s; only the requests differ.
pub async fn verify_with_hints(
    image: &ImageRef,
    options: &RegistryOptions,
    digest: &Digest,
    policy: &Policy,
    hints: &SignatureHints,
) -> Result<Verified, VerifyError> {
    let now = now();
    // One format's signatures first: one that proves the policy ends the
    // search before the other's are looked up (cosign v2's tag, or the
    // referrers and the bundles they name). The refusals keep their order:
    // what could not be read, then what did not prove the policy.
    let order = match hints.format(image) {
        Some(Format::SigstoreBundle) => [Lookup::Bundles, Lookup::CosignV2],
        _ => [Lookup::CosignV2, Lookup::Bundles],
    };
    let mut unread = Vec::new();
    let mut refused = Vec::new();
    for lookup in order {
        let found = match lookup {
            Lookup::CosignV2 => cosign_v2::find(image, options, digest).await?,
            Lookup::Bundles => bundle::find(image, options, digest, hints).await?,
        };
        for found in found {
            match found.map(|c| check(&c, digest, policy, now)) {
                Ok(Ok(v)) => {
                    hints.proved(image, v.format);
                    return Ok(v);
                }
                Ok(Err(r)) => refused.push(r),
                Err(r) => unread.push(r),
            }
        }
    }
    unread.extend(refused);
    Err(VerifyError::Rejected(Rejection::combine(unread)))
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// Check one candidate against the policy at time `now`.
pub(crate) fn check(
    c: &Candidate,
    digest: &Digest,
    policy: &Policy,
    now: i64,
) -> Result<Verified, Rejection> {
    if !crypto::well_formed_signature(&c.signature) {
        return Err(Rejection::Malformed {
            format: c.format,
            reason: format!(
                "the signature ({} bytes) is truncated or not a signature",
                c.signature.len()
            ),
        });
    }
    // The time a verified log entry proves the signature existed at.
    let logged = policy.trusted_root().and_then(|root| {
        c.tlog
            .iter()
            .find_map(|e| tlog::verified_time(e, root, &c.signature))
    });
    let covers = |signed_by: SignedBy| -> Result<Verified, Rejection> {
        let keyless = matches!(signed_by, SignedBy::Keyless { .. });
        let signed = c
            .signed_digest
            .clone()
            .map_err(|reason| Rejection::Malformed {
                format: c.format,
                reason,
            })?;
        if signed != digest.as_str() {
            return Err(Rejection::DigestMismatch {
                format: c.format,
                expected: digest.to_string(),
                signed,
            });
        }
        let needs_tlog = policy.require_tlog() || (keyless && policy.keyless_needs_tlog());
        if needs_tlog && logged.is_none() {
            return Err(Rejection::TlogMissing);
        }
        Ok(Verified {
            format: c.format,
            signed_by,
            digest: signed,
            tlog: logged.is_some(),
        })
    };
    let keys: Vec<&PublicKey> = policy
        .signers()
        .iter()
        .filter_map(|s| {
            if let Signer::Key(k) = s {
                Some(k)
            } else {
                None
            }
        })
        .collect();
    for key in &keys {
        if crypto::verify_with_key(key, &c.message, &c.signature) {
            return covers(SignedBy::Key {
                fingerprint: key.fingerprint(),
                algorithm: key.algorithm(),
            });
        }
    }
    let identities: Vec<_> = policy
        .signers()
        .iter()
        .filter_map(|s| {
            if let Signer::Keyless(i) = s {
                Some(i)
            } else {
                None
            }
        })
        .collect();
    if let (Some(cert), false, Some(root)) =
        (&c.certificate, identities.is_empty(), policy.trusted_root())
    {
        let leaf = certificate::check_leaf(cert, root, logged.unwrap_or(now))?;
        if !crypto::verify_with_key(&leaf.key, &c.message, &c.signature) {
            return Err(tampered(
                c.format,
                "the signature does not verify with its own certificate",
            ));
        }
        let issuer = leaf.issuer.clone().unwrap_or_default();
        let same_issuer: Vec<_> = identities.iter().filter(|i| i.issuer() == issuer).collect();
        if same_issuer.is_empty() {
            return Err(Rejection::IssuerMismatch {
                expected: identities
                    .iter()
                    .map(|i| format!("{:?}", i.issuer()))
                    .collect::<Vec<_>>()
                    .join(" or "),
                found: issuer,
            });
        }
        for identity in &same_issuer {
            if let Some(subject) = leaf.subjects.iter().find(|s| identity.subject().matches(s)) {
                return covers(SignedBy::Keyless {
                    issuer: issuer.clone(),
                    subject: subject.clone(),
                });
            }
        }
        return Err(Rejection::IdentityMismatch {
            expected: same_issuer
                .iter()
                .map(|i| i.subject().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
            found: leaf.subjects.join(", "),
        });
    }
    if let Some(hint) = &c.key_hint
        && keys.iter().any(|k| hint_names(hint, k))
    {
        return Err(tampered(
            c.format,
            "the signature does not match the signed content of the key it names",
        ));
    }
    Err(Rejection::WrongKey { format: c.format })
}

fn tampered(format: Format, reason: &str) -> Rejection {
    Rejection::Tampered {
        format,
        reason: reason.into(),
    }
}

/// Whether a bundle key hint names `key` (base64 or hex of its SHA-256).
fn hint_names(hint: &str, key: &PublicKey) -> bool {
    use base64::Engine as _;
    use sha2::Digest as _;
    let hash = sha2::Sha256::digest(key.der());
    hint == base64::engine::general_purpose::STANDARD.encode(hash)
        || hint.eq_ignore_ascii_case(&hex::encode(hash))
}
