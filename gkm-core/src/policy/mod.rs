//! What a signature must prove: accepted signers (keys, keyless identities) and a mode.
//!
//! A [`Policy`] lists the [`Signer`]s whose signature is accepted (any one
//! suffices): PEM public keys (ECDSA P-256/P-384, Ed25519, RSA) and keyless
//! identities (an OIDC issuer and a subject or subject pattern, proven by a
//! Fulcio-style certificate chaining to a [`TrustedRoot`]). Nothing here
//! touches the network or does cryptography: this module parses and
//! validates, and describes outcomes ([`Verified`], [`Rejection`]); the
//! verifier lives in `gkm-oci`.
//!
//! It maps one to one onto a cache's `spec.signature`: `mode` →
//! [`Mode`], `signers[].key.publicKey` → [`PublicKey::from_pem`],
//! `signers[].keyless` → [`Identity`], `trustedRoot` →
//! [`TrustedRoot::from_json`], `requireTlog` → [`Policy::require_tlog`].
//!
//! ```
//! use gkm_core::policy::{Identity, Mode, Policy, Signer, SubjectMatch, TrustedRoot};
//! let root = TrustedRoot::from_json(br#"{
//!   "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
//!   "certificateAuthorities": [{"uri": "https://fulcio.example",
//!     "certChain": {"certificates": [{"rawBytes": "MAA="}]}}]
//! }"#).unwrap();
//! let who = Identity::new(
//!     "https://token.actions.githubusercontent.com",
//!     SubjectMatch::regexp(r"https://github.com/acme/.*").unwrap(),
//! ).unwrap();
//! let policy = Policy::new(Mode::Enforce, vec![Signer::Keyless(who)], Some(root), false).unwrap();
//! assert_eq!(policy.signers().len(), 1);
//! assert!(Policy::new(Mode::Enforce, vec![], None, false).is_err());
//! ```

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest as _, Sha256};

/// Why a policy, key, identity or trusted root was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A PEM public key could not be read.
    #[error("public key: {0}")]
    PublicKey(String),
    /// A subject pattern is not a valid regular expression.
    #[error("subject pattern {pattern:?}: {reason}")]
    SubjectPattern {
        /// The pattern.
        pattern: String,
        /// What the regex engine said.
        reason: String,
    },
    /// A keyless identity names an empty issuer or subject.
    #[error("keyless signer: {0}")]
    Identity(String),
    /// The `trusted_root.json` could not be read.
    #[error("trusted root: {0}")]
    TrustedRoot(String),
    /// The policy as a whole is inconsistent.
    #[error("signature policy: {0}")]
    Policy(String),
}

/// How a policy is applied (`spec.signature.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// An image that does not verify is never delivered.
    #[default]
    Enforce,
    /// Verification runs and is reported, but does not block delivery.
    Audit,
    /// No verification.
    Off,
}

impl Mode {
    /// Whether an image with this verification outcome may be delivered.
    ///
    /// ```
    /// use gkm_core::policy::{Mode, Rejection};
    /// let refused: Result<(), Rejection> = Err(Rejection::NoSignature);
    /// assert!(!Mode::Enforce.admits(&refused));
    /// assert!(Mode::Audit.admits(&refused));
    /// ```
    pub fn admits<T>(self, outcome: &Result<T, Rejection>) -> bool {
        match self {
            Mode::Enforce => outcome.is_ok(),
            Mode::Audit | Mode::Off => true,
        }
    }

    /// Whether verification runs at all.
    pub fn verifies(self) -> bool {
        self != Mode::Off
    }
}

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
        let der = pem_block(pem, "PUBLIC KEY").map_err(PolicyError::PublicKey)?;
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

/// The DER bytes of the first PEM block labelled `label` in `text`.
pub fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, String> {
    pem_blocks(text, label)?
        .into_iter()
        .next()
        .ok_or_else(|| format!("no -----BEGIN {label}----- block"))
}

