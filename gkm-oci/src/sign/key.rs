//! Private keys for signing: PKCS#8 PEM, or cosign's encrypted keys
//! (`cosign generate-key-pair`: scrypt + NaCl secretbox around PKCS#8).

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gkm_core::policy::{PublicKey, pem_block, to_pem};

use crate::error::{Error, Result};

enum Inner {
    Ecdsa(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rsa(RsaKeyPair),
}

/// A private key gkm signs with, and its public key.
pub struct SigningKey {
    inner: Inner,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SigningKey({} {})",
            self.public.algorithm(),
            self.public.fingerprint()
        )
    }
}

fn bad(reason: impl std::fmt::Display) -> Error {
    Error::format("signing key", reason)
}

/// The DER SubjectPublicKeyInfo of an encoded public key.
fn spki<E>(
    encoded: std::result::Result<aws_lc_rs::encoding::PublicKeyX509Der<'_>, E>,
) -> Result<Vec<u8>> {
    encoded
        .map(|der| der.as_ref().to_vec())
        .map_err(|_| bad("cannot encode the public key"))
}

impl SigningKey {
    /// Read a private key: `-----BEGIN PRIVATE KEY-----` (PKCS#8: ECDSA
    /// P-256/P-384, Ed25519, RSA), or cosign's `ENCRYPTED SIGSTORE PRIVATE
    /// KEY` / `ENCRYPTED COSIGN PRIVATE KEY`, decrypted with `password`.
    pub fn from_pem(text: &str, password: &[u8]) -> Result<SigningKey> {
        for label in [
            "ENCRYPTED SIGSTORE PRIVATE KEY",
            "ENCRYPTED COSIGN PRIVATE KEY",
        ] {
            if text.contains(&format!("-----BEGIN {label}-----")) {
                let sealed = pem_block(text, label).map_err(bad)?;
                return SigningKey::from_pkcs8(&decrypt(&sealed, password)?);
            }
        }
        let der = pem_block(text, "PRIVATE KEY").map_err(bad)?;
        SigningKey::from_pkcs8(&der)
    }

    /// Read a PKCS#8 DER private key.
    pub fn from_pkcs8(der: &[u8]) -> Result<SigningKey> {
        let (inner, spki) = if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, der)
        {
            let spki = spki(k.public_key().as_der())?;
            (Inner::Ecdsa(k), spki)
        } else if let Ok(k) =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P384_SHA384_ASN1_SIGNING, der)
        {
            let spki = spki(k.public_key().as_der())?;
            (Inner::Ecdsa(k), spki)
        } else if let Ok(k) = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der) {
            let spki = spki(k.public_key().as_der())?;
            (Inner::Ed25519(k), spki)
        } else if let Ok(k) = RsaKeyPair::from_pkcs8(der) {
            let spki = spki(k.public_key().as_der())?;
            (Inner::Rsa(k), spki)
        } else {
            return Err(bad(
                "not a PKCS#8 ECDSA P-256/P-384, Ed25519 or RSA private key",
            ));
        };
        let public = PublicKey::from_der(spki).map_err(bad)?;
        Ok(SigningKey { inner, public })
    }

    /// A new ECDSA P-256 key (cosign's default), with its PKCS#8 PEM.
    pub fn generate_p256() -> Result<(SigningKey, String)> {
        let doc = EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &SystemRandom::new(),
        )
        .map_err(|_| bad("key generation failed"))?;
        let key = SigningKey::from_pkcs8(doc.as_ref())?;
        Ok((key, to_pem("PRIVATE KEY", doc.as_ref())))
    }

    /// The public key.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// Sign `msg` (ECDSA ASN.1 over SHA-256/384, Ed25519, RSA PKCS#1 v1.5 SHA-256).
    pub fn sign(&self, msg: &[u8]) -> Result<Vec<u8>> {
        let rng = SystemRandom::new();
        match &self.inner {
            Inner::Ecdsa(k) => k
                .sign(&rng, msg)
                .map(|s| s.as_ref().to_vec())
                .map_err(|_| bad("signing failed")),
            Inner::Ed25519(k) => Ok(k.sign(msg).as_ref().to_vec()),
            Inner::Rsa(k) => {
                let mut sig = vec![0; k.public_modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &rng, msg, &mut sig)
                    .map_err(|_| bad("signing failed"))?;
                Ok(sig)
            }
        }
    }
}

