//! Public keys as the policy names them: PEM and DER reading, the key
//! algorithms gkm verifies, and fingerprints.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest as _, Sha256};

use super::PolicyError;

/// A public key algorithm gkm verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum KeyAlgorithm {
    /// ECDSA on P-256 (signatures over SHA-256).
    EcdsaP256,
    /// ECDSA on P-384 (signatures over SHA-384).
    EcdsaP384,
    /// Ed25519.
    Ed25519,
    /// RSA (PKCS#1 v1.5 or PSS, SHA-256).
    Rsa,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyAlgorithm::EcdsaP256 => "ECDSA P-256",
            KeyAlgorithm::EcdsaP384 => "ECDSA P-384",
            KeyAlgorithm::Ed25519 => "Ed25519",
            KeyAlgorithm::Rsa => "RSA",
        })
    }
}

const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
const OID_ED25519: &[u8] = &[0x2b, 0x65, 0x70];
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// A public key signer: a DER `SubjectPublicKeyInfo` of a supported algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    der: Vec<u8>,
    algorithm: KeyAlgorithm,
}

impl PublicKey {
    /// Read a `-----BEGIN PUBLIC KEY-----` PEM block (the first one in `pem`).
    ///
    /// ```
    /// use gkm_core::policy::{KeyAlgorithm, PublicKey};
    /// let pem = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
    /// let key = PublicKey::from_pem(pem).unwrap();
    /// assert_eq!(key.algorithm(), KeyAlgorithm::Ed25519);
    /// assert!(key.fingerprint().starts_with("sha256:"));
    /// assert!(PublicKey::from_pem("not a key").is_err());
    /// ```
    pub fn from_pem(pem: &str) -> Result<PublicKey, PolicyError> {
        let der =
            pem_block(pem, "PUBLIC KEY").map_err(|e| PolicyError::PublicKey(e.to_string()))?;
        PublicKey::from_der(der)
    }

    /// Read a DER `SubjectPublicKeyInfo`.
    pub fn from_der(der: Vec<u8>) -> Result<PublicKey, PolicyError> {
        let algorithm = spki_algorithm(&der).map_err(PolicyError::PublicKey)?;
        Ok(PublicKey { der, algorithm })
    }

    /// The DER `SubjectPublicKeyInfo`.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// `sha256:<hex>` of the DER `SubjectPublicKeyInfo`, the key's name in
    /// results and logs.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.der)
    }

    /// The key as a PEM block.
    pub fn to_pem(&self) -> String {
        to_pem("PUBLIC KEY", &self.der)
    }
}

/// `sha256:<hex>` of some DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    let hash = Sha256::digest(der);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Encode DER bytes as a PEM block with `label`.
pub fn to_pem(label: &str, der: &[u8]) -> String {
    let b64 = BASE64.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Why PEM text did not yield the blocks asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    /// No block with the label.
    #[error("no -----BEGIN {label}----- block")]
    NoBlock {
        /// The label looked for.
        label: String,
    },
    /// A block begins but never ends.
    #[error("-----BEGIN {label}----- without -----END {label}-----")]
    Unterminated {
        /// The block's label.
        label: String,
    },
    /// A block's body is not base64.
    #[error("{label} block is not base64: {reason}")]
    NotBase64 {
        /// The block's label.
        label: String,
        /// What the decoder said.
        reason: String,
    },
}

/// The DER bytes of the first PEM block labelled `label` in `text`.
pub fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, PemError> {
    pem_blocks(text, label)?
        .into_iter()
        .next()
        .ok_or_else(|| PemError::NoBlock {
            label: label.to_string(),
        })
}

/// The DER bytes of every PEM block labelled `label` in `text`, in order.
pub fn pem_blocks(text: &str, label: &str) -> Result<Vec<Vec<u8>>, PemError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let body_start = start + begin.len();
        let stop = rest[body_start..]
            .find(&end)
            .ok_or_else(|| PemError::Unterminated {
                label: label.to_string(),
            })?;
        let body: String = rest[body_start..body_start + stop]
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        out.push(
            BASE64
                .decode(body.as_bytes())
                .map_err(|e| PemError::NotBase64 {
                    label: label.to_string(),
                    reason: e.to_string(),
                })?,
        );
        rest = &rest[body_start + stop + end.len()..];
    }
    Ok(out)
}

/// Read one DER TLV at the start of `input`: (tag, contents, rest).
fn der_tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let truncated = || "truncated DER".to_string();
    let (&tag, rest) = input.split_first().ok_or_else(truncated)?;
    let (&first, rest) = rest.split_first().ok_or_else(truncated)?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return Err("unsupported DER length".into());
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(truncated());
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// The algorithm of a DER `SubjectPublicKeyInfo`.
fn spki_algorithm(der: &[u8]) -> Result<KeyAlgorithm, String> {
    let (tag, spki, trailing) = der_tlv(der)?;
    if tag != 0x30 || !trailing.is_empty() {
        return Err("not a DER SubjectPublicKeyInfo".into());
    }
    let (tag, alg, rest) = der_tlv(spki)?;
    if tag != 0x30 {
        return Err("not a DER SubjectPublicKeyInfo".into());
    }
    let (bit_tag, _, _) = der_tlv(rest)?;
    if bit_tag != 0x03 {
        return Err("SubjectPublicKeyInfo has no key bits".into());
    }
    let (tag, oid, params) = der_tlv(alg)?;
    if tag != 0x06 {
        return Err("SubjectPublicKeyInfo has no algorithm".into());
    }
    match oid {
        o if o == OID_ED25519 => Ok(KeyAlgorithm::Ed25519),
        o if o == OID_RSA => Ok(KeyAlgorithm::Rsa),
        o if o == OID_EC_PUBLIC_KEY => {
            let (tag, curve, _) = der_tlv(params)?;
            match (tag, curve) {
                (0x06, c) if c == OID_P256 => Ok(KeyAlgorithm::EcdsaP256),
                (0x06, c) if c == OID_P384 => Ok(KeyAlgorithm::EcdsaP384),
                _ => Err("unsupported elliptic curve (expected P-256 or P-384)".into()),
            }
        }
        _ => Err("unsupported key algorithm (expected ECDSA P-256/P-384, Ed25519 or RSA)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P256: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE0KsDuLJqCkaSf03DxVx0Wl+tcNns
HwpN10ha6x7hHi9hnl3IBYVHkjmZvVzR1LdS6QDZ2BhQcxX1Ws07P4MNfA==
-----END PUBLIC KEY-----
";

    #[test]
    fn reads_a_p256_key_and_names_it_by_fingerprint() {
        let key = PublicKey::from_pem(P256).expect("P-256 key");
        assert_eq!(key.algorithm(), KeyAlgorithm::EcdsaP256);
        assert_eq!(PublicKey::from_pem(&key.to_pem()).expect("round trip"), key);
        assert_eq!(key.fingerprint(), fingerprint(key.der()));
    }

    #[test]
    fn refuses_what_is_not_a_supported_public_key() {
        let err = PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
            .unwrap_err();
        assert!(err.to_string().contains("DER"), "{err}");
        let err =
            PublicKey::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("no -----BEGIN PUBLIC KEY----- block"),
            "{err}"
        );
    }
}