/// The DER bytes of every PEM block labelled `label` in `text`, in order.
pub fn pem_blocks(text: &str, label: &str) -> Result<Vec<Vec<u8>>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&begin) {
        let body_start = start + begin.len();
        let stop = rest[body_start..]
            .find(&end)
            .ok_or_else(|| format!("{begin} without {end}"))?;
        let body: String = rest[body_start..body_start + stop]
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        out.push(
            BASE64
                .decode(body.as_bytes())
                .map_err(|e| format!("{label} block is not base64: {e}"))?,
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

/// How a keyless certificate's subject (its email or URI SAN) must match.
#[derive(Debug, Clone)]
pub enum SubjectMatch {
    /// Equal to this string.
    Exact(String),
    /// Matched in full by this regular expression.
    Regexp(regex::Regex),
}

impl SubjectMatch {
    /// A pattern the whole subject must match (as cosign's
    /// `--certificate-identity-regexp`, anchored at both ends).
    pub fn regexp(pattern: &str) -> Result<SubjectMatch, PolicyError> {
        if pattern.is_empty() {
            return Err(PolicyError::Identity("the subject pattern is empty".into()));
        }
        regex::Regex::new(&format!("^(?:{pattern})$"))
            .map(SubjectMatch::Regexp)
            .map_err(|e| PolicyError::SubjectPattern {
                pattern: pattern.into(),
                reason: e.to_string(),
            })
    }

    /// Whether `subject` matches.
    pub fn matches(&self, subject: &str) -> bool {
        match self {
            SubjectMatch::Exact(s) => s == subject,
            SubjectMatch::Regexp(r) => r.is_match(subject),
        }
    }
}

impl PartialEq for SubjectMatch {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl fmt::Display for SubjectMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectMatch::Exact(s) => write!(f, "{s}"),
            SubjectMatch::Regexp(r) => {
                let s = r.as_str();
                let inner = s
                    .strip_prefix("^(?:")
                    .and_then(|s| s.strip_suffix(")$"))
                    .unwrap_or(s);
                write!(f, "/{inner}/")
            }
        }
    }
}

/// A keyless signer: the OIDC issuer and subject its certificate must name.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    issuer: String,
    subject: SubjectMatch,
}

impl Identity {
    /// An identity; the issuer is matched exactly.
    pub fn new(issuer: &str, subject: SubjectMatch) -> Result<Identity, PolicyError> {
        if issuer.is_empty() {
            return Err(PolicyError::Identity("the OIDC issuer is empty".into()));
        }
        if matches!(&subject, SubjectMatch::Exact(s) if s.is_empty()) {
            return Err(PolicyError::Identity("the subject is empty".into()));
        }
        Ok(Identity {
            issuer: issuer.into(),
            subject,
        })
    }

    /// The OIDC issuer.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The subject match.
    pub fn subject(&self) -> &SubjectMatch {
        &self.subject
    }
}

/// One accepted signer.
#[derive(Debug, Clone, PartialEq)]
pub enum Signer {
    /// A public key.
    Key(PublicKey),
    /// A keyless identity.
    Keyless(Identity),
}

/// A time window from a `trusted_root.json` `validFor`, in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Validity {
    /// Not before (none: always).
    pub start: Option<i64>,
    /// Not after (none: still valid).
    pub end: Option<i64>,
}

impl Validity {
    /// Whether `t` (Unix seconds) lies in the window.
    pub fn contains(&self, t: i64) -> bool {
        self.start.is_none_or(|s| t >= s) && self.end.is_none_or(|e| t <= e)
    }
}

/// A certificate authority (Fulcio) or timestamp authority: its chain,
/// leaf-most first, root last, as DER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authority {
    /// Its URI, for messages.
    pub uri: String,
    /// The certificates, DER.
    pub chain: Vec<Vec<u8>>,
    /// When it may have issued certificates.
    pub valid_for: Validity,
}

/// A transparency or CT log key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogKey {
    /// Its base URL, for messages.
    pub base_url: String,
    /// The log ID (base64 as in the file).
    pub log_id: String,
    /// The public key, DER `SubjectPublicKeyInfo`.
    pub key: Vec<u8>,
    /// When the key was in use.
    pub valid_for: Validity,
}

/// The trust material of a sigstore `trusted_root.json`: Fulcio certificate
/// authorities, Rekor and CT log keys, timestamp authorities. Read from a
/// local file only; nothing is fetched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrustedRoot {
    /// Certificate authorities issuing signing certificates.
    pub certificate_authorities: Vec<Authority>,
    /// Transparency (Rekor) log keys.
    pub tlogs: Vec<LogKey>,
    /// Certificate transparency log keys.
    pub ctlogs: Vec<LogKey>,
    /// Timestamp authorities.
    pub timestamp_authorities: Vec<Authority>,
}

