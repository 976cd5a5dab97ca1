//! Keyless signing certificates: the chain to a trusted certificate
//! authority, the validity window, and the Fulcio identity (the OIDC issuer
//! extension and the email or URI subject alternative name).

use gkm_core::policy::{PublicKey, Rejection, TrustedRoot};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::crypto::verify_x509_signature;

/// Fulcio's legacy OIDC issuer extension: the raw issuer URL.
pub const OID_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// Fulcio's OIDC issuer extension: a DER UTF8String.
pub const OID_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";

/// What a signing certificate proves once checked.
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    /// The signing key.
    pub key: PublicKey,
    /// The OIDC issuer, if the certificate names one.
    pub issuer: Option<String>,
    /// The email and URI subject alternative names.
    pub subjects: Vec<String>,
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, Rejection> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(Rejection::UntrustedChain(
            "trailing bytes after the certificate".into(),
        )),
        Err(e) => Err(Rejection::UntrustedChain(format!(
            "the signing certificate is not X.509: {e}"
        ))),
    }
}

fn key_of(cert: &X509Certificate<'_>) -> Result<PublicKey, Rejection> {
    PublicKey::from_der(cert.public_key().raw.to_vec())
        .map_err(|e| Rejection::UntrustedChain(e.to_string()))
}

fn subject_name(cert: &X509Certificate<'_>) -> String {
    cert.subject().to_string()
}

/// Check the signing certificate `leaf` against `root` at time `at` (Unix
/// seconds): it must be signed by a trusted certificate authority valid when
/// it was issued, be valid itself at `at`, and allow code signing.
pub(crate) fn check_leaf(leaf_der: &[u8], root: &TrustedRoot, at: i64) -> Result<Leaf, Rejection> {
    let leaf = parse(leaf_der)?;
    let issued = leaf.validity().not_before.timestamp();
    let mut tried = Vec::new();
    let mut chained = None;
    for ca in &root.certificate_authorities {
        let Some(issuer_der) = ca.chain.first() else {
            continue;
        };
        let Ok(issuer) = parse(issuer_der) else {
            continue;
        };
        if issuer.subject().as_raw() != leaf.issuer().as_raw() {
            tried.push(subject_name(&issuer));
            continue;
        }
        let Ok(issuer_key) = key_of(&issuer) else {
            continue;
        };
        let signed = verify_x509_signature(
            &issuer_key,
            &leaf.signature_algorithm.algorithm.to_id_string(),
            leaf.tbs_certificate.as_ref(),
            &leaf.signature_value.data,
        );
        if signed && issuer.is_ca() && ca.valid_for.contains(issued) {
            chained = Some(issuer.public_key().raw.to_vec());
            break;
        }
        tried.push(subject_name(&issuer));
    }
    let Some(issuer_spki) = chained else {
        return Err(Rejection::UntrustedChain(format!(
            "the certificate for {:?} issued by {:?} is not signed by a certificate authority of the trusted root (tried: {})",
            subject_name(&leaf),
            leaf.issuer().to_string(),
            if tried.is_empty() {
                "none".to_string()
            } else {
                tried.join(", ")
            }
        )));
    };
    let scts = leaf
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == super::sct::OID_SCT_LIST)
        .map(|e| e.value);
    super::sct::check(scts, leaf.tbs_certificate.as_ref(), &issuer_spki, root)?;
    let (not_before, not_after) = (
        leaf.validity().not_before.timestamp(),
        leaf.validity().not_after.timestamp(),
    );
    if at < not_before || at > not_after {
        return Err(Rejection::CertificateExpired(format!(
            "valid from {} to {}",
            leaf.validity().not_before,
            leaf.validity().not_after
        )));
    }
    match leaf.extended_key_usage() {
        Ok(Some(eku)) if eku.value.code_signing => {}
        _ => {
            return Err(Rejection::UntrustedChain(
                "the certificate does not allow code signing".into(),
            ));
        }
    }
    Ok(Leaf {
        key: key_of(&leaf)?,
        issuer: oidc_issuer(&leaf),
        subjects: subjects(&leaf),
    })
}

/// The OIDC issuer Fulcio recorded: the v2 extension, else the legacy one.
fn oidc_issuer(cert: &X509Certificate<'_>) -> Option<String> {
    let find = |oid: &str| {
        cert.extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == oid)
            .map(|e| e.value)
    };
    if let Some(value) = find(OID_ISSUER_V2) {
        // A DER UTF8String (tag 12) with a short or long length.
        let body = match value {
            [12, len, rest @ ..] if *len < 0x80 => Some(rest),
            [12, 0x81, _, rest @ ..] => Some(rest),
            [12, 0x82, _, _, rest @ ..] => Some(rest),
            _ => None,
        };
        if let Some(s) = body.and_then(|b| std::str::from_utf8(b).ok()) {
            return Some(s.to_string());
        }
    }
    find(OID_ISSUER_V1)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
}

fn subjects(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::RFC822Name(s) | GeneralName::URI(s) => Some(s.to_string()),
            _ => None,
        })
        .collect()
}
