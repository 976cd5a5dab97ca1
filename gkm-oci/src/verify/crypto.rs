//! Signature checks on aws-lc-rs, the workspace's one crypto provider.

use aws_lc_rs::signature::{self, ParsedPublicKey, VerificationAlgorithm};
use gkm_core::policy::{KeyAlgorithm, PublicKey};

/// Whether `sig` is a signature of `msg` by `key` (ECDSA over SHA-256 for
/// P-256, SHA-384 or SHA-256 for P-384; Ed25519; RSA PKCS#1 v1.5 or PSS over
/// SHA-256).
pub(crate) fn verify_with_key(key: &PublicKey, msg: &[u8], sig: &[u8]) -> bool {
    let algorithms: &[&'static dyn VerificationAlgorithm] = match key.algorithm() {
        KeyAlgorithm::EcdsaP256 => &[&signature::ECDSA_P256_SHA256_ASN1],
        // cosign hashes with SHA-256 for any key unless told otherwise.
        KeyAlgorithm::EcdsaP384 => &[
            &signature::ECDSA_P384_SHA384_ASN1,
            &signature::ECDSA_P384_SHA256_ASN1,
        ],
        KeyAlgorithm::Ed25519 => &[&signature::ED25519],
        KeyAlgorithm::Rsa => &[
            &signature::RSA_PKCS1_2048_8192_SHA256,
            &signature::RSA_PSS_2048_8192_SHA256,
        ],
    };
    verify_any(algorithms, key.der(), msg, sig)
}

fn verify_any(
    algorithms: &[&'static dyn VerificationAlgorithm],
    spki: &[u8],
    msg: &[u8],
    sig: &[u8],
) -> bool {
    algorithms.iter().any(|alg| {
        ParsedPublicKey::new(*alg, spki)
            .map(|k| k.verify_sig(msg, sig).is_ok())
            .unwrap_or(false)
    })
}

/// Whether `sig` (made with the X.509 signature algorithm `sig_oid`, dotted)
/// is `issuer`'s signature of `msg`: how certificates are checked.
pub(crate) fn verify_x509_signature(
    issuer: &PublicKey,
    sig_oid: &str,
    msg: &[u8],
    sig: &[u8],
) -> bool {
    use KeyAlgorithm::*;
    let alg: &'static dyn VerificationAlgorithm = match (sig_oid, issuer.algorithm()) {
        ("1.2.840.10045.4.3.2", EcdsaP256) => &signature::ECDSA_P256_SHA256_ASN1,
        ("1.2.840.10045.4.3.2", EcdsaP384) => &signature::ECDSA_P384_SHA256_ASN1,
        ("1.2.840.10045.4.3.3", EcdsaP256) => &signature::ECDSA_P256_SHA384_ASN1,
        ("1.2.840.10045.4.3.3", EcdsaP384) => &signature::ECDSA_P384_SHA384_ASN1,
        ("1.2.840.10045.4.3.4", EcdsaP256) => &signature::ECDSA_P256_SHA512_ASN1,
        ("1.2.840.10045.4.3.4", EcdsaP384) => &signature::ECDSA_P384_SHA512_ASN1,
        ("1.2.840.113549.1.1.11", Rsa) => &signature::RSA_PKCS1_2048_8192_SHA256,
        ("1.2.840.113549.1.1.12", Rsa) => &signature::RSA_PKCS1_2048_8192_SHA384,
        ("1.2.840.113549.1.1.13", Rsa) => &signature::RSA_PKCS1_2048_8192_SHA512,
        ("1.3.101.112", Ed25519) => &signature::ED25519,
        _ => return false,
    };
    verify_any(&[alg], issuer.der(), msg, sig)
}

/// Whether `sig` has the shape of a signature of any supported algorithm:
/// a complete DER `SEQUENCE` (ECDSA), 64 bytes (Ed25519) or an RSA modulus
/// length. A cut-off signature fails this before any key is tried.
pub(crate) fn well_formed_signature(sig: &[u8]) -> bool {
    if sig.len() == 64 || matches!(sig.len(), 256 | 384 | 512) {
        return true;
    }
    match sig {
        [0x30, len, rest @ ..] if *len < 0x80 => rest.len() == *len as usize,
        [0x30, 0x81, len, rest @ ..] => rest.len() == *len as usize,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::SigningKey;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A signature verifies over its message only, whole only.
        #[test]
        fn signatures_verify_whole_and_unaltered(msg in proptest::collection::vec(any::<u8>(), 0..512), cut in 1usize..60, flip in any::<prop::sample::Index>()) {
            let (key, _) = SigningKey::generate_p256().expect("key");
            let sig = key.sign(&msg).expect("sign");
            prop_assert!(well_formed_signature(&sig));
            prop_assert!(verify_with_key(key.public_key(), &msg, &sig));
            let cut = cut.min(sig.len());
            prop_assert!(!well_formed_signature(&sig[..sig.len() - cut]) || sig.len() - cut == 64);
            let mut altered = sig.clone();
            altered[flip.index(sig.len())] ^= 0x01;
            prop_assert!(!verify_with_key(key.public_key(), &msg, &altered));
            let mut other = msg.clone();
            other.push(0);
            prop_assert!(!verify_with_key(key.public_key(), &other, &sig));
        }
    }
}