mod root_json {
    //! The JSON shape of `trusted_root.json` (sigstore protobuf-specs TrustedRoot).
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Root {
        pub media_type: Option<String>,
        #[serde(default)]
        pub tlogs: Vec<Log>,
        #[serde(default)]
        pub certificate_authorities: Vec<Ca>,
        #[serde(default)]
        pub ctlogs: Vec<Log>,
        #[serde(default)]
        pub timestamp_authorities: Vec<Ca>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Log {
        #[serde(default)]
        pub base_url: String,
        pub public_key: Key,
        #[serde(default)]
        pub log_id: Option<LogId>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct LogId {
        pub key_id: String,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Key {
        pub raw_bytes: String,
        #[serde(default)]
        pub valid_for: Option<Window>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Ca {
        #[serde(default)]
        pub uri: String,
        pub cert_chain: Chain,
        #[serde(default)]
        pub valid_for: Option<Window>,
    }

    #[derive(Deserialize)]
    pub struct Chain {
        pub certificates: Vec<Cert>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct Cert {
        pub raw_bytes: String,
    }

    #[derive(Deserialize)]
    pub struct Window {
        pub start: Option<String>,
        pub end: Option<String>,
    }
}

impl TrustedRoot {
    /// Parse a `trusted_root.json` (media type
    /// `application/vnd.dev.sigstore.trustedroot+json;version=0.1`).
    pub fn from_json(bytes: &[u8]) -> Result<TrustedRoot, PolicyError> {
        let bad = |what: String| PolicyError::TrustedRoot(what);
        let root: root_json::Root = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a trusted_root.json: {e}")))?;
        if let Some(m) = &root.media_type
            && !m.starts_with("application/vnd.dev.sigstore.trustedroot")
        {
            return Err(bad(format!("unexpected mediaType {m:?}")));
        }
        let window = |w: &Option<root_json::Window>, what: &str| -> Result<Validity, PolicyError> {
            let Some(w) = w else {
                return Ok(Validity::default());
            };
            let parse = |s: &Option<String>| -> Result<Option<i64>, PolicyError> {
                s.as_deref()
                    .map(|s| {
                        parse_rfc3339(s).ok_or_else(|| bad(format!("{what}: invalid time {s:?}")))
                    })
                    .transpose()
            };
            Ok(Validity {
                start: parse(&w.start)?,
                end: parse(&w.end)?,
            })
        };
        let b64 = |s: &str, what: &str| {
            BASE64
                .decode(s)
                .map_err(|e| bad(format!("{what}: rawBytes is not base64: {e}")))
        };
        let cas = |list: &[root_json::Ca], kind: &str| -> Result<Vec<Authority>, PolicyError> {
            list.iter()
                .enumerate()
                .map(|(i, ca)| {
                    let what = format!("{kind}[{i}]");
                    if ca.cert_chain.certificates.is_empty() {
                        return Err(bad(format!("{what}: empty certChain")));
                    }
                    Ok(Authority {
                        uri: ca.uri.clone(),
                        chain: ca
                            .cert_chain
                            .certificates
                            .iter()
                            .map(|c| b64(&c.raw_bytes, &what))
                            .collect::<Result<_, _>>()?,
                        valid_for: window(&ca.valid_for, &what)?,
                    })
                })
                .collect()
        };
        let logs = |list: &[root_json::Log], kind: &str| -> Result<Vec<LogKey>, PolicyError> {
            list.iter()
                .enumerate()
                .map(|(i, l)| {
                    let what = format!("{kind}[{i}]");
                    Ok(LogKey {
                        base_url: l.base_url.clone(),
                        log_id: l
                            .log_id
                            .as_ref()
                            .map(|id| id.key_id.clone())
                            .unwrap_or_default(),
                        key: b64(&l.public_key.raw_bytes, &what)?,
                        valid_for: window(&l.public_key.valid_for, &what)?,
                    })
                })
                .collect()
        };
        Ok(TrustedRoot {
            certificate_authorities: cas(&root.certificate_authorities, "certificateAuthorities")?,
            tlogs: logs(&root.tlogs, "tlogs")?,
            ctlogs: logs(&root.ctlogs, "ctlogs")?,
            timestamp_authorities: cas(&root.timestamp_authorities, "timestampAuthorities")?,
        })
    }
}

/// Parse an RFC 3339 UTC-or-offset time (`2021-03-07T03:20:29.000Z`) into
/// Unix seconds.
///
/// ```
/// assert_eq!(gkm_core::policy::parse_rfc3339("1970-01-02T00:00:00Z"), Some(86400));
/// assert_eq!(gkm_core::policy::parse_rfc3339("2021-03-07T03:20:29.000Z"), Some(1615087229));
/// assert_eq!(gkm_core::policy::parse_rfc3339("yesterday"), None);
/// ```
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num =
        |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse::<u32>().ok().map(i64::from) };
    let (y, mo, d, h, mi, sec) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        rest = &frac[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let oh: i64 = rest.get(1..3)?.parse().ok()?;
            let om: i64 = rest.get(4..6)?.parse().ok()?;
            let o = oh * 3600 + om * 60;
            if rb[0] == b'+' { o } else { -o }
        }
    };
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days * 86400 + h * 3600 + mi * 60 + sec - offset)
}

/// What a cache image's signature must prove.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    mode: Mode,
    signers: Vec<Signer>,
    trusted_root: Option<TrustedRoot>,
    require_tlog: bool,
    unlogged_keyless: bool,
}

