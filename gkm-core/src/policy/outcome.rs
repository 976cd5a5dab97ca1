//! What verification concluded: how an image was signed ([`Verified`]) or
//! why it was refused ([`Rejection`]).

use std::fmt;

use super::keys::KeyAlgorithm;

/// How a signature was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Format {
    /// cosign v2: a `sha256-<hex>.sig` tag with a simple-signing payload.
    CosignV2,
    /// A sigstore bundle attached as an OCI 1.1 referrer (cosign v3).
    SigstoreBundle,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::CosignV2 => "cosign v2 signature",
            Format::SigstoreBundle => "sigstore bundle",
        })
    }
}

/// Who a verified signature proves signed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum SignedBy {
    /// A public key of the policy.
    Key {
        /// Its fingerprint ([`PublicKey::fingerprint`]).
        fingerprint: String,
        /// Its algorithm.
        algorithm: KeyAlgorithm,
    },
    /// A keyless identity, from a certificate chaining to the trusted root.
    Keyless {
        /// The OIDC issuer the certificate names.
        issuer: String,
        /// The subject (email or URI) the certificate names.
        subject: String,
    },
}

impl fmt::Display for SignedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignedBy::Key {
                fingerprint,
                algorithm,
            } => write!(f, "{algorithm} key {fingerprint}"),
            SignedBy::Keyless { issuer, subject } => write!(f, "{subject} (issuer {issuer})"),
        }
    }
}

/// What a successful verification proved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verified {
    /// How the signature was stored.
    pub format: Format,
    /// Who signed.
    pub signed_by: SignedBy,
    /// The image digest the signature covers (equal to the one verified).
    pub digest: String,
    /// Whether a transparency-log entry was verified too.
    pub tlog: bool,
}

impl fmt::Display for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} signed by {} over {}",
            self.format, self.signed_by, self.digest
        )?;
        if self.tlog {
            f.write_str(" (transparency log entry verified)")?;
        }
        Ok(())
    }
}

/// Why an image's signatures were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "reason", content = "detail")]
#[non_exhaustive]
pub enum Rejection {
    /// The image has no signature in either format.
    #[error(
        "no signature: the image has neither a cosign signature tag nor a sigstore bundle referrer"
    )]
    NoSignature,
    /// A signature does not verify with any of the policy's keys.
    #[error("wrong key: the {format} does not verify with any accepted key")]
    WrongKey {
        /// Where it was found.
        format: Format,
    },
    /// A certificate's subject is not one the policy accepts.
    #[error("identity mismatch: the certificate names {found:?}, the policy accepts {expected}")]
    IdentityMismatch {
        /// The accepted subjects.
        expected: String,
        /// The subject in the certificate.
        found: String,
    },
    /// A certificate's OIDC issuer is not one the policy accepts.
    #[error(
        "issuer mismatch: the certificate names issuer {found:?}, the policy accepts {expected}"
    )]
    IssuerMismatch {
        /// The accepted issuers.
        expected: String,
        /// The issuer in the certificate (empty when it names none).
        found: String,
    },
    /// The signed payload names another image digest.
    #[error("payload digest mismatch: the {format} covers {signed}, not the image {expected}")]
    DigestMismatch {
        /// Where it was found.
        format: Format,
        /// The image digest.
        expected: String,
        /// The digest the payload names.
        signed: String,
    },
    /// The signature names (by key hint or certificate) a signer, but does
    /// not match the content it claims to sign: the bundle or payload was
    /// altered.
    #[error("tampered {format}: {reason}")]
    Tampered {
        /// Where it was found.
        format: Format,
        /// What did not match.
        reason: String,
    },
    /// A signing certificate does not chain to the trusted root.
    #[error("untrusted certificate chain: {0}")]
    UntrustedChain(String),
    /// The signing certificate had expired, or was not yet valid, and no
    /// trusted timestamp shows the signature was made while it was valid.
    #[error(
        "certificate not valid now ({0}) and no trusted timestamp proves it was valid when signing"
    )]
    CertificateExpired(String),
    /// The policy requires a transparency-log entry and none verified.
    #[error("no verified transparency log entry, and the policy requires one")]
    TlogMissing,
    /// A signature or bundle could not be read.
    #[error("malformed {format}: {reason}")]
    Malformed {
        /// Where it was found.
        format: Format,
        /// What was wrong.
        reason: String,
    },
    /// Several signatures were found and each was refused.
    #[error("{} signatures, none accepted: {}", .0.len(), join(.0))]
    NoneAccepted(Vec<Rejection>),
}

fn join(list: &[Rejection]) -> String {
    list.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl Rejection {
    /// The refusals this stands for: itself, or each of [`Rejection::NoneAccepted`].
    pub fn reasons(&self) -> Vec<&Rejection> {
        match self {
            Rejection::NoneAccepted(list) => list.iter().flat_map(|r| r.reasons()).collect(),
            other => vec![other],
        }
    }

    /// Combine the refusals of every signature found into one.
    pub fn combine(mut list: Vec<Rejection>) -> Rejection {
        match list.len() {
            0 => Rejection::NoSignature,
            1 => list.remove(0),
            _ => Rejection::NoneAccepted(list),
        }
    }
}