/// cosign's encrypted key: JSON naming the scrypt parameters, the salt, the
/// secretbox nonce and the ciphertext.
#[derive(serde::Deserialize)]
struct Sealed {
    kdf: Kdf,
    cipher: Cipher,
    ciphertext: String,
}

#[derive(serde::Deserialize)]
struct Kdf {
    name: String,
    params: ScryptParams,
    salt: String,
}

#[derive(serde::Deserialize)]
#[allow(non_snake_case)]
struct ScryptParams {
    N: u64,
    r: u32,
    p: u32,
}

#[derive(serde::Deserialize)]
struct Cipher {
    name: String,
    nonce: String,
}

/// The largest scrypt cost parameters an encrypted key may ask for (at most
/// 256 MiB of memory, 128·N·r); cosign writes N = 2^15, r = 8, p = 1.
const MAX_SCRYPT_N: u64 = 1 << 17;
const MAX_SCRYPT_R: u32 = 16;
const MAX_SCRYPT_P: u32 = 4;

fn decrypt(sealed: &[u8], password: &[u8]) -> Result<Vec<u8>> {
    use crypto_secretbox::aead::{Aead, KeyInit};
    let sealed: Sealed = serde_json::from_slice(sealed)
        .map_err(|e| bad(format!("encrypted key is not JSON: {e}")))?;
    if sealed.kdf.name != "scrypt" || sealed.cipher.name != "nacl/secretbox" {
        return Err(bad(format!(
            "unsupported key encryption {} / {}",
            sealed.kdf.name, sealed.cipher.name
        )));
    }
    let (n, r, p) = (
        sealed.kdf.params.N,
        sealed.kdf.params.r,
        sealed.kdf.params.p,
    );
    if !n.is_power_of_two() || n < 2 {
        return Err(bad("scrypt N is not a power of two"));
    }
    // scrypt needs 128·N·r bytes and N·r·p work: bound them, so a key file
    // cannot make gkm allocate or compute without end. cosign writes
    // N = 32768, r = 8, p = 1.
    if n > MAX_SCRYPT_N || r == 0 || r > MAX_SCRYPT_R || p == 0 || p > MAX_SCRYPT_P {
        return Err(bad(format!(
            "scrypt parameters N={n} r={r} p={p} are outside what gkm accepts \
             (N up to {MAX_SCRYPT_N}, r up to {MAX_SCRYPT_R}, p up to {MAX_SCRYPT_P})"
        )));
    }
    let params = scrypt::Params::new(n.trailing_zeros() as u8, r, p, 32)
        .map_err(|e| bad(format!("scrypt parameters: {e}")))?;
    let decode = |s: &str, what: &str| {
        BASE64
            .decode(s)
            .map_err(|e| bad(format!("{what} is not base64: {e}")))
    };
    let salt = decode(&sealed.kdf.salt, "salt")?;
    let nonce = decode(&sealed.cipher.nonce, "nonce")?;
    let ciphertext = decode(&sealed.ciphertext, "ciphertext")?;
    if nonce.len() != 24 {
        return Err(bad("the secretbox nonce is not 24 bytes"));
    }
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &salt, &params, &mut key).map_err(|e| bad(format!("scrypt: {e}")))?;
    let cipher = crypto_secretbox::XSalsa20Poly1305::new(&key.into());
    cipher
        .decrypt(
            crypto_secretbox::Nonce::from_slice(&nonce),
            ciphertext.as_ref(),
        )
        .map_err(|_| bad("cannot decrypt the private key: wrong password"))
}