impl Policy {
    /// A policy. Unless `mode` is [`Mode::Off`] it must name a signer, and
    /// keyless signers need a trusted root naming a certificate authority.
    pub fn new(
        mode: Mode,
        signers: Vec<Signer>,
        trusted_root: Option<TrustedRoot>,
        require_tlog: bool,
    ) -> Result<Policy, PolicyError> {
        if mode != Mode::Off && signers.is_empty() {
            return Err(PolicyError::Policy(
                "no signers: name at least one key or keyless identity".into(),
            ));
        }
        let keyless = signers.iter().any(|s| matches!(s, Signer::Keyless(_)));
        let has_ca = trusted_root
            .as_ref()
            .is_some_and(|r| !r.certificate_authorities.is_empty());
        if keyless && !has_ca {
            return Err(PolicyError::Policy(
                "keyless signers need a trusted root naming at least one certificate authority"
                    .into(),
            ));
        }
        if require_tlog && trusted_root.as_ref().is_none_or(|r| r.tlogs.is_empty()) {
            return Err(PolicyError::Policy(
                "requireTlog needs a trusted root naming a transparency log key".into(),
            ));
        }
        Ok(Policy {
            mode,
            signers,
            trusted_root,
            require_tlog,
            unlogged_keyless: false,
        })
    }

    /// This policy accepting keyless signatures that no transparency-log
    /// entry proves were made while their short-lived certificate was valid.
    /// By default a keyless signature needs one: without it, nothing shows
    /// when the signature was made, and the certificate is checked against
    /// the current time only.
    pub fn allowing_unlogged_keyless(mut self) -> Policy {
        self.unlogged_keyless = true;
        self
    }

    /// Whether a keyless signature needs a verified transparency-log entry
    /// (the default; keys need one only under [`Policy::require_tlog`]).
    pub fn keyless_needs_tlog(&self) -> bool {
        !self.unlogged_keyless
    }

    /// A policy accepting signatures by any of `keys`.
    pub fn keys(keys: Vec<PublicKey>) -> Result<Policy, PolicyError> {
        Policy::new(
            Mode::Enforce,
            keys.into_iter().map(Signer::Key).collect(),
            None,
            false,
        )
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The accepted signers.
    pub fn signers(&self) -> &[Signer] {
        &self.signers
    }

    /// The trust material for keyless signers.
    pub fn trusted_root(&self) -> Option<&TrustedRoot> {
        self.trusted_root.as_ref()
    }

    /// Whether a transparency-log entry is required.
    pub fn require_tlog(&self) -> bool {
        self.require_tlog
    }
}

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

    #[test]
    fn a_subject_pattern_matches_the_whole_subject() {
        let m = SubjectMatch::regexp(r".*@example\.com").expect("pattern");
        assert!(m.matches("ci@example.com"));
        assert!(!m.matches("ci@example.com.evil"));
        assert_eq!(m.to_string(), r"/.*@example\.com/");
        assert!(matches!(
            SubjectMatch::regexp("("),
            Err(PolicyError::SubjectPattern { .. })
        ));
    }

    #[test]
    fn keyless_signers_need_a_certificate_authority() {
        let who = Identity::new(
            "https://issuer",
            SubjectMatch::Exact("me@example.com".into()),
        )
        .expect("identity");
        let err = Policy::new(Mode::Enforce, vec![Signer::Keyless(who)], None, false).unwrap_err();
        assert!(err.to_string().contains("certificate authority"), "{err}");
        assert!(Policy::new(Mode::Off, vec![], None, false).is_ok());
    }

    #[test]
    fn reads_a_trusted_root() {
        let json = br#"{
          "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
          "certificateAuthorities": [{"uri": "https://ca.local",
            "certChain": {"certificates": [{"rawBytes": "AQID"}]},
            "validFor": {"start": "2024-01-01T00:00:00Z"}}],
          "tlogs": [{"baseUrl": "https://rekor.local", "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": "BAUG", "keyDetails": "PKIX_ECDSA_P256_SHA_256"},
            "logId": {"keyId": "abc="}}]
        }"#;
        let root = TrustedRoot::from_json(json).expect("root");
        assert_eq!(root.certificate_authorities[0].chain, vec![vec![1, 2, 3]]);
        assert_eq!(
            root.certificate_authorities[0].valid_for.start,
            Some(1704067200)
        );
        assert_eq!(root.tlogs[0].key, vec![4, 5, 6]);
        let err = TrustedRoot::from_json(
            br#"{"certificateAuthorities":[{"certChain":{"certificates":[]}}]}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("certificateAuthorities[0]: empty certChain"),
            "{err}"
        );
    }
}
